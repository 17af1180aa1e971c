"""Layer 2, one path to a broker, and the plan: connections with reconnect and failover
(``links``), a process's brokers and their status (``brokers``), sending to a logical
destination (``producer``), and listener + topology -> subscriptions (``planning``)."""
