"""Fault tests: brokers and container processes killed (SIGKILL) and hung (SIGSTOP) under load,
checked with a ledger (``tests/harness/traffic/ledger.py``; docs/failover.md, "Fault runs"). The
command-line fault runs, longer and printing a table, are in ``tools``."""
