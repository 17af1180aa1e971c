"""mdb over HTTP: the health endpoint a container (or a supervisor) serves for probes,
``mdb status`` and Prometheus, and the one client that reads it.

* ``server``: ``ProbeServer``, an HTTP server no client can exhaust;
* ``routes``: ``HealthServer``, the routes (``/health/live``, ``/health/ready``, ``/status``,
  ``/metrics``) over a health snapshot (``mdb.observability.health``);
* ``metrics_page``: the ``/metrics`` page (the ``prometheus`` extra);
* ``client``: ``fetch_status`` for ``mdb status``, ``fetch_pages`` for the supervisor.
"""
