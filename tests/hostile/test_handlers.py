"""Hostile bodies and handlers that must not end a container: a body nested too deep for the
JSON parser, an exception that cannot be rendered or is huge, and a handler that raises
``CancelledError`` or ``SystemExit`` of its own (docs/security.md). Each fails its own delivery
only: the container stays ready, the next message is processed, and the hostile message ends
on its error destination, intact and explained, or is processed on a later delivery. ``mdb
run`` stops only when asked to, and exits non-zero when it stops otherwise."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, field_validator

from mdb import Redelivery, listener
from mdb.codec import MAX_TEXT
from mdb.delivery.decision import ERROR_TEXT_LIMIT
from mdb.errors import UNNAMED
from mdb.message import DELIVERY_COUNT, ERROR_MESSAGE, ERROR_TYPE, ID
from tests.contract.support import WAIT, Calls, read, running, settings_for, unique
from tests.hostile.test_policy import send, still_flowing

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
        [sys.executable, "-m", "mdb.cli", "send", "queue:deep", "--json", "--file", str(body)],
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
    assert max(len(r.getMessage()) for r in caplog.records) < MAX_TEXT + 1000
