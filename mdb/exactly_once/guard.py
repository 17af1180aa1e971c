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

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession

from mdb.context import SendFunction
from mdb.destinations import Destination
from mdb.errors import BrokerError, DispatchPending, IdentityReused
from mdb.exactly_once import inbox
from mdb.exactly_once.database import Database, handing
from mdb.exactly_once.outbox import Dispatcher, Writer
from mdb.message import Message

Run = Callable[[AsyncSession, SendFunction], Awaitable[None]]
"""The handler's run: called with the transaction's session and the outbox's send."""


class Guard:
    """The database side of ``listener``'s deliveries from ``subscription`` (its logical
    subscription: ``PlannedSubscription.logical_name``) in ``database``, whose outbox
    ``dispatcher`` sends for the process ``owner``; a reply goes to the delivery's broker
    ``broker``, which a send tries first too; a send its broker refuses goes to
    ``error_destination``."""

    def __init__(self, database: Database, dispatcher: Dispatcher, owner: str, *,
                 listener: str, subscription: str, broker: str,
                 error_destination: Destination) -> None:
        self.database = database
        self._dispatcher = dispatcher
        self._owner = owner
        self._listener = listener
        self._subscription = subscription
        self._broker = broker
        self._error_destination = error_destination

    async def run(self, message: Message, handler: Run, *, by_content: bool) -> bool:
        """Run ``handler`` for ``message`` unless a copy of it was processed already; False
        when one was (its pending sends are dispatched now). ``by_content``: the message came
        without an id, and ``message.id`` is a digest of its content (``mdb.identity``).

        Raises ``IdentityReused`` for a message the inbox knows by its id from another one:
        another body, or (known by its content) not a copy, since it is not flagged
        redelivered. What the handler raises is raised, its transaction rolled back. Raises
        ``DatabaseUnavailable`` when the database is out of reach (the run may be made again:
        its claim finds out whether it committed), and ``DispatchPending`` when a send could
        not be dispatched: the delivery must then stay unsettled (its effects are committed;
        its redelivery completes the dispatch)."""
        database = self.database
        source = f"{self._listener}/{self._subscription}/{message.id}"
        failure: Exception | None = None
        try:
            async with database.session() as session:
                with database.deadline():
                    taken = await inbox.claim(session, self._listener, self._subscription,
                                              message.id, message.body, time.time())
                if taken is None:
                    writer = Writer(session, self._owner, database.settings.outbox_lease,
                                    error_destination=self._error_destination, source=source,
                                    broker=self._broker)
                    with handing(self._listener):
                        await _handled(handler(session, writer.send))
        except _Raised as raised:
            failure = raised.exception
        if failure is not None:
            raise failure  # outside the except block: its own cause and context, unchanged
        if taken is not None and not taken.same_body:
            raise IdentityReused(
                f"message {message.id}: listener {self._listener} processed another message "
                "with this id and another body; this one is not a copy of it")
        if taken is not None and by_content and not message.redelivered:
            raise IdentityReused(
                f"message {message.id}: it came without an id, not flagged redelivered, with "
                f"the content of a message listener {self._listener} processed: a second "
                "message of that content cannot be told from a copy (give messages an id)")
        try:
            if taken is not None:
                await self._dispatcher.dispatch_pending(source)
                return False
            await self._dispatcher.dispatch(writer.rows)
        except BrokerError as exc:
            raise DispatchPending(f"sends of message {message.id} wait in the outbox of "
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
