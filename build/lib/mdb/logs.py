"""The process's log: its format and level (``MDB_LOG_LEVEL``), and the broker libraries' own
loggers kept quiet and free of secrets.

A broker library logs what mdb already says in one line per broker per outage (``mdb.events``):
stomp.py alone logs a "could not connect" warning per reconnect attempt per connection and an
"established connection" line per ``mdb send``. An adapter therefore hands its library's
loggers to ``quiet_library``: their records are shown only when mdb logs at DEBUG, and then
with every URL password and STOMP passcode masked (``mdb.redaction.mask_secrets``).
"""

from __future__ import annotations

import logging
import os

from mdb import tracing
from mdb.redaction import mask_secrets

FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s%(trace)s"


def configure() -> None:
    """Log to stderr at ``MDB_LOG_LEVEL`` (default INFO), with trace ids on each line."""
    logging.basicConfig(level=os.environ.get("MDB_LOG_LEVEL", "INFO").upper(), format=FORMAT)
    for handler in logging.getLogger().handlers:
        handler.addFilter(tracing.TraceIds())


class LibraryRecords(logging.Filter):
    """Lets a library's record through only while the ``mdb`` logger is enabled for DEBUG, with
    its secrets masked."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not logging.getLogger("mdb").isEnabledFor(logging.DEBUG):
            return False
        record.msg = mask_secrets(record.getMessage())
        record.args = None
        return True


def quiet_library(name: str, *rewrites: logging.Filter) -> None:
    """Quiet logger ``name`` (a broker library's) as the module docstring says; idempotent.
    ``rewrites`` are the adapter's own filters for what only it can read in the library's records
    (e.g. where a frame's body is): they see each record as logged, before it is masked."""
    logger = logging.getLogger(name)
    if not any(isinstance(f, LibraryRecords) for f in logger.filters):
        for rewrite in rewrites:
            logger.addFilter(rewrite)
        logger.addFilter(LibraryRecords())
