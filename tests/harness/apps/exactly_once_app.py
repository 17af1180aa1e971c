"""Two exactly-once stages, run as container processes by the exactly-once fault tests.

``first`` consumes ``topic:$EO_TOPIC`` (one copy per app; in the tests a partitioned topic
over three brokers, fed by a foreign producer: no ``mdb_id``), inserts a row of the effect
ledger keyed by the business id its body carries (with the server that ran it,
``$MDB_SERVER``) and sends that id on to ``queue:$EO_TOPIC.second`` (through the outbox);
``second`` consumes that and inserts its own row, keyed by the id it received. The ledger has
no unique key: a run that happened twice leaves two rows, which the test counts.

``$EO_DELAY`` (seconds) keeps each run of ``first`` busy that long in its transaction, so
that a fault finds work in flight and still to come.

With ``$EO_FREEZE`` set, the process stops itself (SIGSTOP) after the commit of the
``$EO_FREEZE``-th run of ``first``, printing ``{"event": "frozen", "id": ID, "broker":
NAME}`` first: the business id it ran and the name of the broker its delivery came from. It
stops before its sends are dispatched (``$EO_FREEZE_BEFORE=dispatch``, the default) or once
they were, before the message is acked (``ack``). The test kills it there, or kills that
broker and resumes it: the windows an exactly-once listener exists for.

With ``$EO_BROKEN`` set, ``first`` is broken on purpose: an at-least-once listener that
writes its effect through an engine of its own (on the database of ``databases.main``),
committed before the handler returns, so a redelivery runs it again; the freeze comes at
the end of its handler, after that commit and before the ack. The fault tests show with it
that their checks see a doubled effect.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Sequence
from functools import cache

import anyio
from sqlalchemy import Column, Integer, MetaData, String, Table
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine

from mdb import Context, Distribution, Redelivery, listener
from mdb.exactly_once.outbox.dispatcher import Dispatcher
from mdb.exactly_once.outbox.rows import Row

TOPIC = os.environ.get("EO_TOPIC", "eo")
SECOND = f"queue:{TOPIC}.second"
SERVER = os.environ.get("MDB_SERVER")
FREEZE = int(os.environ.get("EO_FREEZE", "0"))
DELAY = float(os.environ.get("EO_DELAY", "0"))
BEFORE = os.environ.get("EO_FREEZE_BEFORE", "dispatch")
BROKEN = bool(os.environ.get("EO_BROKEN"))

ledger_tables = MetaData()
effects = Table("effects", ledger_tables,
                Column("seq", Integer, primary_key=True, autoincrement=True),
                Column("stage", String(20), nullable=False),
                Column("key", String(200), nullable=False),
                Column("server", String(50)))

# An outage of the database or the broker brings deliveries back flagged, each a delivery of
# its count: enough of them, soon, so that a fault test's outage never reaches the error queue.
PATIENT = Redelivery(limit=50, delay=0.2, max_delay=1.0)

#: The broker each business id's last run of ``first`` came from, for the freeze's line.
came_from: dict[str, str] = {}
runs = 0  # of ``first`` in this process (with sends to dispatch, when exactly once)


def broker_of(ctx: Context) -> str:
    """The name of the broker a delivery came from: each member's name ends with its
    broker's (``Stages``), and so does the STOMP destination of every delivery from it."""
    return ctx.headers.get("destination", "").rsplit(".", 1)[-1]


if BROKEN:
    @cache
    def own_engine() -> AsyncEngine:
        return create_async_engine(json.loads(os.environ["MDB_DATABASES"])["main"]["url"])

    @listener(f"topic:{TOPIC}", distribution=Distribution.ONE_COPY_PER_APP, pool=2,
              redelivery=PATIENT, name="first")
    async def first_outside(body: str, ctx: Context) -> None:
        global runs
        async with own_engine().begin() as connection:  # committed at the end of the block
            await connection.execute(effects.insert().values(stage="first", key=body,
                                                             server=SERVER))
        await ctx.send(SECOND, body)
        runs += 1
        if runs == FREEZE:
            freeze(body, broker_of(ctx))
else:
    @listener(f"topic:{TOPIC}", distribution=Distribution.ONE_COPY_PER_APP,
              exactly_once="main", pool=2, redelivery=PATIENT)
    async def first(body: str, ctx: Context, session: AsyncSession) -> None:
        await session.execute(effects.insert().values(stage="first", key=body, server=SERVER))
        came_from[body] = broker_of(ctx)
        if DELAY:
            await anyio.sleep(DELAY)
        await ctx.send(SECOND, body)


@listener(SECOND, exactly_once="main", pool=2, redelivery=PATIENT)
async def second(body: str, session: AsyncSession) -> None:
    await session.execute(effects.insert().values(stage="second", key=body, server=SERVER))


def freeze(key: str, broker: str) -> None:
    """Say which business id and broker, then stop this process (SIGSTOP) until the test
    resumes or kills it."""
    line = {"event": "frozen", "id": key, "broker": broker}
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), (json.dumps(line) + "\n").encode())
    os.kill(os.getpid(), signal.SIGSTOP)


if FREEZE and not BROKEN:
    dispatch = Dispatcher.dispatch

    async def dispatch_or_freeze(self: Dispatcher, rows: Sequence[Row]) -> None:
        # Called once a run committed, before its sends and its ack (mdb.exactly_once.guard).
        global runs
        runs += bool(rows)  # the second stage's runs send nothing
        frozen = bool(rows) and runs == FREEZE
        # A run's rows, as written, carry their messages: the first's business id.
        key = rows[0].message.body.decode() if rows and rows[0].message else ""
        if frozen and BEFORE == "dispatch":
            freeze(key, came_from[key])
        await dispatch(self, rows)
        if frozen and BEFORE == "ack":
            freeze(key, came_from[key])

    Dispatcher.dispatch = dispatch_or_freeze  # type: ignore[method-assign]
