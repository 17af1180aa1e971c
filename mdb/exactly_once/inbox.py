"""The inbox: which messages an exactly-once listener processed.

A row is keyed by the listener, its logical subscription (the topic subscription's name, or
the logical queue: never a member, so that copies on two members are one message) and the
message's identity (``mdb.messages.identity``); it keeps a digest of the message's body, so that a
message that comes with another's identity is not taken for a copy of it.

A delivery claims its message's row first thing in the handler's database transaction. The
claim is an insert that does nothing on a conflict: a copy whose row is committed finds it
taken and is settled without running the handler. Two copies processed at once (a
redelivery to another server of the app): the second insert waits on the unique key until
the first transaction ends, then finds the row taken (the first committed: the handler ran
once) or claims it (the first rolled back). So the handler runs once, not merely applies its
writes once; the price is that the second copy's pool slot waits for the first.

MariaDB/MySQL have no such clause that says whether it inserted (``INSERT IGNORE`` leaves a
warning its driver reads with another round trip and logs, key and all; the count of ``ON
DUPLICATE KEY UPDATE`` is 1 either way with the found-rows flag SQLAlchemy sets): the claim is
a plain insert, refused on a duplicate key without ending the transaction. InnoDB makes it
wait on the uncommitted row of the same key as PostgreSQL does.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

from sqlalchemy import ColumnElement, Executable, delete, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from mdb.exactly_once.tables import inbox

# Built once: a statement built per call costs its cache key again at every execution.
_CLAIMS: dict[str, Executable] = {
    "postgresql": postgresql.insert(inbox).on_conflict_do_nothing(),
    "sqlite": sqlite.insert(inbox).on_conflict_do_nothing(),
}
# A batch's claims in one statement, which returns the identities it claimed now.
_BATCH_CLAIMS: dict[str, Executable] = {
    "postgresql": postgresql.insert(inbox).on_conflict_do_nothing().returning(
        inbox.c.message_id),
    "sqlite": sqlite.insert(inbox).on_conflict_do_nothing().returning(inbox.c.message_id),
}
_INSERT = inbox.insert()
_REFUSING = ("mysql", "mariadb")  # a duplicate key refuses the statement, not the transaction
_DUPLICATE_KEY = 1062  # MariaDB's and MySQL's ER_DUP_ENTRY


@dataclass(frozen=True, slots=True)
class Taken:
    """The row was claimed before (committed, or by a transaction this one waited for)."""

    same_body: bool
    """Its body's digest is this message's (or unknown: a row written before mdb kept it)."""
    ours: bool
    """It was claimed at the time this claim gives: by this very delivery's earlier run, whose
    commit was in doubt (a run made again claims as of its first claim's time)."""


async def claim(session: AsyncSession, listener: str, subscription: str, message_id: str,
                body: bytes, now: float) -> Taken | None:
    """Record that ``listener`` processes ``message_id`` (whose body is ``body``) from
    ``subscription`` in this session's transaction, at ``now``; None when it was claimed now,
    else what the row taken before says."""
    digest = hashlib.sha256(body).hexdigest()
    values = {"listener": listener, "subscription": subscription, "message_id": message_id,
              "digest": digest, "processed_at": now}
    dialect = session.get_bind().dialect.name
    statement = _CLAIMS.get(dialect)
    if statement is not None:
        if (await session.execute(statement, values)).rowcount:  # type: ignore[attr-defined]
            return None
    elif dialect in _REFUSING:
        try:
            await session.execute(_INSERT, values)
            return None
        except IntegrityError as exc:
            if exc.orig is None or exc.orig.args[:1] != (_DUPLICATE_KEY,):
                raise
    kept = (await session.execute(select(inbox.c.digest, _claimed_at(now)).where(
        inbox.c.listener == listener, inbox.c.subscription == subscription,
        inbox.c.message_id == message_id))).first()
    if kept is not None:
        return Taken(kept.digest in (None, digest), bool(kept.ours))
    # A database without the clause: its primary key refuses a second claim.
    await session.execute(_INSERT, values)
    return None


async def claim_all(session: AsyncSession, listener: str, subscription: str,
                    bodies: Mapping[str, bytes], now: float) -> dict[str, Taken | None]:
    """``claim`` of several messages (each identity with its body) in one transaction, at
    ``now``: in one statement where the database has the clause, else one claim after the
    other."""
    statement = _BATCH_CLAIMS.get(session.get_bind().dialect.name)
    # One message is claimed by the row count: a returned row costs a result to read, a
    # fifth of the claim's Python calls on SQLite.
    if statement is None or len(bodies) == 1:
        return {message_id: await claim(session, listener, subscription, message_id, body, now)
                for message_id, body in sorted(bodies.items())}
    digests = {message_id: hashlib.sha256(body).hexdigest()
               for message_id, body in bodies.items()}
    # In the order of the key, as every batch claims: two batches that claim the same
    # identities in two orders would each wait for the other.
    values = [{"listener": listener, "subscription": subscription, "message_id": message_id,
               "digest": digest, "processed_at": now}
              for message_id, digest in sorted(digests.items())]
    claimed = set((await session.execute(statement, values)).scalars())
    if len(claimed) == len(digests):
        return dict.fromkeys(digests)
    taken = [message_id for message_id in digests if message_id not in claimed]
    kept = {row.message_id: row for row in await session.execute(
        select(inbox.c.message_id, inbox.c.digest, _claimed_at(now)).where(
            inbox.c.listener == listener, inbox.c.subscription == subscription,
            inbox.c.message_id.in_(taken)))}
    found: dict[str, Taken | None] = {}
    for message_id, digest in digests.items():
        if message_id in claimed:
            found[message_id] = None
        elif message_id in kept:
            row = kept[message_id]
            found[message_id] = Taken(row.digest in (None, digest), bool(row.ours))
        else:  # purged since the insert met it: claimed as one
            found[message_id] = await claim(session, listener, subscription, message_id,
                                            bodies[message_id], now)
    return found


def _claimed_at(now: float) -> ColumnElement[bool]:
    """Whether a row was claimed at ``now``: compared by the database, as it keeps the time
    it was given (exactly, as a double)."""
    return (inbox.c.processed_at == now).label("ours")


async def purge(session: AsyncSession, older_than: float, batch: int) -> int:
    """Delete at most ``batch`` rows processed before ``older_than``; how many went. Small
    batches keep each transaction short, so purging never holds up a claim for long."""
    oldest = (select(inbox.c.listener, inbox.c.subscription, inbox.c.message_id)
              .where(inbox.c.processed_at < older_than).limit(batch))
    rows = (await session.execute(oldest)).all()
    for listener, subscription, message_id in rows:
        await session.execute(delete(inbox).where(
            inbox.c.listener == listener, inbox.c.subscription == subscription,
            inbox.c.message_id == message_id))
    return len(rows)
