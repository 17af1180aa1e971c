"""The databases of exactly-once listeners and producers' outboxes, by concern:

* ``database``: ``Database``, one configured database: its sessions, its outages (``down``,
  ``reachable``) and the translation of driver errors at this edge (``translated``);
* ``driver_errors``: what a driver's error says, dialect by dialect (out of reach, or a refusal
  of one statement);
* ``engine``: the SQLAlchemy async engine made from a database's settings, and ``database_url``,
  the URL mdb connects with;
* ``handler_sessions``: the sessions mdb opens, whose transaction a handler may not end;
* ``startup``: the first statements of a container or ``mdb db upgrade``, whose failure is a
  configuration error.
"""
