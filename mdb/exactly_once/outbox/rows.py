"""An outbox row (``Row``) as the writer and the dispatcher know it, and the statements both
make on rows: their delete once sent (``forget``), the claim's read back (``ADDRESSED``), the
backlog's count.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import bindparam, delete, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from mdb.exactly_once.tables import outbox
from mdb.messages.destinations import Destination
from mdb.messages.message import OutgoingMessage, ReplyAddress, ReplyTo

# Built once: a statement built per call costs its cache key again at every execution.
FORGET = delete(outbox).where(outbox.c.seq.in_(bindparam("seqs", expanding=True)))
# What a claim reads back of each row: everything but its message, and its body's size.
ADDRESSED = (outbox.c.seq, outbox.c.destination, outbox.c.reply_address, outbox.c.reply_broker,
             outbox.c.member_key, outbox.c.error_destination, outbox.c.lease_until,
             func.length(outbox.c.body).label("size"))


@dataclass(frozen=True, slots=True)
class Row:
    """One outbox row, as written or read back. ``broker``: the broker of the delivery whose
    handler sent it (column ``reply_broker``), where a reply goes and where a send tries a
    member first, as ``Context.send`` does; None for a producer's send."""

    seq: int
    target: ReplyTo
    broker: str | None
    key: str | None
    message: OutgoingMessage | None
    """As written; None in a row read back, whose message (its body above all) is read only
    as it is sent (``Dispatcher``): a sweep holds one at a time, however many rows wait and
    however large they are."""
    size: int
    """Its body's size in bytes."""
    error_destination: Destination
    lease_until: float
    """``time.time()`` when its lease runs out, as written or last renewed."""


async def forget(session: AsyncSession, seqs: Sequence[int]) -> None:
    """Delete the rows ``seqs`` (sent: ``Dispatcher.sent``) in ``session``'s transaction."""
    if seqs:
        await session.execute(FORGET, {"seqs": seqs})


async def backlog(session: AsyncSession) -> tuple[int, float | None]:
    """How many rows wait in the outbox, and the ``created_at`` of the oldest (None: none)."""
    rows, oldest = (await session.execute(
        select(func.count(), func.min(outbox.c.created_at)))).one()
    return int(rows), None if oldest is None else float(oldest)


def claimed_row(values: object) -> Row:
    """The ``Row`` a claim read back (``ADDRESSED``), its message left to be read as it is sent."""
    v = dict(values)  # type: ignore[call-overload]
    target: ReplyTo = (ReplyAddress(v["reply_address"]) if v["reply_address"] is not None
                       else Destination.parse(v["destination"]))
    return Row(v["seq"], target, v["reply_broker"], v["member_key"], None, v["size"],
               Destination.parse(v["error_destination"]), v["lease_until"])
