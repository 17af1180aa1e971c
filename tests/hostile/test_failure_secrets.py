"""A handler's exception whose text holds secrets (docs/security.md, "Secrets"): a URL's
password, ``password=...``, ``token: ...``, a dict's ``'password'``, a bearer token, a query's
``api_key``, and a card number quoted by ``int()``. None of them reaches the error copy's
headers (its message and traceback, and after a replay its history), a span, a line of
``mdb run``'s log (text or JSON) or what ``mdb dlq list`` and ``show`` print; the rules
themselves are tested in tests/unit/test_redaction.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from mdb import Redelivery, listener
from mdb.commands.dlq.failed_message import Failed
from mdb.messages.destinations import Destination
from mdb.messages.headers import ERROR_MESSAGE, ERROR_TRACEBACK, LAST_FAILURE
from mdb.messages.identity import PROCESS
from mdb.messages.topology import Member
from mdb.seam.broker import Delivery
from mdb.testing import SyncRunner
from tests.harness.apps.in_process import running, settings_for, unique
from tests.harness.traffic.messages import read, send_all
from tests.hostile.careless_app import BODIES, CARD, JWT, SECRETS, TEXT, fail, on_work

pytestmark = pytest.mark.anyio

def leaked(texts: Iterable[str]) -> list[str]:
    return [secret for text in texts for secret in SECRETS if secret in text]


async def test_no_secret_of_a_handlers_exception_reaches_the_error_copy_or_a_span(
        broker_url: str, spans: InMemorySpanExporter) -> None:
    queue, errors = f"queue:{unique('secrets')}", f"queue:{unique('secrets_errors')}"

    @listener(queue, error_destination=errors, redelivery=Redelivery(limit=1, delay=0))
    async def handler(body: str) -> None:
        fail(body)

    async with running(settings_for(broker_url), handler):
        await send_all(broker_url, queue, list(BODIES))
        moved = {m.body: m.headers for m in await read(broker_url, errors, 2)}
    assert not leaked(v for headers in moved.values() for v in headers.values())
    secrets, card = moved[b"secrets"], moved[b"card"]
    assert "postgresql://shop:***@db:5432/orders" in secrets[ERROR_MESSAGE]
    assert "password=***" in secrets[ERROR_MESSAGE] and "Bearer" not in secrets[ERROR_MESSAGE]
    assert 'connect("postgresql://shop:***@db:5432/orders")' in secrets[ERROR_TRACEBACK]
    assert card[ERROR_MESSAGE] == "invalid literal for int() with base 10: '***'"
    process = [s for s in spans.get_finished_spans() if s.name == f"process {queue}"]
    assert process
    for span in process:
        assert not leaked([span.status.description or "",
                           *(str(e.attributes) for e in span.events)])


async def test_a_replayed_message_failing_again_keeps_its_history_masked(
        mdb_runner: SyncRunner) -> None:
    async with mdb_runner.run(on_work) as app:
        await app.send("queue:work", "secrets")
        await app.idle(fail_fast=False)
        await app.error_destination("queue:work.DLQ").replay()
        await app.idle(fail_fast=False)
        [again] = await app.take("queue:work.DLQ")
    history = again.headers[LAST_FAILURE[ERROR_MESSAGE]]
    assert "shop:***@db" in history and not leaked(again.headers.values())


def test_what_dlq_list_and_show_print_masks_every_secret() -> None:
    """What an error copy mdb did not mask may hold (one made before the rules, or by another
    producer): ``list`` and ``show`` print none of it, a header whose name says it holds a
    secret not at all."""
    delivery = Delivery(Destination.parse("queue:x.DLQ"), b"{}", {
        "mdb_id": "m-1", "mdb_error_type": "ConnectionError",
        ERROR_MESSAGE: f"cannot reach postgresql://shop:hunter2@db: {TEXT}; card {CARD}",
        ERROR_TRACEBACK: '  File "shop.py", line 3\n    connect("postgresql://shop:hunter2@db")\n'
                         f"    pay({CARD!r})\n",
        LAST_FAILURE[ERROR_MESSAGE]: f"earlier: password=pa55word {CARD}",
        "x-api-key": "key-5551212", "authorization": f"Bearer {JWT}",
        "session_token": "dict-secret", "region": "eu"}, None, False, None)
    failed = Failed.of(delivery, Member("default", delivery.destination), PROCESS,
                       assigned=True)
    shown = [*map(str, failed.summary().values()), *failed.shown_headers().values(),
             *failed.shown_lines(ERROR_MESSAGE), *failed.shown_lines(ERROR_TRACEBACK)]
    assert not leaked(shown)
    headers = failed.shown_headers()
    assert (headers["x-api-key"], headers["session_token"], headers["region"]) == (
        "***", "***", "eu")


def run_until_moved(**env: str) -> str:
    """``mdb run`` of ``careless_app`` until both its messages moved to the error destination,
    then stopped: what it wrote on stdout and stderr."""
    process = subprocess.Popen(
        [sys.executable, "-m", "mdb.commands.cli", "run", "tests.hostile.careless_app"],
        cwd=Path(__file__).parents[2], env={**os.environ, **env},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    seen, moved = b"", 0
    try:
        assert process.stderr is not None
        for line in process.stderr:
            seen += line
            moved += b"moved to" in line
            if moved == len(BODIES):
                break
    finally:
        process.send_signal(signal.SIGTERM)
        out, rest = process.communicate(timeout=60)
    assert process.returncode == 0, (seen + rest).decode()
    return (out + seen + rest).decode()


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_no_secret_of_a_handlers_exception_reaches_the_log(log_format: str) -> None:
    shown = run_until_moved(MDB_LOG_FORMAT=log_format, MDB_LOG_LEVEL="DEBUG")
    if log_format == "json":  # the text as a reader of the JSON has it
        shown = "\n".join(str(json.loads(line)) for line in shown.splitlines()
                          if line.startswith("{"))
    assert "failed (ConnectionError: cannot reach postgresql://shop:***@db" in shown
    assert "moved to queue:work.DLQ" in shown and "Traceback" in shown
    assert not leaked([shown])
