"""A listener module run as a container process by the console's failed-messages test
(tests/console/test_failed_browser.py).

It serves ``$LEDGER_QUEUE`` without retries: a body starting ``poison`` raises ``ValueError``
until the file ``$FIXED_FILE`` exists (the fix deployed), one starting ``fatal`` raises
``KeyError`` always; each one processed is a JSON line ``{"event": "done", ...}`` on stdout."""

from __future__ import annotations

import os
from pathlib import Path

from mdb import Context, Redelivery, listener
from tests.harness.apps.queue_ledger_app import record


@listener(f"queue:{os.environ.get('LEDGER_QUEUE', 'ledger')}", redelivery=Redelivery(limit=0))
async def on_poison(body: str, ctx: Context) -> None:
    if body.startswith("poison") and not Path(os.environ["FIXED_FILE"]).exists():
        raise ValueError(f"cannot take {body}")
    if body.startswith("fatal"):
        raise KeyError(body)
    record("done", ctx, body)
