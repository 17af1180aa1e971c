"""The applications tests run: containers in the test's own process (``in_process``), a
listener that fails on purpose for the failed-message tests (``failing_orders``),
and listener modules run as container processes (``queue_ledger_app``,
``topic_ledger_app``, ``exactly_once_app``)."""
