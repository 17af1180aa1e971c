"""``Guard``: one exactly-once listener's run of a delivery, on the database side.

In the handler's database transaction: claim the message in the inbox (a copy already
processed is not run again), run the handler with the session and with its sends written to
the outbox; commit; dispatch those rows; only then may the delivery be acked. Every crash
point leaves something the next attempt completes:

* before the commit: nothing of the run is kept; the broker redelivers the message, and it
  runs again;
* after the commit, before its rows were dispatched: the redelivered copy finds its inbox
  row, and its rows are dispatched (``Dispatcher.dispatch_pending``) before it is acked; a
  row whose process died is also taken by another process's sweep once its lease ran out;
* after the dispatch, before the ack: the copy finds its row and nothing pending; it is acked.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession

from mdb.context import SendFunction
from mdb.destinations import Destination
from mdb.errors import BrokerError, DispatchPending
from mdb.exactly_once import inbox
from mdb.exactly_once.outbox import Writer

if TYPE_CHECKING:
    from mdb.exactly_once.store import Store

Run = Callable[[AsyncSession, SendFunction], Awaitable[None]]
"""The handler's run: called with the transaction's session and the outbox's send."""


class Guard:
    """The database side of ``listener``'s deliveries from ``subscription`` (its name, or the
    queue's), in ``store``; a reply goes to the delivery's broker ``broker``, a send its
    broker refuses to ``error_destination``."""

    def __init__(self, store: Store, *, listener: str, subscription: str, broker: str,
                 error_destination: Destination) -> None:
        self.database = store.database
        self._dispatcher = store.dispatcher
        self._listener = listener
        self._subscription = subscription
        self._owner = store.owner
        self._broker = broker
        self._error_destination = error_destination

    async def run(self, identity: str, handler: Run) -> bool:
        """Run ``handler`` for the message known as ``identity`` unless it was processed
        already; False when it was (its pending sends are dispatched now).

        What the handler raises is raised, its transaction rolled back. Raises
        ``DatabaseUnavailable`` when the database is out of reach (the run may be made again:
        its claim finds out whether it committed), and ``DispatchPending`` when a send could
        not be dispatched: the delivery must then stay unsettled (its effects are committed;
        its redelivery completes the dispatch)."""
        database = self.database
        source = f"{self._listener}/{self._subscription}/{identity}"
        failure: Exception | None = None
        try:
            async with database.session() as session:
                with database.deadline():
                    fresh = await inbox.claim(session, self._listener, self._subscription,
                                              identity, time.time())
                if fresh:
                    writer = Writer(session, self._owner, database.settings.outbox_lease,
                                    error_destination=self._error_destination, source=source,
                                    reply_broker=self._broker)
                    await _handled(handler(session, writer.send))
        except _Raised as raised:
            failure = raised.exception
        if failure is not None:
            raise failure  # outside the except block: its own cause and context, unchanged
        try:
            if not fresh:
                await self._dispatcher.dispatch_pending(source)
                return False
            await self._dispatcher.dispatch(writer.rows)
        except BrokerError as exc:
            raise DispatchPending(f"sends of message {identity} wait in the outbox of "
                                  f"database {database.name}: {exc}") from exc
        return True


class _Raised(Exception):
    """What the handler raised, carried past the session's translation of driver errors: a
    handler's own ``TimeoutError`` or ``ConnectionError`` (an ``OSError``, as a dropped
    database connection is) is its failure, not the database's."""

    def __init__(self, exception: Exception) -> None:
        super().__init__(exception)
        self.exception = exception


async def _handled(run: Awaitable[None]) -> None:
    """Await the handler's ``run``: what its own statements raise stays SQLAlchemy's (the
    session's edge translates it), anything else is carried as ``_Raised``."""
    try:
        await run
    except SQLAlchemyError:
        raise
    except Exception as exc:  # user code
        raise _Raised(exc) from exc
