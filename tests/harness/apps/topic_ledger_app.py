"""A topic listener run as separate container processes by the fault tests and the contract
suite's process tests (through ``tests.harness.processes.fleet.Fleet``), and by the supervisor's
tests.

It serves ``topic:$LEDGER_TOPIC`` with the distribution ``$LEDGER_DISTRIBUTION``
(``one-copy-per-app`` or ``one-copy-per-server``) and prints two JSON lines per delivery to
stdout (the ledger): ``start`` when the handler begins and ``done`` when it returns, each with
``ctx.id``, ``ctx.redelivered``, ``ctx.delivery_count``, the logical destination, the pid, the
app, the server and ``started``, when the handler began (``time.monotonic()``: one clock for
every process of this machine, so deliveries of several processes can be put in order). A
``$LEDGER_DELAY`` (seconds) keeps each handler busy that long, so a test can kill a process
with work in flight. With ``$LEDGER_QUEUE`` set, a second listener does the same for
``queue:$LEDGER_QUEUE``.
"""

from __future__ import annotations

import json
import os
import sys
import time

import anyio

from mdb import Context, listener
from mdb.messages.headers import MAYBE_REPEAT

DELAY = float(os.environ.get("LEDGER_DELAY", "0"))
SEND_TO = os.environ.get("LEDGER_SEND_TO")


def record(event: str, ctx: Context, started: float, **more: object) -> None:
    line = json.dumps({"event": event, "id": ctx.id, "redelivered": ctx.redelivered,
                       "count": ctx.delivery_count, "destination": str(ctx.destination),
                       "pid": os.getpid(),
                       "app": os.environ.get("MDB_APP"), "server": os.environ.get("MDB_SERVER"),
                       "started": started, **more})
    # One write of the whole line: stdout and stderr (logs of other threads) share one pipe,
    # and a line written in two pieces could be split by a log line.
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), (line + "\n").encode())


async def ledger(ctx: Context, send_to: str | None = None, **more: object) -> None:
    started = time.monotonic()
    record("start", ctx, started, **more)
    if DELAY:
        await anyio.sleep(DELAY)
    if send_to:
        await ctx.send(f"queue:{send_to}", ctx.id)
    record("done", ctx, started, **more)


@listener(f"topic:{os.environ.get('LEDGER_TOPIC', 'ledger')}",
          distribution=os.environ.get("LEDGER_DISTRIBUTION", "one-copy-per-app"), pool=2)
async def on_entry(body: str, ctx: Context) -> None:
    await ledger(ctx, send_to=SEND_TO)


if os.environ.get("LEDGER_QUEUE"):
    @listener(f"queue:{os.environ['LEDGER_QUEUE']}", pool=2)
    async def on_queue_entry(body: str, ctx: Context) -> None:
        await ledger(ctx)


if SEND_TO:
    @listener(f"queue:{SEND_TO}", pool=2)
    async def on_sent(body: str, ctx: Context) -> None:
        await ledger(ctx, source=body, maybe_repeat=ctx.headers.get(MAYBE_REPEAT) == "true")
