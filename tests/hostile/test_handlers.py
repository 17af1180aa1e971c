"""Hostile bodies and handlers that must not end a container: a body nested too deep for the
JSON parser, an exception that cannot be rendered or is huge, and a handler that raises
``CancelledError`` or ``SystemExit`` of its own (docs/security.md). Each fails its own delivery
only: the container stays ready, the next message is processed, and the hostile message ends
on its error destination, intact and explained, or is processed on a later delivery. ``mdb
run`` stops only when asked to, and exits non-zero when it stops otherwise."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import BaseModel, field_validator

from mdb import Context, Redelivery, listener
from mdb.delivery.decision import FRAMES_LIMIT
from mdb.errors import UNNAMED
from mdb.messages.codec import MAX_TEXT
from mdb.messages.copies import ERROR_TEXT_LIMIT
from mdb.messages.headers import DELIVERY_COUNT, ERROR_MESSAGE, ERROR_TYPE, ID
from tests.harness.apps.in_process import WAIT, Calls, running, settings_for, unique
from tests.harness.servers.brokers import private_brokers
from tests.harness.traffic.messages import read, send, still_flowing

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
DEEP = b"[" * 100_000 + b"]" * 100_000  # valid JSON, too deep for Python's parser


# -- bodies the decoder cannot read -----------------------------------------------------------

class Order(BaseModel):
    sku: str

    @field_validator("sku")
    @classmethod
    def known(cls, sku: str) -> str:
        if sku == "lookup":
            raise LookupError("no such sku")  # not a ValueError: pydantic passes it on
        return sku


async def test_a_body_nested_too_deep_or_failing_a_validator_is_undecodable(
        broker_url: str) -> None:
    """``RecursionError`` escaped a ``dict`` or ``list`` decoder (a validator's own error any
    decoder), killing every slot of the container at once; on every restart again, until the
    message reached the error destination as in doubt. Now it goes there at once, as a body
    that does not decode, in a batch as alone."""
    dicts, lists, orders = (f"queue:{unique(name)}" for name in ("deep_dict", "deep_list",
                                                                "deep_order"))
    calls = Calls()

    @listener(dicts, redelivery=Redelivery(limit=3, delay=0))
    async def on_dict(body: dict[str, Any]) -> None:
        calls.add("body", "after" if body.get("after") else body)

    @listener(lists, max_messages_per_transaction=4, redelivery=Redelivery(limit=3, delay=0))
    async def on_list(body: list[int]) -> None:
        calls.add("list", body)

    @listener(orders, redelivery=Redelivery(limit=3, delay=0))
    async def on_order(order: Order) -> None:
        calls.add("order", order.sku)

    # A batch: the deep body between two good ones, all held by the slot's subscription at once.
    for body in ([1], DEEP, [2]):
        await send(broker_url, lists, body)
    async with running(settings_for(broker_url), on_dict, on_list, on_order) as container:
        deep = await send(broker_url, dicts, DEEP)
        await send(broker_url, orders, {"sku": "lookup"})
        [moved] = await read(broker_url, f"{dicts}.DLQ", 1)
        [moved_in_batch] = await read(broker_url, f"{lists}.DLQ", 1)
        [refused] = await read(broker_url, f"{orders}.DLQ", 1)
        await calls.wait(lambda c: len(c.of("list")) == 2)
        await send(broker_url, dicts, {"after": True})
        await calls.wait(lambda c: "after" in c.of("body"))
        assert container.health().ready
    assert moved.body == DEEP and moved.headers[ID] == deep
    for message in (moved, moved_in_batch):
        assert message.headers[ERROR_TYPE] == "mdb.DecodeError"
        assert message.headers[DELIVERY_COUNT] == "1"
        assert "RecursionError" in message.headers[ERROR_MESSAGE]
    assert refused.headers[ERROR_TYPE] == "mdb.DecodeError"
    assert "LookupError: no such sku" in refused.headers[ERROR_MESSAGE]
    assert calls.of("body") == ["after"] and calls.of("order") == []
    assert sorted(calls.of("list")) == [[1], [2]]  # type: ignore[type-var]


def test_mdb_send_refuses_a_json_body_nested_too_deep_in_one_line(tmp_path: Path) -> None:
    """``mdb send --json`` of such a body ended in a traceback."""
    body = tmp_path / "deep.json"
    body.write_bytes(DEEP)
    result = subprocess.run(
        [sys.executable, "-m", "mdb.commands.cli", "send", "queue:deep", "--json", "--file",
         str(body)],
        cwd=ROOT, env={**os.environ, "MDB_BROKERS__DEFAULT__URL": "memory://deep"},
        capture_output=True, text=True, timeout=WAIT)
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert line.startswith("mdb: cannot send: mdb send --json: ") and "too deep" in line


# -- exceptions that cannot be shown ------------------------------------------------------------

class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text")


class Nameless(type):
    @property
    def __module__(cls) -> str:  # type: ignore[override]  # found before type's own
        raise RuntimeError("no module")


class WeirdError(Exception, metaclass=Nameless):
    pass


async def test_an_exception_that_cannot_be_shown_or_is_huge_fails_only_its_delivery(
        broker_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """Rendering an exception whose ``__str__`` raised, or whose class has no name, ended the
    container; one with a 20 MB text wrote a 20 MB log line. Now each is shown as far as it
    can be, bounded alike in logs and error headers."""
    caplog.set_level(logging.INFO, logger="mdb")
    queue = f"queue:{unique('unprintable')}"
    calls = Calls()

    @listener(queue, redelivery=Redelivery(limit=0))
    async def handler(body: str) -> None:
        calls.add("body", body)
        if body == "unprintable":
            raise Unprintable()
        if body == "nameless":
            raise WeirdError("weird")
        if body == "huge":
            raise ValueError("x" * 20_000_000)

    async with running(settings_for(broker_url), handler) as container:
        for body in ("unprintable", "nameless", "huge"):
            await send(broker_url, queue, body)
        moved = {m.body: m for m in await read(broker_url, f"{queue}.DLQ", 3)}
        await still_flowing(broker_url, container, calls, queue)
    unprintable, nameless, huge = (moved[body] for body in (b"unprintable", b"nameless", b"huge"))
    assert unprintable.headers[ERROR_TYPE] == f"{__name__}.Unprintable"
    assert unprintable.headers[ERROR_MESSAGE] == f"<unprintable {__name__}.Unprintable>"
    assert nameless.headers[ERROR_TYPE] == UNNAMED
    assert nameless.headers[ERROR_MESSAGE] == "weird"
    assert huge.headers[ERROR_TYPE] == "ValueError"
    assert huge.headers[ERROR_MESSAGE].startswith("xxx")
    assert len(huge.headers[ERROR_MESSAGE].encode()) <= ERROR_TEXT_LIMIT
    assert "x" * 100 in caplog.text
    # A move to the error destination says the text, then the traceback (its frames, and the
    # text again as its last line, as Python prints one).
    assert max(len(r.getMessage()) for r in caplog.records) < 2 * MAX_TEXT + FRAMES_LIMIT + 1000


# -- handlers that raise BaseExceptions of their own --------------------------------------------

async def cancelled_task() -> None:
    """What a handler sees when a task it awaits is cancelled (a library's own timeout, say)."""
    task = asyncio.ensure_future(asyncio.sleep(WAIT))
    task.cancel()
    await task


async def test_a_handler_raising_cancelled_error_or_system_exit_fails_only_its_delivery(
        broker_url: str) -> None:
    """A handler's own ``CancelledError`` ended its slot (on the memory broker the whole
    container, returning as if stopped) and ``SystemExit`` the process; now each is a failed
    delivery under the redelivery policy, alone or in a batch."""
    queue, batched = f"queue:{unique('cancel')}", f"queue:{unique('cancel_batch')}"
    calls = Calls()

    @listener(queue, redelivery=Redelivery(limit=1, delay=0))
    async def handler(body: str, ctx: Context) -> None:
        calls.add("body", body)
        calls.add(body, ctx.delivery_count)
        if body == "cancel" and ctx.delivery_count == 1:
            await cancelled_task()

    @listener(batched, max_messages_per_transaction=4, redelivery=Redelivery(limit=1, delay=0))
    async def in_batch(body: str, ctx: Context) -> None:
        calls.add(f"batch {body}", ctx.delivery_count)
        if body == "cancel" and ctx.delivery_count == 1:
            await cancelled_task()

    @listener(f"{queue}_exit", redelivery=Redelivery(limit=0))
    def exits(body: str) -> None:  # a plain def: on a worker thread
        sys.exit(3)

    for body in ("a", "cancel", "b"):
        await send(broker_url, batched, body)
    async with running(settings_for(broker_url), handler, in_batch, exits) as container:
        await send(broker_url, queue, "cancel")
        await calls.wait(lambda c: c.of("cancel") == [1, 2])
        await send(broker_url, f"{queue}_exit", "exit")
        [exited] = await read(broker_url, f"{queue}_exit.DLQ", 1)
        await calls.wait(lambda c: c.of("batch cancel") == [1, 2] and len(c.of("batch b")) > 0)
        await still_flowing(broker_url, container, calls, queue)
    assert exited.body == b"exit"
    assert exited.headers[ERROR_TYPE] == "mdb.errors.HandlerInterrupted"
    assert "the handler raised SystemExit (3)" in exited.headers[ERROR_MESSAGE]


async def test_a_handler_still_running_past_the_grace_period_is_cancelled_not_failed(
        spans: InMemorySpanExporter) -> None:
    """The container's own cancellation of a handler is no failure of the delivery: nothing is
    re-sent or moved, nor reported as the handler's failure; the broker gets the message back,
    flagged, when the subscription closes."""
    url = f"memory://{unique('grace')}"
    queue = f"queue:{unique('grace')}"
    calls = Calls()

    @listener(queue, redelivery=Redelivery(limit=5, delay=0))
    async def handler(body: str, ctx: Context) -> None:
        calls.add("start", (ctx.delivery_count, ctx.redelivered))
        if not ctx.redelivered:
            await anyio.sleep_forever()

    async with running(settings_for(url, shutdown_grace_period=0.1), handler) as container:
        await send(url, queue, "slow")
        await calls.wait(lambda c: bool(c.of("start")))
    [stats] = [d.stats for d in container.deployed]
    assert (stats.redelivered, stats.to_error_destination, stats.processed) == (0, 0, 0)
    [stopped] = [s for s in spans.get_finished_spans() if s.name == f"process {queue}"]
    assert (stopped.attributes or {})["error.type"] == "asyncio.exceptions.CancelledError"
    async with running(settings_for(url), handler):
        await calls.wait(lambda c: len(c.of("start")) == 2)
    assert calls.of("start") == [(1, False), (2, True)]  # in doubt: counted once, flagged


# -- mdb run --------------------------------------------------------------------------------------

LISTENERS = (
    "import asyncio, sys\n"
    "from mdb import Redelivery, listener\n\n"
    "@listener('queue:hostile_handlers', redelivery=Redelivery(limit=0))\n"
    "async def handler(body: str) -> None:\n"
    "    if body == 'cancel':\n"
    "        task = asyncio.ensure_future(asyncio.sleep(60))\n"
    "        task.cancel()\n"
    "        await task\n"
    "    if body == 'exit':\n"
    "        sys.exit(3)\n"
)


@pytest.mark.activemq
def test_mdb_run_outlives_handlers_raising_cancelled_error_or_system_exit(
        tmp_path: Path) -> None:
    """``mdb run`` exited 0 ("stopped", as if asked to) on a handler's ``CancelledError``, so a
    supervisor restarting on failure did not restart it, and 3 ("broker unreachable") on
    ``sys.exit(3)``. Now both messages reach the error destination and it runs on."""
    (tmp_path / "hostile_handlers.py").write_text(LISTENERS)
    with private_brokers("activemq") as [broker]:
        env = {**os.environ, "MDB_BROKERS__DEFAULT__URL": str(broker.url)}
        stderr = tmp_path / "stderr"
        with stderr.open("w") as errors:
            process = subprocess.Popen(
                [sys.executable, "-m", "mdb.commands.cli", "run", "hostile_handlers"], cwd=tmp_path,
                env=env, stdout=subprocess.PIPE, stderr=errors, text=True)
        try:
            assert process.stdout is not None
            for line in process.stdout:
                if line.startswith("mdb: ready"):
                    break
            threading.Thread(target=process.stdout.read, daemon=True).start()

            async def exchange() -> list[Any]:
                for body in ("cancel", "exit"):
                    await send(str(broker.url), "queue:hostile_handlers", body)
                return await read(str(broker.url), "queue:hostile_handlers.DLQ", 2)

            moved = anyio.run(exchange)
            assert process.poll() is None
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=WAIT)
    assert sorted(m.body for m in moved) == [b"cancel", b"exit"]
    assert process.returncode == 0, stderr.read_text()
    # No traceback but those the log gives with each move to the error destination.
    text = stderr.read_text()
    assert text.count("Traceback (most recent call last)") == text.count(" moved to ") == 2


STRAY_CANCELLATION = (
    "import asyncio, sys\n"
    "from mdb.commands import cli\nfrom mdb.container import slots\n\n"
    "async def dies(self, slot):\n"
    "    raise asyncio.CancelledError()\n\n"
    "slots.Slots._consume = dies\n"
    "cli.main(['run', 'hostile_handlers'])\n"
)


def test_mdb_run_exits_non_zero_when_it_stops_unasked(tmp_path: Path) -> None:
    """A slot task ended by a stray ``CancelledError`` (here: every slot, patched to) makes
    anyio cancel the container's work, which then returned as from a requested stop: ``mdb
    run`` printed its ``stopped`` line and exited 0. A stop nobody asked for exits 1."""
    (tmp_path / "hostile_handlers.py").write_text(LISTENERS)
    result = subprocess.run(
        [sys.executable, "-c", STRAY_CANCELLATION], cwd=tmp_path,
        env={**os.environ, "MDB_BROKERS__DEFAULT__URL": "memory://stray"},
        capture_output=True, text=True, timeout=WAIT)
    assert result.returncode == 1, result.stderr
    assert "stopped without being asked to" in result.stderr
