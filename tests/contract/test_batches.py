"""Batched transactions (``max_messages_per_transaction``): the delivery contract per message.

A slot's batch is what its subscription already holds when the slot takes its next message.
Where a test needs one batch to hold given messages, the slot is kept busy with a gate message
while they are sent; a round trip through the broker after sending gives it time to push them
(ActiveMQ pushes messages one frame at a time: an idle slot would take the first one alone).
"""

from __future__ import annotations

import anyio
import pytest

from mdb import Container, Context, ListenerDefinitionError, Redelivery, listener
from mdb.messages.headers import DELIVERY_COUNT, ERROR_TYPE
from tests.harness.apps.in_process import Calls, dispatched, running, settings_for, unique
from tests.harness.traffic.messages import assert_drained, read, send_all

pytestmark = pytest.mark.anyio


async def send_as_one_batch(container: Container, url: str, queue: str, bodies: list[object],
                            calls: Calls, release: anyio.Event) -> None:
    """With the listener's only slot blocked on "gate" until ``release``, send ``bodies`` so
    that its next batch holds them all."""
    await calls.wait(lambda c: bool(c.of("gate")))
    await send_all(url, queue, bodies)
    await dispatched(container, 1 + len(bodies))
    release.set()


async def test_a_batch_listener_processes_every_message_once(broker_url: str) -> None:
    queue = f"queue:{unique('batch')}"
    calls = Calls()

    @listener(queue, pool=2, max_messages_per_transaction=10)
    async def handler(body: str, ctx: Context) -> None:
        calls.add("seen", (ctx.id, ctx.redelivered, ctx.delivery_count))

    sent = await send_all(broker_url, queue, [f"m{n}" for n in range(45)])
    async with running(settings_for(broker_url), handler) as container:
        await calls.wait(lambda c: len(c.of("seen")) >= 45)
    seen = calls.of("seen")
    assert sorted(s[0] for s in seen) == sorted(sent)  # type: ignore[index]
    assert all(s[1:] == (False, 1) for s in seen)  # type: ignore[index]
    assert container.deployed[0].stats.processed == 45
    await assert_drained(broker_url, queue)


async def test_the_sends_of_a_successful_batch_are_delivered_with_it(broker_url: str) -> None:
    queue, out = f"queue:{unique('batch')}", f"queue:{unique('out')}"

    @listener(queue, max_messages_per_transaction=8)
    async def handler(body: int, ctx: Context) -> None:
        await ctx.send(out, body * 10)

    await send_all(broker_url, queue, list(range(20)))
    async with running(settings_for(broker_url), handler) as container:
        results = await read(broker_url, out, 20)
    assert sorted(int(r.body) for r in results) == [n * 10 for n in range(20)]
    assert container.deployed[0].stats.processed == 20
    await assert_drained(broker_url, queue)
    await assert_drained(broker_url, out)


async def test_one_failing_message_fails_alone_and_the_others_are_processed_again_flagged(
    broker_url: str,
) -> None:
    queue, out, errors = (f"queue:{unique(p)}" for p in ("batch", "out", "errors"))
    calls = Calls()
    release = anyio.Event()

    @listener(queue, max_messages_per_transaction=10, error_destination=errors,
              redelivery=Redelivery(limit=1, delay=0))
    async def handler(body: str, ctx: Context) -> None:
        if body == "gate":
            calls.add("gate", body)
            await release.wait()
            return
        calls.add("seen", (body, ctx.redelivered, ctx.delivery_count))
        await ctx.send(out, f"{body}/{ctx.delivery_count}")
        if body == "bad":
            raise ValueError("bad!")

    await send_all(broker_url, queue, ["gate"])
    async with running(settings_for(broker_url), handler) as container:
        await send_as_one_batch(container, broker_url, queue, ["a", "b", "bad", "c", "d"],
                                calls, release)
        [moved] = await read(broker_url, errors, 1)
        results = await read(broker_url, out, 4)
    # The batch ran a, b and failed on bad; then, one at a time: a and b again (flagged, their
    # first run was rolled back), bad's failure path (redelivered), c and d as fresh messages;
    # then bad's redelivery failed and moved it to the error destination.
    assert calls.of("seen") == [
        ("a", False, 1), ("b", False, 1), ("bad", False, 1),
        ("a", True, 2), ("b", True, 2), ("c", False, 1), ("d", False, 1),
        ("bad", True, 2),
    ]
    # Only the sends of committed processing were delivered: one per innocent message.
    assert sorted(r.body for r in results) == [b"a/2", b"b/2", b"c/1", b"d/1"]
    assert moved.body == b"bad"
    assert moved.headers[ERROR_TYPE] == "ValueError" and moved.headers[DELIVERY_COUNT] == "2"
    stats = container.deployed[0].stats
    assert (stats.processed, stats.redelivered, stats.to_error_destination) == (5, 1, 1)
    await assert_drained(broker_url, out)
    await assert_drained(broker_url, queue)


