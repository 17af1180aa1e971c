"""Prefetch (the listener's ``prefetch``): a pool slot holds several unsettled messages, and
the delivery contract holds for each of them.

The messages are sent before the container starts: each slot subscribes in turn and the broker
fills its prefetch at once, so which messages a slot holds is known.
"""

from __future__ import annotations

import anyio
import pytest

from mdb import Context, Producer, Redelivery, listener
from mdb.container.slots import Slot
from mdb.messages.headers import DELIVERY_COUNT, ERROR_TYPE
from tests.harness.apps.in_process import Calls, dispatched, running, settings_for, unique
from tests.harness.traffic.messages import assert_drained, read, send_all

pytestmark = pytest.mark.anyio


async def test_a_slot_holds_its_prefetch_and_handles_it_in_order(broker_url: str) -> None:
    queue = f"queue:{unique('prefetch')}"
    calls = Calls()
    release = anyio.Event()

    @listener(queue, prefetch=3)
    async def handler(body: str, ctx: Context) -> None:
        calls.add("seen", (body, ctx.redelivered))
        await release.wait()

    await send_all(broker_url, queue, [f"m{n}" for n in range(5)])
    async with running(settings_for(broker_url), handler) as container:
        await calls.wait(lambda c: bool(c.of("seen")))
        # While the slot's handler waits on m0, the slot holds m1 and m2 too: a competing
        # consumer gets only what is left.
        assert [d.body for d in await read(broker_url, queue, 2)] == [b"m3", b"m4"]
        release.set()
        await calls.wait(lambda c: len(c.of("seen")) == 3)
    assert calls.of("seen") == [("m0", False), ("m1", False), ("m2", False)]
    assert container.deployed[0].stats.processed == 3
    await assert_drained(broker_url, queue)


async def test_a_failing_message_among_prefetched_ones_fails_alone(broker_url: str) -> None:
    queue, errors = f"queue:{unique('prefetch')}", f"queue:{unique('errors')}"
    calls = Calls()

    @listener(queue, prefetch=4, error_destination=errors,
              redelivery=Redelivery(limit=1, delay=0))
    async def handler(body: str, ctx: Context) -> None:
        calls.add("seen", (body, ctx.redelivered, ctx.delivery_count))
        if body == "bad":
            raise ValueError("bad!")

    await send_all(broker_url, queue, ["a", "bad", "c", "d"])
    async with running(settings_for(broker_url), handler) as container:
        [moved] = await read(broker_url, errors, 1)
    # Each delivery is settled before the next: bad's copy goes behind the ones prefetched
    # after it, which are handled once, unflagged; then bad fails again and moves.
    assert calls.of("seen") == [
        ("a", False, 1), ("bad", False, 1), ("c", False, 1), ("d", False, 1), ("bad", True, 2),
    ]
    assert moved.body == b"bad"
    assert moved.headers[ERROR_TYPE] == "ValueError" and moved.headers[DELIVERY_COUNT] == "2"
    stats = container.deployed[0].stats
    assert (stats.processed, stats.redelivered, stats.to_error_destination) == (3, 1, 1)
    await assert_drained(broker_url, queue)


async def test_a_topic_selector_settles_unselected_messages_among_prefetched_ones(
    broker_url: str,
) -> None:
    # The container settles a message its selector does not select (mdb.routing.planning) in its
    # turn: with cumulative acks (ActiveMQ) acking one ahead of its turn would settle the
    # messages prefetched before it.
    topic = f"topic:{unique('paint')}"
    calls = Calls()
    release = anyio.Event()

    @listener(topic, selector="colour = 'red'", prefetch=4)
    async def reds(body: str, ctx: Context) -> None:
        calls.add("red", (body, ctx.redelivered))
        await release.wait()

    async with running(settings_for(broker_url), reds) as container, \
            Producer(settings_for(broker_url)) as producer:
        await producer.send(topic, "r1", {"colour": "red"})
        await calls.wait(lambda c: bool(c.of("red")))
        for body, colour in [("b1", "blue"), ("r2", "red"), ("b2", "blue"), ("r3", "red")]:
            await producer.send(topic, body, {"colour": colour})
        release.set()
        await calls.wait(lambda c: len(c.of("red")) == 3)
    assert calls.of("red") == [("r1", False), ("r2", False), ("r3", False)]
    stats = container.deployed[0].stats
    assert (stats.processed, stats.filtered, stats.rolled_back, stats.redelivered) == (3, 2, 0, 0)


async def test_a_stop_hands_back_every_prefetched_message_flagged(broker_url: str) -> None:
    queue = f"queue:{unique('prefetch')}"
    calls = Calls()
    releases = {f"m{n}": anyio.Event() for n in range(6)}

    @listener(queue, pool=2, prefetch=3)
    async def handler(body: str, ctx: Context) -> None:
        calls.add("start", body)
        if not ctx.redelivered:
            await releases[body].wait()
        calls.add("done", (body, ctx.redelivered, ctx.delivery_count))

    await send_all(broker_url, queue, list(releases))
    settings = settings_for(broker_url, shutdown_grace_period=30)
    async with running(settings, handler) as container:
        # Each slot holds three messages and handles its first. The broker may still be
        # dispatching the last ones as the handlers start: one not yet dispatched would come
        # back unflagged, rightly.
        await calls.wait(lambda c: len(c.of("start")) == 2)
        first, second = calls.of("start")
        slots = list(container.slots.running)
        await dispatched(container, len(releases))
        container.request_stop()
        releases[str(second)].set()
        # One slot ends holding two prefetched messages, while the other's handler still runs
        # on the same connection: handing them back must not cost that handler its commit.
        async with anyio.create_task_group() as one_ended:
            async def ended(slot: Slot) -> None:
                await slot.ended.wait()
                one_ended.cancel_scope.cancel()

            for slot in slots:
                one_ended.start_soon(ended, slot)
        releases[str(first)].set()
    assert sorted(map(str, calls.of("done"))) == sorted(
        map(str, [(first, False, 1), (second, False, 1)]))
    # A second process of the app gets the four prefetched ones, flagged: in doubt, each is
    # re-sent with its count one higher and then handled.
    again = Calls()

    @listener(queue, pool=2, prefetch=3, name="handler")
    async def takes_over(body: str, ctx: Context) -> None:
        again.add("done", (body, ctx.redelivered, ctx.delivery_count))

    async with running(settings_for(broker_url, app=settings.app, server="s2"), takes_over):
        await again.wait(lambda c: len(c.of("done")) == 4)
    rest = sorted(set(releases) - {str(first), str(second)})
    assert sorted(map(str, again.of("done"))) == [str((body, True, 2)) for body in rest]
    await assert_drained(broker_url, queue)
