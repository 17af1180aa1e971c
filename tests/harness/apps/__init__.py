"""The applications tests run: containers in the test's own process (``in_process``),
and listener modules run as container processes (``queue_ledger_app``,
``topic_ledger_app``, ``exactly_once_app``)."""
