"""A topic listener module run as separate container processes by the process tests.

It serves ``topic:$LEDGER_TOPIC`` with the distribution ``$LEDGER_DISTRIBUTION``
(``one-copy-per-app`` or ``one-copy-per-server``) and prints one JSON line per processed message
to stdout (the ledger), naming the process and its server.
"""

from __future__ import annotations

import os

from mdb import Context, listener
from tests.contract.ledger_app import write_line


@listener(f"topic:{os.environ.get('LEDGER_TOPIC', 'ledger')}",
          distribution=os.environ.get("LEDGER_DISTRIBUTION", "one-copy-per-app"), pool=2)
async def on_entry(body: str, ctx: Context) -> None:
    write_line({"event": "done", "id": ctx.id, "body": body, "pid": os.getpid(),
                "server": os.environ.get("MDB_SERVER"), "redelivered": ctx.redelivered})
