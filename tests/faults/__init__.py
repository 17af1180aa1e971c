"""Fault tests: brokers and container processes killed (SIGKILL) and hung (SIGSTOP) under load,
checked with a ledger (``ledger.py``; docs/failover.md, "Fault runs")."""
