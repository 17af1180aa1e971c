"""The outbox: messages written in the same database transaction as the writes they stand for,
dispatched once it committed, and deleted once a broker confirmed them.

Each row keeps the message's ``mdb_id``: a row dispatched twice (its process died after the
send and before the delete) reaches its destination twice with one id, which a downstream
exactly-once listener drops. A row is leased to the process dispatching it (``owner``,
``lease_until``): the process that wrote it dispatches it at once; a row whose lease ran out
(its process died, or its broker was down) is taken by whichever process of the app sweeps
next. A row the broker refuses goes to its error destination with the reason, never round
and round.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import ColumnElement, delete, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from mdb import message as headers_
from mdb.delivery.copies import bounded
from mdb.destinations import Destination
from mdb.errors import (
    BrokerError,
    ConnectionFailed,
    ConnectionLost,
    SendOutcomeUnknown,
    error_type,
)
from mdb.exactly_once.database import Database
from mdb.exactly_once.tables import outbox
from mdb.message import ID, OutgoingMessage, ReplyAddress, ReplyTo
from mdb.producer import Producer

log = logging.getLogger("mdb.outbox")

UNSURE = (ConnectionLost, ConnectionFailed, SendOutcomeUnknown)
"""Send failures that say nothing against the message: it is tried again later."""
SWEEP_BATCH = 100


@dataclass(frozen=True, slots=True)
class Row:
    """One outbox row, as written or read back."""

    seq: int
    target: ReplyTo
    reply_broker: str | None
    key: str | None
    message: OutgoingMessage
    error_destination: Destination


class Writer:
    """The sends of one transaction (a handler's run, or a producer's session): ``send`` (a
    ``mdb.context.SendFunction``) writes a row leased to ``owner``, which dispatches it once
    the transaction committed. ``reply_broker`` is the broker a reply goes to (the
    delivery's); ``source`` the inbox key of the delivery, if any."""

    def __init__(self, session: AsyncSession, owner: str, lease: float, *,
                 error_destination: Destination | None, source: str | None = None,
                 reply_broker: str | None = None) -> None:
        self._session = session
        self._owner = owner
        self._lease = lease
        self._error_destination = error_destination
        self._source = source
        self._reply_broker = reply_broker
        self.rows: list[Row] = []

    async def send(self, target: ReplyTo, message: OutgoingMessage, key: str | None) -> None:
        now = time.time()
        errors = self._error_destination or _default_error_destination(target)
        reply = isinstance(target, ReplyAddress)
        values = {
            "message_id": message.headers.get(ID, ""), "source": self._source,
            "destination": None if reply else str(target),
            "reply_broker": self._reply_broker if reply else None,
            "reply_address": str(target) if reply else None, "member_key": key,
            "body": message.body, "headers": json.dumps(dict(message.headers)),
            "reply_to": None if message.reply_to is None else str(message.reply_to),
            "correlation_id": message.correlation_id, "error_destination": str(errors),
            "created_at": now, "owner": self._owner, "lease_until": now + self._lease,
            "attempts": 0,
        }
        result = await self._session.execute(outbox.insert().values(values))
        seq = result.inserted_primary_key[0]  # type: ignore[attr-defined]
        self.rows.append(Row(seq, target, self._reply_broker if reply else None, key, message,
                             errors))


async def backlog(session: AsyncSession) -> tuple[int, float | None]:
    """How many rows wait in the outbox, and the ``created_at`` of the oldest (None: none)."""
    rows, oldest = (await session.execute(
        select(func.count(), func.min(outbox.c.created_at)))).one()
    return int(rows), None if oldest is None else float(oldest)


def _default_error_destination(target: ReplyTo) -> Destination:
    name = target.name if isinstance(target, Destination) else "mdb.replies"
    return Destination.parse(f"queue:{name}.DLQ")


class Dispatcher:
    """Sends outbox rows of ``database`` through ``producer`` for the process ``owner``."""

    def __init__(self, database: Database, producer: Producer, owner: str) -> None:
        self._database = database
        self._producer = producer
        self._owner = owner

    async def dispatch(self, rows: Sequence[Row]) -> None:
        """Send ``rows`` in order, deleting each once its broker confirmed it (or once a
        refused one was moved to its error destination). Raises the ``BrokerError`` of the
        first that could not be sent: it and those after it stay, their lease ended so that
        the next sweep takes them."""
        for index, row in enumerate(rows):
            try:
                await self._send(row)
            except BrokerError as exc:
                await self._release(rows[index:], exc)
                raise
            await self._forget(row.seq)

    async def dispatch_pending(self, source: str) -> None:
        """Dispatch the rows a delivery's committed run left undispatched (its process died,
        or a broker was down): once they are sent, the delivery may be settled."""
        rows = await self._claim(outbox.c.source == source, leased_or_not=True)
        await self.dispatch(rows)

    async def sweep(self) -> int:
        """Take the rows whose lease ran out and dispatch them in the order they were
        written; how many were sent. Stops at the first that cannot be sent (order)."""
        rows = await self._claim(outbox.c.lease_until < time.time())
        if rows:
            await self.dispatch(rows)
        return len(rows)

    async def _claim(self, which: ColumnElement[bool], *,
                     leased_or_not: bool = False) -> list[Row]:
        """Lease the rows ``which`` selects (at most ``SWEEP_BATCH``, oldest first) to this
        process; rows another process leased meanwhile are left to it, unless
        ``leased_or_not``."""
        database = self._database
        now = time.time()
        stamp = now + database.settings.outbox_lease
        async with database.session() as session:
            with database.deadline():
                chosen = select(outbox.c.seq).where(which).order_by(outbox.c.seq) \
                    .limit(SWEEP_BATCH)
                seqs = list((await session.execute(chosen)).scalars())
                if not seqs:
                    return []
                condition: ColumnElement[bool] = outbox.c.seq.in_(seqs)
                if not leased_or_not:
                    condition = condition & (outbox.c.lease_until < now)
                await session.execute(update(outbox).where(condition).values(
                    owner=self._owner, lease_until=stamp))
                mine = select(outbox).where(outbox.c.seq.in_(seqs), outbox.c.owner == self._owner,
                                            outbox.c.lease_until == stamp).order_by(outbox.c.seq)
                return [_row(r) for r in (await session.execute(mine)).mappings()]

    async def _send(self, row: Row) -> None:
        try:
            if isinstance(row.target, ReplyAddress):
                assert row.reply_broker is not None
                await self._producer.send_reply(row.reply_broker, row.target, row.message)
            else:
                await self._producer.send_message(row.target, row.message, key=row.key)
        except UNSURE:
            raise
        except BrokerError as exc:
            await self._move_to_error(row, exc)

    async def _move_to_error(self, row: Row, refusal: BrokerError) -> None:
        """A row its broker refused: its message to the error destination, saying why."""
        headers = dict(row.message.headers)
        headers.update({headers_.ERROR_TYPE: error_type(refusal),
                        headers_.ERROR_MESSAGE: str(refusal)[:4000],
                        headers_.ORIGINAL_DESTINATION: str(row.target)})
        kept, _ = bounded(headers)
        copy = OutgoingMessage(row.message.body, kept, correlation_id=row.message.correlation_id)
        await self._producer.send_message(row.error_destination, copy)
        log.warning("outbox: message %s refused by %s (%s); moved to %s", row.message.headers.get(
            ID), row.target, refusal, row.error_destination)

    async def _forget(self, seq: int) -> None:
        database = self._database
        async with database.session() as session:
            with database.deadline():
                await session.execute(delete(outbox).where(outbox.c.seq == seq))

    async def _release(self, rows: Sequence[Row], failure: BrokerError) -> None:
        """End the lease of rows that could not be sent, so that the next sweep takes them."""
        database = self._database
        async with database.session() as session:
            with database.deadline():
                await session.execute(
                    update(outbox).where(outbox.c.seq.in_([r.seq for r in rows]))
                    .values(owner=None, lease_until=0.0, attempts=outbox.c.attempts + 1,
                            last_error=f"{error_type(failure)}: {failure}"[:4000]))


def _row(values: object) -> Row:
    v = dict(values)  # type: ignore[call-overload]
    target: ReplyTo = (ReplyAddress(v["reply_address"]) if v["reply_address"] is not None
                       else Destination.parse(v["destination"]))
    message = OutgoingMessage(
        v["body"], json.loads(v["headers"]),
        reply_to=None if v["reply_to"] is None else Destination.parse(v["reply_to"]),
        correlation_id=v["correlation_id"])
    return Row(v["seq"], target, v["reply_broker"], v["member_key"], message,
               Destination.parse(v["error_destination"]))
