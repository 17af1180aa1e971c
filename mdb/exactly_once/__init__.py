"""Exactly-once effects: a listener's database work, its sends and the message it consumed
commit together, without two-phase commit (docs/exactly-once.md).

* ``database/``: the ``[databases.NAME]`` settings and one SQLAlchemy async engine per
  database, whose driver errors become mdb's (``DatabaseUnavailable``) at this edge, and
  ``database_url``, the URL with the credentials mdb connects with, for the application's own
  engines;
* ``sqlite``: SQLite's connections as mdb makes them (aiosqlite's, closed without waiting for
  ever);
* ``tables``: mdb's two tables, made by ``mdb db upgrade`` and checked at startup;
* ``inbox``: the ids of the messages a listener processed, claimed in the handler's own
  database transaction, so that a redelivered copy is settled without running it again;
* ``outbox/``: the messages a handler sent, written in that same transaction and dispatched
  once it committed, by this process or, after a crash, by another one holding the lease; and
  ``Outbox``, the same for a producer outside a handler, in the caller's own transaction
  (store-and-forward while a destination's brokers are down).
"""

from mdb.exactly_once.database.engine import database_url
from mdb.exactly_once.outbox.producer_outbox import Outbox

__all__ = ["Outbox", "database_url"]
