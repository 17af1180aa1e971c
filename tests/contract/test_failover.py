"""Failover in one process, on memory brokers (whose outages tests can switch on and off):
availability events, starting without a broker, sends that wait for a reconnect, the live
topology and the health snapshot. Faults on real brokers are in ``tests/faults``."""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import pytest

from mdb import BrokerEvent, Container, Context, EventKind, Producer, listener
from mdb.config.settings import DestinationSettings, MemberSettings, Settings
from mdb.errors import ConfigurationError, ConnectionFailed
from mdb.listeners.events import Events
from mdb.messages.destinations import Destination
from mdb.routing.brokers import Brokers
from mdb.seam.broker import SubscriptionRequest
from mdb_memory import broker_state
from mdb_memory.connection import MemoryConnection
from mdb_memory.state import subscription_queue_name
from mdb_memory.subscription import MemorySubscription
from tests.harness.apps.in_process import (
    WAIT,
    Calls,
    partitioned_settings,
    running,
    settings_for,
    specs,
    unique,
)
from tests.harness.traffic.messages import send_soon

pytestmark = pytest.mark.anyio


@pytest.fixture
def urls() -> Iterator[list[str]]:
    names = [unique("m") for _ in range(3)]
    yield [f"memory://{name}" for name in names]
    for name in names:
        broker_state(name).refuse_connections(False)


def _fast(settings: Settings) -> Settings:
    """Reconnect quickly: these tests wait for reconnects, never for a time."""
    for name, broker in settings.brokers.items():
        settings.brokers[name] = broker.model_copy(
            update={"reconnect_delay": 0.05, "reconnect_max_delay": 0.2})
    return settings


def _name(url: str) -> str:
    return url.removeprefix("memory://")


async def test_a_broker_outage_is_reported_and_the_other_members_keep_flowing(
    urls: list[str],
) -> None:
    topic = f"topic:{unique('orders')}"
    settings = _fast(partitioned_settings(urls, [topic]))
    calls, seen = Calls(), Calls()

    @listener(topic, pool=1)
    async def on_order(body: str, ctx: Context) -> None:
        calls.add("seen", (body, ctx.redelivered))

    container = Container(settings, specs(on_order),
                          on_event=[lambda event: seen.add("event", event)])
    async with anyio.create_task_group() as tg, Producer(settings) as producer:
        await tg.start(container.run)
        broker_state(_name(urls[1])).refuse_connections()
        broker_state(_name(urls[1])).drop_connections()
        await seen.wait(lambda c: _kinds(c) >= {EventKind.CONNECTION_LOST,
                                                 EventKind.MEMBER_UNAVAILABLE})
        assert not container.health().ready
        for n in range(6):
            await producer.send(topic, f"during{n}")  # members a and c take them all
        await calls.wait(lambda c: len(c.of("seen")) >= 6)
        broker_state(_name(urls[1])).refuse_connections(False)
        await seen.wait(lambda c: EventKind.CONNECTION_RESTORED in _kinds(c))
        for n in range(6):
            await producer.send(topic, f"after{n}")
        await calls.wait(lambda c: len(c.of("seen")) >= 12)
        await _consumed_again(urls[1], topic, f"{settings.app}-on_order")
        assert container.health().ready  # every member subscribed again
        container.request_stop()
    assert sorted(b for b, _ in _pairs(calls)) == sorted(
        [f"during{n}" for n in range(6)] + [f"after{n}" for n in range(6)])
    lost = [e for e in _events(seen) if e.kind is EventKind.CONNECTION_LOST]
    assert [e.broker for e in lost] == ["b"]  # once per broker, not per connection
    unavailable = [e for e in _events(seen) if e.kind is EventKind.MEMBER_UNAVAILABLE]
    assert [str(e.member) for e in unavailable] == [f"{topic}@b"]
    assert container.events.counts[EventKind.CONNECTION_RESTORED] == 1


