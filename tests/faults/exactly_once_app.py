"""Two exactly-once stages, run as container processes by the exactly-once fault tests.

``first`` consumes ``queue:$EO_QUEUE``, inserts a row of the effect ledger keyed by the
message's id (with the server that ran it, ``$MDB_SERVER``) and sends the id on to
``queue:$EO_QUEUE.second`` (through the outbox);
``second`` consumes that and inserts its own row, keyed by the id it received. The ledger has no
unique key: a run that happened twice would leave two rows, which the test counts.

``$EO_DELAY`` (seconds) keeps each run of ``first`` busy that long in its transaction, so
that a fault finds work in flight and still to come.

With ``$EO_FREEZE`` set, the process stops itself (SIGSTOP) after the commit of the
``$EO_FREEZE``-th run of ``first``, printing ``{"event": "frozen", "id": ID}`` (the id of the
message it ran) first: before its sends are dispatched (``$EO_FREEZE_BEFORE=dispatch``, the
default) or once they were, before the message is acked (``ack``). The test kills it there,
in the window an exactly-once listener exists for.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Sequence

import anyio
from sqlalchemy import Column, Integer, MetaData, String, Table
from sqlalchemy.ext.asyncio import AsyncSession

from mdb import Context, Redelivery, listener
from mdb.exactly_once.outbox import Dispatcher, Row

QUEUE = os.environ.get("EO_QUEUE", "eo")
SERVER = os.environ.get("MDB_SERVER")
FREEZE = int(os.environ.get("EO_FREEZE", "0"))
DELAY = float(os.environ.get("EO_DELAY", "0"))
BEFORE = os.environ.get("EO_FREEZE_BEFORE", "dispatch")

ledger_tables = MetaData()
effects = Table("effects", ledger_tables,
                Column("seq", Integer, primary_key=True, autoincrement=True),
                Column("stage", String(20), nullable=False),
                Column("key", String(200), nullable=False),
                Column("server", String(50)))

# An outage of the database or the broker brings deliveries back flagged, each a delivery of
# its count: enough of them, soon, so that a fault test's outage never reaches the error queue.
PATIENT = Redelivery(limit=50, delay=0.2, max_delay=1.0)


@listener(f"queue:{QUEUE}", exactly_once="main", pool=2, redelivery=PATIENT)
async def first(body: str, ctx: Context, session: AsyncSession) -> None:
    await session.execute(effects.insert().values(stage="first", key=ctx.id, server=SERVER))
    if DELAY:
        await anyio.sleep(DELAY)
    await ctx.send(f"queue:{QUEUE}.second", ctx.id)


@listener(f"queue:{QUEUE}.second", exactly_once="main", pool=2, redelivery=PATIENT)
async def second(body: str, session: AsyncSession) -> None:
    await session.execute(effects.insert().values(stage="second", key=body, server=SERVER))


if FREEZE:
    runs = 0
    dispatch = Dispatcher.dispatch

    async def dispatch_or_freeze(self: Dispatcher, rows: Sequence[Row]) -> None:
        # Called once a run committed, before its sends and its ack (mdb.exactly_once.guard).
        global runs
        runs += bool(rows)  # the second stage's runs send nothing
        freeze = bool(rows) and runs == FREEZE
        if freeze and BEFORE == "dispatch":
            stop(rows)
        await dispatch(self, rows)
        if freeze and BEFORE == "ack":
            stop(rows)

    def stop(rows: Sequence[Row]) -> None:
        line = {"event": "frozen", "id": rows[0].message.body.decode()}  # first's message
        sys.stdout.flush()
        os.write(sys.stdout.fileno(), (json.dumps(line) + "\n").encode())
        os.kill(os.getpid(), signal.SIGSTOP)

    Dispatcher.dispatch = dispatch_or_freeze  # type: ignore[method-assign]
