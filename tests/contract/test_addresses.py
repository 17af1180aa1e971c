"""One broker at several addresses (a master and its standby, the nodes of a cluster), on memory
brokers: ``memory://a`` and ``memory://b`` stand for two addresses of broker ``main``. They share
no messages, as two independent brokers would not; the tests follow where the connections go.
Real brokers: ``tests/faults/test_standby_addresses.py``."""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import pytest

from mdb import BrokerEvent, Container, Context, EventKind, Producer, listener
from mdb.config.broker_settings import BrokerSettings
from mdb.config.settings import Settings
from mdb.errors import ConnectionFailed
from mdb.listeners.events import Events
from mdb.routing.brokers import Brokers
from mdb.routing.links import BrokerLink, BrokerStatus
from mdb_memory import BrokerState, broker_state
from tests.harness.apps.in_process import WAIT, Calls, specs, unique
from tests.harness.traffic.messages import send_soon

pytestmark = pytest.mark.anyio


@pytest.fixture
def pair() -> Iterator[tuple[BrokerState, BrokerState]]:
    """Two fresh memory brokers: the two addresses of broker ``main``."""
    states = (broker_state(unique("a")), broker_state(unique("b")))
    yield states
    for state in states:
        state.refuse_connections(False)


def _urls(pair: tuple[BrokerState, BrokerState]) -> list[str]:
    return [f"memory://{state.name}" for state in pair]


def _settings(pair: tuple[BrokerState, BrokerState], **broker: object) -> Settings:
    """Broker ``main`` at both addresses, reconnecting quickly: the tests wait for
    reconnects, never for a time."""
    return Settings(app=unique("app"), server="s1", shutdown_grace_period=5.0,
                    brokers={"main": BrokerSettings(
                        url=_urls(pair), reconnect_delay=0.05, reconnect_max_delay=0.2,
                        **broker)})


def _events(calls: Calls) -> list[BrokerEvent]:
    return [e for e in calls.of("event") if isinstance(e, BrokerEvent)]


def _kinds(calls: Calls) -> list[EventKind]:
    return [e.kind for e in _events(calls)]


async def _consumers(state: BrokerState, queue: str, count: int) -> None:
    with anyio.fail_after(WAIT):
        await state.wait_until(lambda s: (q := s.stats(queue)) is not None
                               and q.consumers == count)


async def test_a_container_follows_its_broker_to_the_standby_and_back(
    pair: tuple[BrokerState, BrokerState],
) -> None:
    a, b = pair
    queue = f"queue:{unique('orders')}"
    settings = _settings(pair)
    calls, seen = Calls(), Calls()
    holding, release = anyio.Event(), anyio.Event()

    @listener(queue, pool=5)  # two connections: both must move
    async def on_order(body: str, ctx: Context) -> None:
        calls.add("seen", (body, ctx.redelivered))
        if body == "held":
            holding.set()
            await release.wait()  # its connection is lost meanwhile

    container = Container(settings, specs(on_order), on_event=[lambda e: seen.add("event", e)])
    async with anyio.create_task_group() as tg, Producer(settings) as producer:
        await tg.start(container.run)
        assert container.health().brokers[0].address == _urls(pair)[0]
        await producer.send(queue, "held")
        with anyio.fail_after(WAIT):
            await holding.wait()
        a.refuse_connections()
        a.drop_connections()  # the master dies; b is its standby
        release.set()
        await seen.wait(lambda c: EventKind.CONNECTION_RESTORED in _kinds(c))
        await _consumers(b, queue, 5)  # every slot subscribed again, on b
        assert container.health().brokers[0].address == _urls(pair)[1]
        await producer.send(queue, "on b")  # the producer's link moves too
        await calls.wait(lambda c: ("on b", False) in c.of("seen"))
        # The held message was never acked on the new connection: a has it back, flagged.
        assert [(d.body, d.broker_redelivered) for d in a.browse(queue)] == [(b"held", True)]
        a.refuse_connections(False)
        b.refuse_connections()
        b.drop_connections()  # fail back
        await _consumers(a, queue, 5)
        await calls.wait(lambda c: ("held", True) in c.of("seen"))
        container.request_stop()
    restored = [str(e) for e in _events(seen) if e.kind is EventKind.CONNECTION_RESTORED]
    assert len(restored) == 2  # once per broker, not per connection
    assert f"now on {_urls(pair)[1]};" in restored[0]
    assert f"now on {_urls(pair)[0]};" in restored[1]