async def test_the_container_starts_without_an_unreachable_broker_and_joins_it_later(
    urls: list[str],
) -> None:
    topic = f"topic:{unique('orders')}"
    settings = _fast(partitioned_settings(urls, [topic]))
    broker_state(_name(urls[2])).refuse_connections()
    calls = Calls()

    @listener(topic)
    async def on_order(body: str) -> None:
        calls.add("seen", body)

    async with running(settings, on_order) as container, Producer(settings) as producer:
        health = container.health()
        assert [b.state for b in health.brokers] == ["up", "up", "down"]
        assert health.listeners[0].subscribed == 2 and not health.ready
        broker_state(_name(urls[2])).refuse_connections(False)
        await _consumed_again(urls[2], topic, f"{settings.app}-on_order")
        assert container.health().ready
        for n in range(9):
            await producer.send(topic, f"m{n}")
        await calls.wait(lambda c: len(c.of("seen")) >= 9)
    assert sorted(calls.of("seen")) == [f"m{n}" for n in range(9)]  # type: ignore[type-var]


async def test_a_connection_lost_by_a_subscribe_at_startup_is_subscribed_again(
    urls: list[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    # RabbitMQ closes a connection whose SUBSCRIBE meets its own race, as when two processes
    # declare one new durable subscription's queue on a cluster at once ("AMQP channel died").
    queue = f"queue:{unique('q')}"
    settings = _fast(settings_for(urls[0]))
    subscribe = MemoryConnection.subscribe
    lost = Calls()

    async def subscribe_losing_the_first(self: MemoryConnection,
                                         request: SubscriptionRequest) -> MemorySubscription:
        if not lost.of("lost"):
            lost.add("lost", request.destination)
            broker_state(_name(urls[0])).drop_connections()
        return await subscribe(self, request)

    monkeypatch.setattr(MemoryConnection, "subscribe", subscribe_losing_the_first)
    calls = Calls()

    @listener(queue)
    async def on_q(body: str) -> None:
        calls.add("seen", body)

    async with running(settings, on_q) as container, Producer(settings) as producer:
        for n in range(3):
            await producer.send(queue, f"m{n}")
        await calls.wait(lambda c: len(c.of("seen")) >= 3)
        assert container.health().ready
    assert lost.of("lost") == [Destination.parse(queue)]
    assert sorted(calls.of("seen")) == ["m0", "m1", "m2"]  # type: ignore[type-var]


async def test_a_container_with_no_reachable_broker_does_not_start(urls: list[str]) -> None:
    @listener("queue:q")
    async def on_q(body: str) -> None:
        pass

    settings = partitioned_settings(urls, [])
    for url in urls:
        broker_state(_name(url)).refuse_connections()
    with pytest.raises(ConnectionFailed):
        await Container(settings, specs(on_q)).run()


async def test_a_send_waits_for_its_broker_to_come_back(urls: list[str]) -> None:
    queue = f"queue:{unique('q')}"
    settings = _fast(settings_for(urls[0]))
    broker = broker_state(_name(urls[0]))
    broker.refuse_connections()
    seen = Calls()
    brokers = Brokers(settings, Events([lambda event: seen.add("event", event)]))
    brokers.watch("default")
    async with Producer(brokers) as producer:
        async with anyio.create_task_group() as tg:
            sent = send_soon(tg, producer, queue, "patient")
            await seen.wait(lambda c: EventKind.CONNECTION_LOST in _kinds(c))  # it tried
            assert not sent.is_set()
            broker.refuse_connections(False)
        assert broker.queue_depth(queue) == 1
    impatient = settings.model_copy(update={"brokers": {
        "default": settings.brokers["default"].model_copy(
            update={"send_wait_for_reconnect": 0})}})
    broker.refuse_connections()
    async with Producer(impatient) as producer:
        with pytest.raises(ConnectionFailed):
            await producer.send(queue, "impatient")


async def test_the_topology_changes_while_messages_flow(urls: list[str]) -> None:
    topic = f"topic:{unique('orders')}"
    two = _fast(partitioned_settings(urls, []))
    two.destinations[topic] = DestinationSettings(
        members=[MemberSettings(broker="a"), MemberSettings(broker="b")])
    three = two.model_copy(update={"destinations": {topic: DestinationSettings(
        members=[MemberSettings(broker=b) for b in "abc"])}})
    calls, seen = Calls(), Calls()

    @listener(topic)
    async def on_order(body: str) -> None:
        calls.add("seen", body)

    container = Container(two, specs(on_order), on_event=[lambda e: seen.add("event", e)])
    async with anyio.create_task_group() as tg:
        await tg.start(container.run)
        async with Producer(three) as producer:  # a producer already sending to c
            for n in range(6):
                await producer.send(topic, f"early{n}")
        await container.apply(three)
        assert {str(e.member) for e in _events(seen)
                if e.kind is EventKind.MEMBER_AVAILABLE} == {f"{topic}@c"}
        async with Producer(three) as producer:
            for n in range(6):
                await producer.send(topic, f"late{n}")
        await calls.wait(lambda c: sum(str(b).startswith("late") for b in c.of("seen")) >= 6)
        bad = three.model_copy(update={"destinations": {topic: DestinationSettings(
            members=[MemberSettings(broker="nowhere")])}})
        with pytest.raises(ConfigurationError, match="nowhere"):
            await container.apply(bad)
        await container.apply(two)  # c leaves: its slot drains and closes
        assert {str(e.member) for e in _events(seen)
                if e.kind is EventKind.MEMBER_UNAVAILABLE} == {f"{topic}@c"}
        queue = f"queue:{subscription_queue_name(topic.partition(':')[2], f'{two.app}-on_order')}"
        with anyio.fail_after(WAIT):
            await broker_state(_name(urls[2])).wait_until(
                lambda b: (stats := b.stats(queue)) is not None and stats.consumers == 0)
        container.request_stop()
    seen_bodies = [str(b) for b in calls.of("seen")]
    # Sent to c before it joined: not kept for a subscription that did not exist yet.
    assert sorted(seen_bodies) == sorted(
        [f"early{n}" for n in range(6) if n % 3 != 2] + [f"late{n}" for n in range(6)])


async def _consumed_again(url: str, topic: str, subscription: str) -> None:
    """Wait until the memory broker at ``url`` has a consumer on ``subscription`` of ``topic``."""
    queue = f"queue:{subscription_queue_name(topic.partition(':')[2], subscription)}"
    with anyio.fail_after(WAIT):
        await broker_state(_name(url)).wait_until(
            lambda b: (stats := b.stats(queue)) is not None and stats.consumers > 0)


def _events(calls: Calls) -> list[BrokerEvent]:
    return [e for e in calls.of("event") if isinstance(e, BrokerEvent)]


def _kinds(calls: Calls) -> set[EventKind]:
    return {e.kind for e in _events(calls)}


def _pairs(calls: Calls) -> list[tuple[str, bool]]:
    return [e for e in calls.of("seen") if isinstance(e, tuple)]


async def test_a_broker_down_past_its_give_up_time_is_reported_failed(urls: list[str]) -> None:
    topic = f"topic:{unique('orders')}"
    settings = _fast(partitioned_settings(urls, [topic]))
    settings.brokers["c"] = settings.brokers["c"].model_copy(
        update={"reconnect_give_up_after": 0.1})
    broker_state(_name(urls[2])).refuse_connections()
    seen = Calls()

    @listener(topic)
    async def on_order(body: str) -> None:
        pass

    container = Container(settings, specs(on_order), on_event=[lambda e: seen.add("event", e)])
    async with anyio.create_task_group() as tg:
        await tg.start(container.run)
        await seen.wait(lambda c: EventKind.BROKER_FAILED in _kinds(c))  # and it goes on
        assert [b.state for b in container.health().brokers] == ["up", "up", "failed"]
        broker_state(_name(urls[2])).refuse_connections(False)
        await seen.wait(lambda c: EventKind.CONNECTION_RESTORED in _kinds(c))
        container.request_stop()
    failed = [e for e in _events(seen) if e.kind is EventKind.BROKER_FAILED]
    assert [e.broker for e in failed] == ["c"]
