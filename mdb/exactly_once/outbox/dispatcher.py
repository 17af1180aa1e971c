"""``Dispatcher``: the outbox rows of a process sent through its producer, in the order they
were written, leased while they are sent (renewed, released when a send fails), swept when a
lease ran out, and deleted once a broker confirmed them (``sent``, ``forget_sent``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio
from sqlalchemy import ColumnElement, RowMapping, Select, bindparam, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from mdb.errors import (
    BrokerError,
    ConnectionFailed,
    ConnectionLost,
    DatabaseUnavailable,
    EncodeError,
    MdbError,
    SendOutcomeUnknown,
    error_type,
)
from mdb.exactly_once.database.database import Database
from mdb.exactly_once.outbox.rows import ADDRESSED, FORGET, Row, claimed_row
from mdb.exactly_once.tables import outbox
from mdb.messages.copies import failed_now, with_failure
from mdb.messages.destinations import Destination
from mdb.messages.headers import ID
from mdb.messages.message import MAX_BODY_BYTES, OutgoingMessage, ReplyAddress
from mdb.routing.producer import Producer

log = logging.getLogger("mdb.outbox")

UNSURE = (ConnectionLost, ConnectionFailed, SendOutcomeUnknown)
"""Send failures that say nothing against the message: it is tried again later."""
SWEEP_BATCH = 100
"""Rows a sweep claims at once: their addresses and leases, not their messages, which are read
one at a time as they are sent."""
RENEW_BATCH = 1000  # rows a lease renewal names in one statement
PENDING_POLL = 0.2
"""Seconds between two looks at rows a dispatch under way still holds, at most."""

# Built once: a statement built per call costs its cache key again at every execution.
_ENVELOPE = select(outbox.c.headers, outbox.c.reply_to, outbox.c.correlation_id).where(
    outbox.c.seq == bindparam("seq"))
_MESSAGE = _ENVELOPE.add_columns(outbox.c.body)


class Dispatcher:
    """Sends outbox rows of ``database`` through ``producer`` for the process ``owner``.

    Order per destination: rows are sent in the order they were written (``seq``), and a send
    that fails leaves its row and those after it in the outbox. Until a sweep sent them, a
    fresh run's rows for the same destination wait behind them: sent after them, or left with
    them when they still cannot go. Rows of another process are another matter: those it left
    when it died wait for their lease, and a live process's newer rows may overtake them.
    """

    def __init__(self, database: Database, producer: Producer, owner: str) -> None:
        self._database = database
        self._producer = producer
        self._owner = owner
        self._turn = anyio.Lock()  # one claim-and-send of waiting rows at a time: no row twice
        self._sending: set[int] = set()  # rows being sent by this process now
        # Rows sent and not deleted yet: the next run's transaction deletes them (``sent``),
        # or the next sweep; those of a transaction under way wait in ``_forgetting``.
        self._sent: set[int] = set()
        self._forgetting: set[int] = set()
        # Destinations with rows waiting in the outbox, older than a fresh run's; None until
        # the first sweep: rows an earlier process left may wait for any destination.
        self._behind: set[str] | None = None

    async def dispatch(self, rows: Sequence[Row]) -> None:
        """Send ``rows`` (committed, leased to this process) in order, after the rows of
        their destinations that wait in the outbox, each to be deleted (``sent``) once its
        broker confirmed it (or once a refused one was moved to its error destination). Raises the
        ``BrokerError`` of the first that could not be sent: it and those after it stay,
        their lease ended so that the next sweep takes them."""
        if self._behind is None or any(str(r.target) in self._behind for r in rows):
            try:
                while await self.sweep():
                    pass
            except BrokerError as exc:
                await self._release(rows, exc)
                raise
        await self._send_in_order(rows)

    async def dispatch_pending(self, source: str) -> None:
        """Dispatch the rows a delivery's committed run left undispatched (its process died,
        or a broker was down): once they are sent, the delivery may be settled. Older rows
        waiting in the outbox go first. A row still leased to a dispatch under way (the run
        that wrote it, in this process or another, sending still) is that dispatch's: this
        waits until it was sent, or its lease ran out (its process died), instead of sending
        it a second time."""
        while await self.sweep():
            pass
        database = self._database
        pending = select(outbox.c.seq, outbox.c.owner, outbox.c.lease_until).where(
            outbox.c.source == source)
        while True:
            async with database.session() as session:
                with database.deadline():
                    rows = [r for r in (await session.execute(pending)).all()
                            if r.seq not in self._sent and r.seq not in self._forgetting]
            now = time.time()
            free = [r.seq for r in rows if r.seq not in self._sending and (
                r.lease_until < now or r.owner == self._owner)]
            if free:
                async with self._turn:
                    await self._send_in_order(await self._claim(outbox.c.seq.in_(free) & (
                        (outbox.c.lease_until < now) | (outbox.c.owner == self._owner))))
            elif not rows:
                return
            else:  # the database tells only when asked
                await anyio.sleep(min(database.settings.outbox_lease / 3, PENDING_POLL))

    @property
    def busy(self) -> bool:
        """A sweep or a ``forward`` is under way."""
        return self._turn.locked()

    async def forward(self) -> int:
        """Send the rows this owner wrote (those whose transactions committed) and those
        whose lease ran out, in the order they were written: a producer's outbox after its
        commit. How many were sent; raises as ``dispatch``."""
        sent = 0
        async with self._turn:
            await self.forget_sent()  # before any claim: a row sent is never claimed again
            while rows := await self._claim(
                    (outbox.c.owner == self._owner) | (outbox.c.lease_until < time.time())):
                await self._send_in_order(rows)
                await self.forget_sent()  # before the next claim, which would take them
                sent += len(rows)
            self._behind = set()
        return sent

    async def sweep(self) -> int:
        """Take the rows whose lease ran out and dispatch them in the order they were
        written; how many were sent. Stops at the first that cannot be sent (order)."""
        async with self._turn:
            await self.forget_sent()  # before the claim: a row sent is never claimed again
            rows = await self._claim(outbox.c.lease_until < time.time())
            if rows:
                await self._send_in_order(rows)
                await self.forget_sent()  # a sweep is no run's: no transaction follows
            else:
                self._behind = set()
            return len(rows)

    async def _send_in_order(self, rows: Sequence[Row]) -> None:
        """Send ``rows`` (leased to this process) in order, each to be deleted once sent. Their
        lease is kept while they are sent, however long that takes (a broker that takes its
        time, thousands of rows): no sweep, of this process or another, takes them meanwhile.
        A row another process took all the same (the lease ran out while the database did not
        answer) is left to it."""
        if not rows:
            return
        seqs = [r.seq for r in rows]
        self._sending.update(seqs)
        lost: set[int] = set()
        failed: list[DatabaseUnavailable] = []
        # Ends the renewals; not a cancel of their scope, which costs anyio a repr of the
        # task (its coroutine and stack) at every dispatch.
        done = anyio.Event()
        # Most dispatches end long before their rows' first renewal is due (a third of the
        # lease): a task kept beside each, its task group started and ended, cost a run of one
        # message an eighth of its Python calls. A timer starts it once it is due. The event
        # loop is asyncio's, as SQLAlchemy's async engines need.
        loop = asyncio.get_running_loop()
        keeper: list[asyncio.Task[None]] = []
        due = _first_renewal(rows, self._database.settings.outbox_lease) - time.time()
        timer = loop.call_later(max(0.0, due), lambda: keeper.append(loop.create_task(
            self._keep_leased(rows, lost, failed, done))))
        try:
            for index, row in enumerate(rows):
                if failed:
                    raise failed[0]
                if row.seq in lost:
                    continue
                try:
                    sent = await self._send(row)
                except BrokerError as exc:
                    await self._release(rows[index:], exc)
                    raise
                if sent:
                    self._sent.add(row.seq)
                self._sending.discard(row.seq)
        except BaseException:
            for task in keeper:  # its renewal is of no use now, whatever it was doing
                task.cancel()
            raise
        finally:
            timer.cancel()
            done.set()
            self._sending.difference_update(seqs)
            await _ended(keeper)

    async def _keep_leased(self, rows: Sequence[Row], lost: set[int],
                           failed: list[DatabaseUnavailable], done: anyio.Event) -> None:
        """Renew the lease of ``rows`` still being sent, now (started once two thirds of it
        are left: ``_first_renewal``) and every third of it after, until ``done``; those no
        longer leased to this process go to ``lost``, a database that did not answer to
        ``failed`` (the sending stops: the rows' lease would run out)."""
        database = self._database
        lease = database.settings.outbox_lease
        while True:
            if done.is_set():
                return
            renewed = time.time()
            remaining = [r.seq for r in rows if r.seq in self._sending and r.seq not in lost]
            try:
                for start in range(0, len(remaining), RENEW_BATCH):
                    chunk = remaining[start:start + RENEW_BATCH]
                    mine = outbox.c.seq.in_(chunk) & (outbox.c.owner == self._owner)
                    renew = update(outbox).where(mine).values(lease_until=renewed + lease)
                    async with database.autocommitted() as connection:
                        with database.deadline():
                            if connection.dialect.update_returning:
                                kept = set((await connection.execute(
                                    renew.returning(outbox.c.seq))).scalars())
                            else:  # MariaDB/MySQL: the rows still this owner's once renewed
                                await connection.execute(renew)
                                kept = set((await connection.execute(
                                    select(outbox.c.seq).where(mine))).scalars())
                    lost.update(seq for seq in chunk if seq not in kept)
            except DatabaseUnavailable as exc:
                failed.append(exc)
                return
            with anyio.move_on_after(lease / 3):
                await done.wait()

    async def _claim(self, which: ColumnElement[bool]) -> list[Row]:
        """Lease the rows ``which`` selects (at most ``SWEEP_BATCH``, oldest first) to this
        process, in one statement: a row another process leased meanwhile no longer matches
        ``which`` when the update reaches it, and stays with that process."""
        database = self._database
        # Skipping the rows another transaction locked: a run deleting rows its process sent,
        # or another sweep claiming them; waiting for either would hold this sweep up for as
        # long as that transaction lasts, a process stopped in it included.
        oldest = (select(outbox.c.seq).where(which).order_by(outbox.c.seq).limit(SWEEP_BATCH)
                  .with_for_update(skip_locked=True))
        lease = {"owner": self._owner,
                 "lease_until": time.time() + database.settings.outbox_lease}
        async with database.session() as session:
            with database.deadline():
                if session.get_bind().dialect.update_returning:
                    claimed = (await session.execute(
                        update(outbox).where(outbox.c.seq.in_(oldest.scalar_subquery()), which)
                        .values(lease).returning(*ADDRESSED))).mappings().all()
                else:
                    claimed = await _locked_and_leased(session, oldest, lease)
        return sorted((claimed_row(r) for r in claimed), key=lambda r: r.seq)

    async def _send(self, row: Row) -> bool:
        """Send ``row``'s message; one its broker refuses goes to the row's error destination
        instead, and so does one whose body is larger than mdb sends (a row written before mdb
        refused such bodies: a broker would drop the connection, again at every sweep), without
        its body. False: the row is gone (another process took it, its lease run out)."""
        if row.size > MAX_BODY_BYTES:
            envelope = await self._message(row.seq, _ENVELOPE)
            if envelope is not None:
                await self._move_to_error(row, envelope, EncodeError(
                    f"a body of {row.size} bytes, more than the {MAX_BODY_BYTES >> 20} MiB mdb "
                    "sends, left out of this copy (docs/exactly-once.md)"))
            return envelope is not None
        message = row.message or await self._message(row.seq, _MESSAGE)
        if message is None:
            return False
        try:
            if isinstance(row.target, ReplyAddress):
                assert row.broker is not None
                await self._producer.send_reply(row.broker, row.target, message)
            else:
                await self._producer.send_message(row.target, message, key=row.key,
                                                  prefer=row.broker)
        except UNSURE:
            raise
        except BrokerError as exc:
            await self._move_to_error(row, message, exc)
        return True

    async def _message(self, seq: int, columns: Select[Any]) -> OutgoingMessage | None:
        """The message of row ``seq`` (``_MESSAGE``; ``_ENVELOPE``: without its body), read
        as it is about to be sent; None: the row is gone."""
        database = self._database
        async with database.autocommitted() as connection:
            with database.deadline():
                found = (await connection.execute(columns, {"seq": seq})).mappings().first()
        if found is None:
            return None
        return OutgoingMessage(
            found.get("body", b""), json.loads(found["headers"]),
            reply_to=None if found["reply_to"] is None else Destination.parse(found["reply_to"]),
            correlation_id=found["correlation_id"])

    async def _move_to_error(self, row: Row, message: OutgoingMessage,
                             refusal: MdbError) -> None:
        """A row refused (by its broker, or by mdb): its message to the error destination,
        saying why."""
        headers = with_failure(message.headers, error_type(refusal), str(refusal),
                               str(row.target))
        kept = failed_now(headers, self._producer.brokers.header_limits)
        copy = OutgoingMessage(message.body, kept, correlation_id=message.correlation_id)
        await self._producer.send_message(row.error_destination, copy)
        log.warning("outbox: message %s to %s refused (%s); moved to %s",
                    message.headers.get(ID), row.target, refusal, row.error_destination)

    @asynccontextmanager
    async def sent(self) -> AsyncIterator[list[int]]:
        """The rows sent since the last ``sent``, for the transaction made in this block to
        delete (``forget``): a run's, so that a sent row costs no transaction of its own.
        They are deleted again by the next one unless the block ends without an exception
        (its transaction committed)."""
        seqs = list(self._sent)
        self._sent.clear()
        self._forgetting.update(seqs)
        try:
            yield seqs
        except BaseException:
            self._sent.update(seqs)
            raise
        finally:
            self._forgetting.difference_update(seqs)

    async def forget_sent(self) -> None:
        """Delete the rows sent since the last run's transaction, committed as it runs:
        before a sweep claims rows (a row sent must not be taken again once its lease ran
        out) and at a stop."""
        database = self._database
        async with self.sent() as seqs:
            if seqs:
                # A connection, not a session: an ORM session costs more than the delete.
                async with database.autocommitted() as connection:
                    with database.deadline():
                        await connection.execute(FORGET, {"seqs": seqs})

    async def _release(self, rows: Sequence[Row], failure: BrokerError) -> None:
        """End the lease of rows that could not be sent, so that the next sweep takes them
        (and fresh rows for their destinations wait behind them)."""
        if self._behind is not None:
            self._behind.update(str(r.target) for r in rows)
        database = self._database
        async with database.session() as session:
            with database.deadline():
                await session.execute(
                    update(outbox).where(outbox.c.seq.in_([r.seq for r in rows]))
                    .values(owner=None, lease_until=0.0, attempts=outbox.c.attempts + 1,
                            last_error=f"{error_type(failure)}: {failure}"[:4000]))


async def _locked_and_leased(session: AsyncSession, oldest: Select[Any],
                             lease: dict[str, Any]) -> Sequence[RowMapping]:
    """``_claim`` on MariaDB/MySQL, whose UPDATE returns nothing and may not select from the
    table it updates: ``oldest`` locks the rows as it selects them, skipping those another
    process is leasing (``SKIP LOCKED``), then leased and read in the same transaction."""
    seqs = list((await session.execute(oldest)).scalars())
    if not seqs:
        return []
    await session.execute(update(outbox).where(outbox.c.seq.in_(seqs)).values(lease))
    return (await session.execute(
        select(*ADDRESSED).where(outbox.c.seq.in_(seqs)))).mappings().all()


def _first_renewal(rows: Sequence[Row], lease: float) -> float:
    """``time.time()`` at which the lease of ``rows`` is first renewed: when two thirds of
    the earliest one's are left (rows leased long ago: at once)."""
    return min(r.lease_until for r in rows) - lease * 2 / 3


async def _ended(keeper: list[asyncio.Task[None]]) -> None:
    """Wait for the lease keeper, if the timer started one: it ends at its next look at the
    dispatch's end, or as cancelled. What it raised is raised; a cancel is not its failure."""
    for task in keeper:
        with anyio.CancelScope(shield=True):
            await asyncio.wait([task])
        failure = None if task.cancelled() else task.exception()
        if failure is not None:
            raise failure
