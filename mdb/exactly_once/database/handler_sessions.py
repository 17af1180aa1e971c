"""The sessions mdb opens for exactly-once listeners: their transaction is mdb's to end, and a
handler that calls ``commit``, ``rollback`` or ``close`` on one is refused (``handing``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from sqlalchemy.orm import Session

from mdb.errors import SessionMisuse

_HANDLER: ContextVar[str | None] = ContextVar("mdb_handler", default=None)


@contextmanager
def handing(listener: str) -> Iterator[None]:
    """While ``listener``'s handler runs with a session of mdb's, in this task and those it
    starts: its ``commit``, ``rollback`` and ``close`` are refused (``SessionMisuse``)."""
    token = _HANDLER.set(listener)
    try:
        yield
    finally:
        _HANDLER.reset(token)


class OwnedSession(Session):
    """The sessions mdb opens. Its transaction is mdb's to end: the inbox row and the outbox
    rows commit with the handler's writes or not at all. A handler that ended it itself would
    have its writes committed without them (run again on a redelivery), or the inbox row
    rolled back under writes made after it. SQLAlchemy's ``AsyncSession`` ends a transaction
    through these methods (run on its greenlet, in the task's context)."""

    def commit(self) -> None:
        _refused("commit")
        super().commit()

    def rollback(self) -> None:
        _refused("rollback")
        super().rollback()

    def close(self) -> None:
        _refused("close")
        super().close()


def _refused(what: str) -> None:
    listener = _HANDLER.get()
    if listener is not None:
        raise SessionMisuse(
            f"listener {listener}: the handler called {what}() on its session, whose "
            "transaction is mdb's: returning commits it (with the message's inbox row and "
            "its sends), raising rolls it back (docs/exactly-once.md)")
