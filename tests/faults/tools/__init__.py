"""Fault runs from the command line (``python -m tests.faults.tools.<name>``): soaks and
measurements that take minutes, kill and pause private brokers, and print a table. The fault
tests run short, seeded rounds of some of them (docs/testing.md, "mdb's own suite")."""
