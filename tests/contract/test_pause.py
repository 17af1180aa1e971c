"""Pausing a listener (``Container.pause``, ``Container.resume``) on every broker: what its
handlers run finishes and settles, it takes nothing new, what its slots held goes back to the
broker (or, on RabbitMQ, stays held unbegun) and, resumed, it takes every message once
(docs/health.md, "Pause and resume")."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import cast

import anyio
import pytest

from mdb import Context, UnknownListener, listener
from mdb.container.container import Container
from mdb.observability.health import ListenerHealth
from mdb.routing.links import adapter
from tests.harness.apps.in_process import Calls, memory_broker, running, settings_for, unique, until
from tests.harness.traffic.messages import assert_drained, send_all

pytestmark = pytest.mark.anyio


def health_of(container: Container, name: str) -> ListenerHealth:
    [found] = [lh for lh in container.health().listeners if lh.name == name]
    return found


def keeps_subscriptions(url: str) -> bool:
    """Whether a paused slot keeps its subscription there, holding what it was pushed."""
    settings = settings_for(url)
    return adapter("default", settings.brokers["default"], "probe").capabilities \
        .closing_keeps_unsettled


def clock_listener(clock: str, calls: Calls) -> Callable[[str], Awaitable[None]]:
    """The listener ``ticks`` of ``clock``: what it handled, under ``"tick"`` in ``calls``."""

    @listener(clock)
    async def ticks(body: str) -> None:
        calls.add("tick", body)

    return ticks


async def tick(url: str, clock: str, calls: Calls) -> None:
    """Send a tick to ``clock`` and wait until ``ticks`` handled it: a paused listener then had
    every chance to take what was sent before it."""
    await send_all(url, clock, ["tick"])
    await calls.wait(lambda c: c.of("tick") == ["tick"])


async def test_a_paused_listener_finishes_what_it_runs_takes_nothing_new_then_takes_all_once(
        broker_url: str) -> None:
    queue, clock = f"queue:{unique('paused')}", f"queue:{unique('clock')}"
    calls = Calls()
    gate = anyio.Event()

    @listener(queue, pool=2, prefetch=2)
    async def orders(body: str, ctx: Context) -> None:
        calls.add("seen", (body, ctx.redelivered, ctx.delivery_count))
        await gate.wait()

    ticks = clock_listener(clock, calls)

    await send_all(broker_url, queue, [f"m{n}" for n in range(8)])
    settings = settings_for(broker_url)
    async with running(settings, orders, ticks) as container:
        await calls.wait(lambda c: len(c.of("seen")) == 2)  # each slot runs one
        container.pause("orders")
        paused = health_of(container, "orders")
        assert paused.paused and paused.in_flight == 2
        gate.set()
        await until(lambda: health_of(container, "orders").in_flight == 0)
        await send_all(broker_url, queue, [f"n{n}" for n in range(4)])
        # The clock's message was sent after those: once it is handled, the paused listener
        # had every chance to take them.
        await tick(broker_url, clock, calls)
        assert len(calls.of("seen")) == 2
        health = container.health()
        assert health.ready, str(health.unready())  # paused is not unready
        container.resume("orders")
        await calls.wait(lambda c: len(c.of("seen")) >= 12)
    seen = [cast(tuple[str, bool, int], call) for call in calls.of("seen")]
    assert sorted(body for body, _, _ in seen) == sorted(
        [f"m{n}" for n in range(8)] + [f"n{n}" for n in range(4)])
    if keeps_subscriptions(broker_url):  # held unbegun, then taken in their slot's turn
        assert not any(flag for _, flag, _ in seen)
    else:  # handed back, they return flagged: in doubt, re-sent once, then run
        assert all(count == 2 for _, flag, count in seen if flag)
    stats = container.deployed[0].stats
    assert stats.processed == 12 and stats.to_error_destination == 0
    await assert_drained(broker_url, queue)


async def test_a_listener_configured_paused_subscribes_to_nothing_until_resumed(
        broker_url: str) -> None:
    queue, clock = f"queue:{unique('paused')}", f"queue:{unique('clock')}"
    calls = Calls()

    @listener(queue)
    async def orders(body: str) -> None:
        calls.add("seen", body)

    ticks = clock_listener(clock, calls)

    settings = settings_for(broker_url, listeners={"orders": {"paused": True}})
    async with running(settings, orders, ticks) as container:
        await send_all(broker_url, queue, ["a", "b"])
        await tick(broker_url, clock, calls)
        assert calls.of("seen") == [] and health_of(container, "orders").subscribed == 0
        assert container.health().ready
        container.resume("orders")
        await calls.wait(lambda c: sorted(map(str, c.of("seen"))) == ["a", "b"])
    await assert_drained(broker_url, queue)


async def test_pausing_a_listener_it_does_not_run_names_those_it_runs() -> None:
    url, _ = memory_broker("pause")

    @listener(f"queue:{unique('q')}")
    async def orders(body: str) -> None: ...

    async with running(settings_for(url), orders) as container:
        with pytest.raises(UnknownListener, match=r"no listener 'order'.*its listeners: orders"):
            container.pause("order")
        with pytest.raises(UnknownListener):
            container.resume("order")


async def test_a_pause_survives_a_lost_connection_and_the_queue_grows() -> None:
    url, state = memory_broker("pause")
    queue, clock = f"queue:{unique('paused')}", f"queue:{unique('clock')}"
    calls = Calls()

    @listener(queue, pool=2)
    async def orders(body: str) -> None:
        calls.add("seen", body)

    ticks = clock_listener(clock, calls)

    async with running(settings_for(url), orders, ticks) as container:
        container.pause("orders")
        await until(lambda: health_of(container, "orders").subscribed == 0)
        state.drop_connections()
        await send_all(url, queue, [f"m{n}" for n in range(5)])
        await tick(url, clock, calls)  # handled once the clock's slot reconnected
        assert state.queue_depth(queue) == 5 and calls.of("seen") == []
        assert health_of(container, "orders").subscribed == 0
        container.resume("orders")
        await calls.wait(lambda c: len(c.of("seen")) == 5)
        assert state.queue_depth(queue) == 0
    assert sorted(map(str, calls.of("seen"))) == [f"m{n}" for n in range(5)]


async def test_a_durable_topic_subscription_keeps_what_is_published_while_paused(
        broker_url: str) -> None:
    topic, clock = f"topic:{unique('paused')}", f"queue:{unique('clock')}"
    calls = Calls()

    @listener(topic)
    async def prices(body: str) -> None:
        calls.add("seen", body)

    ticks = clock_listener(clock, calls)

    async with running(settings_for(broker_url), prices, ticks) as container:
        await send_all(broker_url, topic, ["before"])
        await calls.wait(lambda c: c.of("seen") == ["before"])
        container.pause("prices")
        await until(lambda: health_of(container, "prices").in_flight == 0)
        await send_all(broker_url, topic, ["p1", "p2", "p3"])
        await tick(broker_url, clock, calls)
        assert calls.of("seen") == ["before"]
        container.resume("prices")
        await calls.wait(lambda c: len(c.of("seen")) == 4)
    assert sorted(map(str, calls.of("seen"))) == ["before", "p1", "p2", "p3"]


def has_seen(count: int, calls: Calls) -> bool:
    return len(calls.of("seen")) == count


async def test_a_resume_while_a_slot_still_closes_its_paused_subscription_takes_messages_again(
) -> None:
    # The resume may come while the paused slot waits for its subscription's close; the slot
    # must not then wait for a resume that already came.
    url, _ = memory_broker("resume")
    queue = f"queue:{unique('resumed')}"
    calls = Calls()

    @listener(queue)
    async def orders(body: str) -> None:
        calls.add("seen", body)

    async with running(settings_for(url), orders) as container:
        for turns in range(6):
            container.pause("orders")
            for _ in range(turns):  # the slot's turns: cancelled, closing, waiting
                await anyio.lowlevel.checkpoint()
            container.resume("orders")
            await send_all(url, queue, [f"m{turns}"])
            await calls.wait(functools.partial(has_seen, turns + 1), timeout=10)
