"""Layer 1, messages and where they go: logical destinations and their members
(``destinations``, ``topology``), the message and mdb's headers (``message``), what a
message is known by (``identity``), bodies and headers encoded and decoded (``codec``),
the copies mdb re-sends (``copies``) and selectors (``selector``, ``selector_check``,
``jms_names``)."""
