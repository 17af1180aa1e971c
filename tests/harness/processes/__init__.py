"""mdb as processes a test starts, reads and kills: ``mdb run`` of a module
(``mdb_run``, ``container_process``), a fleet of them (``fleet``), the exactly-once
stages (``exactly_once_stages``), the ``mdb`` command under hostile input (``cli``),
and health endpoints (``health``)."""
