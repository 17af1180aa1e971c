"""Hostile input the delivery policy must survive (docs/security.md, "Hostile input: delivery
counts, settings, handlers and bodies"), on the embedded
broker, ActiveMQ and RabbitMQ: a forged ``mdb_delivery_count`` and a bad body carrying a
secret. Each case checks that the container stays ready, that the next message still flows,
and that the hostile message is processed or sits intact on the error destination.

Settings and handler shapes that cannot work are refused before anything runs: see
tests/unit/test_listener.py and tests/unit/test_options.py."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import BaseModel

from mdb import Context, Redelivery, listener
from mdb.messages.headers import DELIVERY_COUNT, ERROR_MESSAGE, ERROR_TYPE, ID
from tests.harness.apps.in_process import Calls, running, settings_for, unique
from tests.harness.traffic.messages import read, send, still_flowing

pytestmark = pytest.mark.anyio

SECRET = "4111-1111-1111-1111"


async def test_a_forged_delivery_count_crashes_nothing_and_loses_nothing(broker_url: str,
                                                                         ) -> None:
    """A huge count (1030) must not overflow the backoff arithmetic and kill the container; a
    count that is not a number is a first delivery; a count past the limit is believed (the
    count is advisory: docs/security.md), so the message moves to the error destination
    intact after one run of the handler."""
    queue, errors = f"queue:{unique('forged')}", f"queue:{unique('forged_errors')}"
    calls = Calls()

    @listener(queue, error_destination=errors,
              redelivery=Redelivery(limit=10_000, delay=0.01, backoff=2.0, max_delay=0.01))
    async def handler(body: str, ctx: Context) -> None:
        calls.add("body", body)
        calls.add(body, ctx.delivery_count)
        if body in ("huge", "past") and ctx.delivery_count in (1030, 99999):
            raise RuntimeError("fails once")

    async with running(settings_for(broker_url), handler) as container:
        await send(broker_url, queue, "huge", mdb_delivery_count="1030")
        await calls.wait(lambda c: c.of("huge") == [1030, 1031])
        for junk in ("abc", "-5", "3.5", " 2 "):
            await send(broker_url, queue, f"junk{junk}", mdb_delivery_count=junk)
        await calls.wait(lambda c: all(c.of(f"junk{j}") for j in ("abc", "-5", "3.5", " 2 ")))
        assert [calls.of(f"junk{j}") for j in ("abc", "-5", "3.5", " 2 ")] == \
            [[1], [1], [1], [2]]
        sent = await send(broker_url, queue, "past", mdb_delivery_count="99999")
        [moved] = await read(broker_url, errors, 1)
        assert calls.of("past") == [99999]
        assert moved.body == b"past" and moved.headers[ID] == sent
        assert moved.headers[DELIVERY_COUNT] == "99999"
        await still_flowing(broker_url, container, calls, queue)


class Payment(BaseModel):
    card: int


async def test_a_bad_body_never_shows_in_logs_spans_or_error_headers(
    broker_url: str, spans: InMemorySpanExporter, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """pydantic's ``input_value=...`` would carry the body into the span status, the WARNING
    log line and ``mdb_error_message``, and stomp.py's DEBUG lines show every frame's body:
    none of them may show it. The body itself stays intact on the error destination."""
    monkeypatch.delenv("MDB_TRACE_BODIES", raising=False)
    caplog.set_level(logging.DEBUG, logger="mdb")
    caplog.set_level(logging.DEBUG, logger="stomp.py")  # it logs every frame at DEBUG
    queue, errors = f"queue:{unique('secret')}", f"queue:{unique('secret_errors')}"
    calls = Calls()

    @listener(queue, error_destination=errors, redelivery=Redelivery(limit=1, delay=0))
    async def handler(payment: Payment, ctx: Context) -> None:
        calls.add("body", "after" if payment.card == 0 else payment.card)

    async with running(settings_for(broker_url), handler) as container:
        bad = f'{{"card": "{SECRET}"}}'
        await send(broker_url, queue, bad)
        [moved] = await read(broker_url, errors, 1)
        assert moved.body == bad.encode()
        assert moved.headers[ERROR_TYPE] == "mdb.DecodeError"
        assert "card" in moved.headers[ERROR_MESSAGE]
        assert not [k for k, v in moved.headers.items() if SECRET in v]
        assert container.health().ready
        await send(broker_url, queue, {"card": 0})
        await calls.wait(lambda c: "after" in c.of("body"))
    assert "card" in caplog.text and SECRET not in caplog.text
    process = [s for s in spans.get_finished_spans() if s.name == f"process {queue}"]
    assert process and any(s.status.description for s in process)
    for span in process:
        shown = [span.status.description or "", *map(str, (span.attributes or {}).values()),
                 *(str(e.attributes) for e in span.events)]
        assert not [text for text in shown if SECRET in text]


def plain_wrapper(handler: Callable[..., Any]) -> Callable[..., Any]:
    """A plain decorator around an ``async def``: to mdb the result is a plain ``def``."""

    @functools.wraps(handler)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return handler(*args, **kwargs)

    return wrapper


async def test_a_handler_that_returns_a_coroutine_unrun_is_not_acknowledged_as_processed(
) -> None:
    """A handler shape the decorator cannot see: a plain ``def`` wrapping an ``async def``
    returns a coroutine that would be dropped and the message settled as processed. It fails
    like a raising handler instead, so the message ends on the error destination, intact and
    explained."""
    url = f"memory://{unique('wrapped')}"
    queue = f"queue:{unique('wrapped')}"
    ran = Calls()

    @listener(queue, redelivery=Redelivery(limit=0))
    @plain_wrapper
    async def handler(body: str) -> None:
        ran.add("body", body)

    async with running(settings_for(url), handler) as container:
        await send(url, queue, "work")
        [moved] = await read(url, f"{queue}.DLQ", 1)
        assert container.health().ready
    assert moved.body == b"work" and ran.of("body") == []
    assert moved.headers[ERROR_TYPE] == "mdb.errors.ListenerDefinitionError"
    assert "returned coroutine" in moved.headers[ERROR_MESSAGE]