async def test_an_undecodable_body_in_a_batch_goes_alone_to_the_error_destination(
    broker_url: str,
) -> None:
    queue, out = f"queue:{unique('batch')}", f"queue:{unique('out')}"
    calls = Calls()
    release = anyio.Event()

    @listener(queue, max_messages_per_transaction=10)
    async def handler(body: dict[str, int], ctx: Context) -> None:
        if "gate" in body:
            calls.add("gate", body)
            await release.wait()
            return
        calls.add("seen", (body["n"], ctx.redelivered))
        await ctx.send(out, body)

    await send_all(broker_url, queue, [{"gate": 1}])
    async with running(settings_for(broker_url), handler) as container:
        await send_as_one_batch(container, broker_url, queue,
                                [{"n": 1}, {"n": 2}, "{not json", {"n": 3}], calls, release)
        [moved] = await read(broker_url, f"{queue}.DLQ", 1)
        results = await read(broker_url, out, 3)
    # The body is decoded before the handler runs: nothing is processed twice.
    assert calls.of("seen") == [(1, False), (2, False), (3, False)]
    assert moved.headers[ERROR_TYPE] == "mdb.DecodeError"
    assert sorted(r.body for r in results) == [b'{"n":1}', b'{"n":2}', b'{"n":3}']
    await assert_drained(broker_url, out)


async def test_a_stop_in_the_middle_of_a_batch_commits_what_was_processed(
    broker_url: str,
) -> None:
    queue, out = f"queue:{unique('batch')}", f"queue:{unique('out')}"
    calls = Calls()
    release, finish = anyio.Event(), anyio.Event()

    @listener(queue, max_messages_per_transaction=10)
    async def handler(body: str, ctx: Context) -> None:
        calls.add(body, ctx.redelivered)
        if body == "gate":
            await release.wait()
        if body == "one":
            await finish.wait()
        await ctx.send(out, body)
        calls.add("done", body)

    await send_all(broker_url, queue, ["gate"])
    settings = settings_for(broker_url, shutdown_grace_period=30)
    async with running(settings, handler) as container:
        await send_as_one_batch(container, broker_url, queue, ["one", "two", "three"], calls,
                                release)
        await calls.wait(lambda c: bool(c.of("one")))
        container.request_stop()
        finish.set()
    # The batch stopped after "one": its work was committed, the rest was never processed.
    assert calls.of("done") == ["gate", "one"]
    assert sorted(r.body for r in await read(broker_url, out, 2)) == [b"gate", b"one"]
    assert [r.body for r in await read(broker_url, queue, 2)] == [b"two", b"three"]
    await assert_drained(broker_url, queue)


@pytest.mark.parametrize("value", [0, 1001])
def test_the_batch_size_is_validated(value: int) -> None:
    with pytest.raises(ListenerDefinitionError, match="max_messages_per_transaction"):
        listener("queue:orders", max_messages_per_transaction=value)
