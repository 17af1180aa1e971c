"""The inbox: which messages an exactly-once listener processed.

A delivery claims its message's row first thing in the handler's database transaction. The
claim is an insert that does nothing on a conflict: a copy whose row is committed finds it
taken and is settled without running the handler. Two copies processed at once (a
redelivery to another server of the app): the second insert waits on the unique key until
the first transaction ends, then finds the row taken (the first committed: the handler ran
once) or claims it (the first rolled back). So the handler runs once, not merely applies its
writes once; the price is that the second copy's pool slot waits for the first.
"""

from __future__ import annotations

from sqlalchemy import Executable, delete, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from mdb.exactly_once.tables import inbox

# Built once: a statement built per call costs its cache key again at every execution.
_CLAIMS: dict[str, Executable] = {
    "postgresql": postgresql.insert(inbox).on_conflict_do_nothing(),
    "sqlite": sqlite.insert(inbox).on_conflict_do_nothing(),
}


async def claim(session: AsyncSession, listener: str, subscription: str, message_id: str,
                now: float) -> bool:
    """Record that ``listener`` processes ``message_id`` from ``subscription`` in this
    session's transaction; False when it already did (a committed row, or one committed by a
    concurrent transaction this one waited for)."""
    values = {"listener": listener, "subscription": subscription, "message_id": message_id,
              "processed_at": now}
    statement = _CLAIMS.get(session.get_bind().dialect.name)
    if statement is None:  # a database without the clause: the primary key refuses a second
        taken = select(inbox.c.message_id).where(
            inbox.c.listener == listener, inbox.c.subscription == subscription,
            inbox.c.message_id == message_id)
        if (await session.execute(taken)).first() is not None:
            return False
        statement = inbox.insert()
    result = await session.execute(statement, values)
    return bool(result.rowcount)  # type: ignore[attr-defined]


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