async def test_a_container_whose_first_address_refuses_starts_on_the_next(
    pair: tuple[BrokerState, BrokerState],
) -> None:
    a, b = pair
    queue = f"queue:{unique('orders')}"
    settings = _settings(pair)
    a.refuse_connections()  # a waiting slave: no connector open
    calls, seen = Calls(), Calls()

    @listener(queue)
    async def on_order(body: str) -> None:
        calls.add("seen", body)

    container = Container(settings, specs(on_order), on_event=[lambda e: seen.add("event", e)])
    async with anyio.create_task_group() as tg, Producer(settings) as producer:
        await tg.start(container.run)
        health = container.health()
        assert [(h.state, h.address) for h in health.brokers] == [("up", _urls(pair)[1])]
        assert health.ready
        await producer.send(queue, "first")
        await calls.wait(lambda c: c.of("seen") == ["first"])
        container.request_stop()
    assert a.refused_connections >= 1 and b.connection_count == 0
    assert _kinds(seen) == []  # the broker answered: no outage to report


async def test_a_send_waits_while_its_broker_fails_over_then_raises(
    pair: tuple[BrokerState, BrokerState],
) -> None:
    a, b = pair
    queue = f"queue:{unique('q')}"
    settings = _settings(pair)
    seen = Calls()
    brokers = Brokers(settings, Events([lambda event: seen.add("event", event)]))
    status = brokers.watch("main")
    async with Producer(brokers) as producer:
        await producer.send(queue, "before")
        assert a.queue_depth(queue) == 1
        for state in pair:
            state.refuse_connections()
        a.drop_connections()
        async with anyio.create_task_group() as tg:
            sent = send_soon(tg, producer, queue, "patient")
            with anyio.fail_after(WAIT):  # a round over both addresses failed
                await b.wait_until(lambda s: s.refused_connections >= 1)
            await seen.wait(lambda c: EventKind.CONNECTION_LOST in _kinds(c))
            assert not sent.is_set()
            b.refuse_connections(False)  # the standby takes over
        assert b.queue_depth(queue) == 1 and status.address == _urls(pair)[1]
    impatient = _settings(pair, send_wait_for_reconnect=0)
    b.refuse_connections()
    async with Producer(impatient) as producer:
        with pytest.raises(ConnectionFailed, match="answered on none of its 2 addresses"):
            await producer.send(queue, "impatient")


async def test_a_round_tries_each_address_retries_times_a_row_for_its_cycles(
    pair: tuple[BrokerState, BrokerState],
) -> None:
    a, b = pair
    settings = _settings(pair, failover_retries=2, failover_cycles=2).brokers["main"]
    link = BrokerLink(BrokerStatus("main", settings, Events()), "c")
    for state in pair:
        state.refuse_connections()
    with pytest.raises(ConnectionFailed):
        await link.connect()  # one round: (1 + 2 retries) x 2 addresses x 2 cycles
    assert (a.refused_connections, b.refused_connections) == (6, 6)
    b.refuse_connections(False)
    await link.connect()  # a's retries, then b
    assert (a.refused_connections, b.refused_connections) == (9, 6)
    assert b.connection_count == 1 and link.status.active == 1
    a.refuse_connections(False)
    b.refuse_connections()
    b.drop_connections()
    await link.connection()  # from the active address: b's retries, then a
    assert (a.refused_connections, b.refused_connections) == (9, 9)
    assert a.connection_count == 1 and link.status.address == _urls(pair)[0]
    await link.close()
