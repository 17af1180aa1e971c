"""A listener module run as a separate container process by the crash tests.

It serves ``$LEDGER_QUEUE`` and prints one JSON line per event to stdout (the ledger). While
``$HANG_FIRST_DELIVERY`` is set, a first delivery never finishes, so a test can kill the
process with work in flight; while ``$FAIL_FIRST_DELIVERY`` is set, a first delivery raises.
"""

from __future__ import annotations

import json
import os

import anyio

from mdb import Context, listener


def record(event: str, ctx: Context, body: str) -> None:
    write_line({"event": event, "id": ctx.id, "body": body, "pid": os.getpid(),
                "redelivered": ctx.redelivered, "count": ctx.delivery_count})


def write_line(entry: dict[str, object]) -> None:
    """One write per line: with PYTHONUNBUFFERED, ``print`` writes the text and the newline
    separately, and a log line of another thread could land between them."""
    os.write(1, (json.dumps(entry) + "\n").encode())


@listener(f"queue:{os.environ.get('LEDGER_QUEUE', 'ledger')}", pool=4)
async def on_entry(body: str, ctx: Context) -> None:
    record("start", ctx, body)
    if os.environ.get("HANG_FIRST_DELIVERY") and not ctx.redelivered:
        await anyio.sleep_forever()
    if os.environ.get("FAIL_FIRST_DELIVERY") and ctx.delivery_count == 1:
        raise RuntimeError("the first delivery fails")
    record("done", ctx, body)
