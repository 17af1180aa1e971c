"""The delivery contract (docs/architecture.md, "Delivery contract"), once, on every broker:
memory, ActiveMQ and RabbitMQ."""

from __future__ import annotations

import itertools
import time

import anyio
import anyio.from_thread
import pytest
from pydantic import BaseModel

from mdb import Container, Context, Producer, Redelivery, SubscriptionFailed, listener
from mdb.messages.headers import (
    DELIVERY_COUNT,
    ERROR_LISTENER,
    ERROR_MESSAGE,
    ERROR_TYPE,
    ID,
    MAYBE_REPEAT,
    ORIGINAL_DESTINATION,
)
from tests.harness.apps.in_process import Calls, running, settings_for, specs, unique
from tests.harness.traffic.messages import read, send_all

pytestmark = pytest.mark.anyio


async def test_each_message_is_processed_once(broker_url: str) -> None:
    queue = f"queue:{unique('once')}"
    calls = Calls()

    @listener(queue, pool=4)
    async def handler(body: str, ctx: Context) -> None:
        calls.add("seen", (ctx.id, body, ctx.redelivered, ctx.delivery_count))

    sent = await send_all(broker_url, queue, [f"m{n}" for n in range(40)])
    async with running(settings_for(broker_url), handler):
        await calls.wait(lambda c: len(c.of("seen")) >= 40)
    seen = calls.of("seen")
    assert sorted(s[0] for s in seen) == sorted(sent)  # type: ignore[index]
    assert all(s[2:] == (False, 1) for s in seen)  # type: ignore[index]


async def test_plain_def_handlers_run_and_send(broker_url: str) -> None:
    queue, out = f"queue:{unique('sync')}", f"queue:{unique('out')}"

    @listener(queue, pool=2)
    def handler(body: dict[str, int], ctx: Context) -> None:
        ctx.send(out, {"n": body["n"] * 2})

    await send_all(broker_url, queue, [{"n": 1}, {"n": 2}])
    async with running(settings_for(broker_url), handler):
        results = await read(broker_url, out, 2)
    assert sorted(r.body for r in results) == [b'{"n":2}', b'{"n":4}']


async def test_a_failing_handler_is_redelivered_flagged_counted_and_delayed(
    broker_url: str,
) -> None:
    queue = f"queue:{unique('flaky')}"
    calls = Calls()
    policy = Redelivery(limit=3, delay=0.2, backoff=2.0)

    @listener(queue, redelivery=policy)
    async def handler(body: str, ctx: Context) -> None:
        calls.add("try", (ctx.id, ctx.redelivered, ctx.delivery_count, time.monotonic()))
        if ctx.delivery_count < 3:
            raise RuntimeError(f"attempt {ctx.delivery_count} fails")
        calls.add("done", ctx.id)

    [sent] = await send_all(broker_url, queue, ["flaky"])
    async with running(settings_for(broker_url), handler):
        await calls.wait(lambda c: bool(c.of("done")))
    tries = calls.of("try")
    assert [t[:3] for t in tries] == [(sent, False, 1), (sent, True, 2), (sent, True, 3)]  # type: ignore[index]
    gaps = [b[3] - a[3] for a, b in itertools.pairwise(tries)]  # type: ignore[index]
    assert gaps[0] >= policy.delay_before(1) and gaps[1] >= policy.delay_before(2)


async def test_past_the_limit_the_message_moves_to_the_error_destination_with_the_failure(
    broker_url: str,
) -> None:
    queue, errors, side = (f"queue:{unique(p)}" for p in ("poison", "errors", "side"))
    calls = Calls()

    @listener(queue, redelivery=Redelivery(limit=2, delay=0), error_destination=errors)
    async def handler(body: str, ctx: Context) -> None:
        await ctx.send(side, "must never be delivered")
        calls.add("try", ctx.delivery_count)
        raise ValueError("poison!")

    [sent] = await send_all(broker_url, queue, ["poison"])
    async with running(settings_for(broker_url), handler):
        [moved] = await read(broker_url, errors, 1)
        # A marker sent after the failures must be the first thing on the side queue: the
        # failed attempts' sends were discarded with their transactions.
        await send_all(broker_url, side, ["marker"])
        [first] = await read(broker_url, side, 1)
    assert calls.of("try") == [1, 2, 3]
    assert moved.body == b"poison"
    h = moved.headers
    assert h[ID] == sent
    assert h[ERROR_TYPE] == "ValueError" and h[ERROR_MESSAGE] == "poison!"
    assert h[ERROR_LISTENER] == "handler"
    assert h[ORIGINAL_DESTINATION] == queue and h[DELIVERY_COUNT] == "3"
    assert first.body == b"marker"


class Order(BaseModel):
    id: str


