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
* after the dispatch, before the ack: the copy finds its row; it is acked once nothing of
  its run is pending (a row sent is deleted by the next run's transaction: until then, a
  sweep of another process sends it again, with its id, once its lease ran out).

A batch (``run_all``) is one such run for several messages: their claims in one statement,
the handler on each in the one session, their sends in one statement, one commit; each crash
point leaves every message of it as it leaves one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession

from mdb.errors import BrokerError, DispatchPending, IdentityReused
from mdb.exactly_once import inbox, tables
from mdb.exactly_once.database.database import Database
from mdb.exactly_once.database.handler_sessions import handing
from mdb.exactly_once.outbox.dispatcher import Dispatcher
from mdb.exactly_once.outbox.writer import Writer
from mdb.listeners.context import SendFunction
from mdb.messages.destinations import Destination
from mdb.messages.message import Message

Run = Callable[[AsyncSession, SendFunction], Awaitable[None]]
"""The handler's run: called with the transaction's session and the outbox's send."""
RunAt = Callable[[int, AsyncSession, SendFunction], Awaitable[None]]
"""The handler's run on the message at an index of a batch."""


class Guard:
    """The database side of ``listener``'s deliveries from ``subscription`` (its logical
    subscription: ``PlannedSubscription.logical_name``) in ``database``, whose outbox
    ``dispatcher`` sends for the process ``owner``; a reply goes to the delivery's broker
    ``broker``, which a send tries first too; a send its broker refuses goes to
    ``error_destination``. The inbox keeps ``listener`` and ``subscription`` as its key
    columns can (``tables.fitted``)."""

    def __init__(self, database: Database, dispatcher: Dispatcher, owner: str, *,
                 listener: str, subscription: str, broker: str,
                 error_destination: Destination) -> None:
        self.database = database
        self._dispatcher = dispatcher
        self._owner = owner
        self._listener = listener
        # The inbox's key of this listener's messages from this subscription.
        self._keyed = (tables.fitted(listener, tables.LISTENER),
                       tables.fitted(subscription, tables.SUBSCRIPTION))
        self._broker = broker
        self._error_destination = error_destination

    async def run(self, message: Message, handler: Run, *, at: float) -> bool:
        """Run ``handler`` for ``message`` unless a copy of it was processed already; False
        when one was (its pending sends are dispatched now). ``at``: the time of the claim,
        as the inbox keeps it; a run made again after its commit was in doubt gives its first
        run's, so that it knows its own row.

        Raises ``IdentityReused`` for a message the inbox knows by its id from another one:
        another body, or (known by its content) any other message, since a copy of it carries
        its identity as an id (how the delivery was flagged says nothing of that: mdb flags a
        run it makes again itself). What the handler raises is raised, its transaction rolled
        back. Raises ``DatabaseUnavailable`` when the database is out of reach (the run may be
        made again: its claim finds out whether it committed), and ``DispatchPending`` when a
        send could not be dispatched: the delivery must then stay unsettled (its effects are
        committed; its redelivery completes the dispatch)."""
        async def one(_index: int, session: AsyncSession, send: SendFunction) -> None:
            await handler(session, send)

        (ran,) = await self.run_all((message,), one, at=at)
        if isinstance(ran, IdentityReused):
            raise ran
        return ran

    async def run_all(self, messages: Sequence[Message],
                      handler: RunAt, *, at: float) -> list[bool | IdentityReused]:
        """``run`` of several messages (no identity twice) in one transaction, claimed
        ``at``: one claim statement, ``handler`` called with the
        index of each message claimed now, in order, on the one session, their sends written
        in one statement, one commit, then their dispatch. What became of each: True (run),
        False (a copy already processed) or the ``IdentityReused`` it is. What the handler
        raises on one is raised, and nothing of the batch is kept; ``DatabaseUnavailable``
        and ``DispatchPending`` as ``run``'s (for every message of the batch)."""
        database = self.database
        failure: Exception | None = None
        ran: list[bool | IdentityReused] = []
        try:
            async with self._dispatcher.sent() as sent, database.session() as session:
                with database.deadline():
                    taken = await inbox.claim_all(
                        session, *self._keyed,
                        {message.id: message.body for message in messages}, at)
                writer = Writer(session, self._owner, database.settings.outbox_lease,
                                error_destination=self._error_destination, broker=self._broker)
                with handing(self._listener):
                    for index, message in enumerate(messages):
                        ran.append(self._fate(message, taken[message.id]))
                        if ran[-1] is True:
                            await _handled(handler(index, session,
                                                   writer.sends_for(self._source(message))))
                with database.deadline():
                    # Last, so that the rows the last dispatches sent are locked only until
                    # the commit, not while the handler runs: a sweep skips locked rows.
                    await writer.write(forgetting=sent)
        except _Raised as raised:
            failure = raised.exception
        if failure is not None:
            raise failure  # outside the except block: its own cause and context, unchanged
        try:
            if True in ran:
                await self._dispatcher.dispatch(writer.rows)
            for message, done in zip(messages, ran, strict=True):
                if done is False:
                    await self._dispatcher.dispatch_pending(self._source(message))
        except BrokerError as exc:
            raise DispatchPending(f"sends of message {messages[0].id}"
                                  f"{' and the rest of its batch' if len(messages) > 1 else ''}"
                                  f" wait in the outbox of database {database.name}: "
                                  f"{exc}") from exc
        return ran

    def _source(self, message: Message) -> str:
        """The inbox key of ``message``, which its outbox rows keep."""
        return "/".join((*self._keyed, message.id))

    def _fate(self, message: Message, taken: inbox.Taken | None) -> bool | IdentityReused:
        """Whether ``message``, claimed now (``taken`` None) or before, runs; False for a copy
        already processed (or its own earlier run, committed); the ``IdentityReused`` it is
        when it is not a copy."""
        if taken is None:
            return True
        if taken.ours:
            return False
        if not taken.same_body:
            return IdentityReused(
                f"message {message.id}: listener {self._listener} processed another message "
                "with this id and another body; this one is not a copy of it")
        if message.by_content:
            return IdentityReused(
                f"message {message.id}: it came without an id, with the content of a message "
                f"listener {self._listener} processed: a second message of that content "
                "cannot be told from a copy (give messages an id)")
        return False


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