async def test_an_undecodable_body_goes_to_the_error_destination_without_retries(
    broker_url: str,
) -> None:
    queue = f"queue:{unique('bad')}"
    calls = Calls()

    @listener(queue, redelivery=Redelivery(limit=5, delay=0))
    async def handler(order: Order) -> None:
        calls.add("called", order)

    await send_all(broker_url, queue, ["{not json"])
    async with running(settings_for(broker_url), handler):
        [moved] = await read(broker_url, f"{queue}.DLQ", 1)
    assert moved.headers[ERROR_TYPE] == "mdb.DecodeError"
    assert moved.headers[DELIVERY_COUNT] == "1"
    assert calls.of("called") == []


async def test_a_send_made_again_by_a_repeated_processing_keeps_its_id(broker_url: str) -> None:
    # A non-transacted handler's sends go out at once: failing after them, it has sent, and
    # its next processing sends again. Both copies carry one id; the second says it may be a
    # repeat (docs/concepts.md, rule 6).
    queue, out = f"queue:{unique('again')}", f"queue:{unique('onward')}"
    calls = Calls()

    @listener(queue, transacted=False, redelivery=Redelivery(limit=2, delay=0))
    async def handler(body: str, ctx: Context) -> None:
        await ctx.send(out, f"{body} onward")
        calls.add("sent", ctx.delivery_count)
        if ctx.delivery_count == 1:
            raise RuntimeError("failing after the send")

    await send_all(broker_url, queue, ["m"])
    async with running(settings_for(broker_url), handler):
        first, again = await read(broker_url, out, 2)
    assert calls.of("sent") == [1, 2]
    assert first.headers[ID] == again.headers[ID]
    assert MAYBE_REPEAT not in first.headers and again.headers[MAYBE_REPEAT] == "true"


async def test_graceful_shutdown_hands_in_flight_work_to_another_process(
    broker_url: str,
) -> None:
    queue = f"queue:{unique('grace')}"
    calls = Calls()
    release = anyio.Event()

    @listener(queue, pool=2)
    async def handler(body: str, ctx: Context) -> None:
        calls.add("start", (ctx.id, ctx.redelivered))
        if body == "slow" and not ctx.redelivered:
            await release.wait()  # never set: this one outlives the grace period
        calls.add("done", (body, ctx.redelivered))

    settings = settings_for(broker_url, shutdown_grace_period=0.3)
    [slow] = await send_all(broker_url, queue, ["slow"])
    async with running(settings, handler):
        await calls.wait(lambda c: bool(c.of("start")))
    # The first container gave up on "slow"; a second one of the same app gets it, flagged.
    async with running(settings_for(broker_url, app=settings.app, server="s2"), handler):
        await calls.wait(lambda c: bool(c.of("done")))
    assert calls.of("done") == [("slow", True)]
    assert [s for s in calls.of("start")] == [(slow, False), (slow, True)]


async def test_a_handler_that_finishes_within_the_grace_period_is_committed(
    broker_url: str,
) -> None:
    queue = f"queue:{unique('finish')}"
    calls = Calls()
    release = anyio.Event()

    @listener(queue)
    async def handler(body: str, ctx: Context) -> None:
        calls.add("start", ctx.id)
        await release.wait()
        calls.add("done", ctx.id)

    await send_all(broker_url, queue, ["one", "two"])
    async with running(settings_for(broker_url, shutdown_grace_period=30), handler) as c:
        await calls.wait(lambda c: bool(c.of("start")))
        c.request_stop()
        release.set()
    # Stopped after finishing the first; the second was not processed and is still queued.
    assert len(calls.of("done")) == 1
    [left] = await read(broker_url, queue, 1)
    assert left.body == b"two"


async def test_a_selector_filters_messages_or_is_refused_where_the_broker_has_none(
    broker_url: str,
) -> None:
    queue = f"queue:{unique('selected')}"
    calls = Calls()

    @listener(queue, selector="colour = 'red'")
    async def reds(body: str, ctx: Context) -> None:
        calls.add("red", body)

    if broker_url.startswith("stomp+rabbitmq:"):
        # RabbitMQ's STOMP plugin ignores selectors: on a queue the container refuses to start
        # rather than hand the listener every message (topics: test_topics).
        with pytest.raises(SubscriptionFailed, match="does not support selectors"):
            await Container(settings_for(broker_url), specs(reds)).run()
        return
    async with Producer(settings_for(broker_url)) as producer:
        await producer.send(queue, "blue", {"colour": "blue"})
        await producer.send(queue, "red", {"colour": "red"})
    async with running(settings_for(broker_url), reds):
        await calls.wait(lambda c: bool(c.of("red")))
    assert calls.of("red") == ["red"]
    [left] = await read(broker_url, queue, 1)
    assert left.body == b"blue"
