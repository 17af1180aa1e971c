"""What a container does as its listeners grow, counted rather than timed
(docs/performance.md, "Scale"): its subscriptions asked together, at the start and after a lost
connection, at most ``SUBSCRIBES_IN_FLIGHT`` a connection; its slots started a batch per turn
of the event loop; one walk of its slots for a health snapshot, whatever the count of
listeners; and an outage's line naming ten members, not each of a thousand."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import pairwise

import anyio
import anyio.lowlevel
import pytest

from mdb import Container, listener
from mdb.config.broker_settings import BrokerSettings
from mdb.container.container import LAUNCHED_TOGETHER
from mdb.container.slots import Slot
from mdb.listeners.events import BrokerEvent, Events
from mdb.listeners.listener import ListenerSpec, spec_of
from mdb.messages.destinations import Destination
from mdb.messages.topology import Member
from mdb.routing.brokers import MAX_CONNECTIONS
from mdb.routing.links import LISTED_MEMBERS, SUBSCRIBES_IN_FLIGHT, BrokerStatus
from tests.harness.apps.in_process import (
    WAIT,
    memory_broker,
    partitioned_settings,
    settings_for,
    until,
)

LISTENERS = 12
POOL = 2


def listeners(count: int, pool: int = POOL) -> list[ListenerSpec]:
    """``count`` listeners, each on a queue of its own, with ``pool`` slots per member."""

    def made(n: int) -> ListenerSpec:
        async def handle(body: str) -> None:
            return None

        spec = spec_of(listener(f"queue:growth_{n}", pool=pool, name=f"on_growth_{n}")(handle))
        assert spec is not None
        return spec

    return [made(n) for n in range(count)]


@pytest.mark.anyio
async def test_every_subscription_is_asked_for_at_once_at_the_start_and_after_a_loss() -> None:
    brokers = [memory_broker("growth") for _ in range(3)]
    states = [state for _, state in brokers]
    settings = partitioned_settings([url for url, _ in brokers],
                                    [f"queue:growth_{n}" for n in range(LISTENERS)])
    container = Container(settings, listeners(LISTENERS))
    per_broker = LISTENERS * POOL

    async def all_held() -> None:
        # One after another, a broker would hold one subscribe at a time, and this never ends.
        with anyio.fail_after(WAIT):
            for state in states:
                await state.wait_until(lambda s: s.subscriptions_held == per_broker)

    for state in states:
        state.hold_subscriptions()
    async with anyio.create_task_group() as running:
        running.start_soon(container.run)
        await all_held()
        for state in states:
            state.hold_subscriptions(False)
        await until(lambda: container.health().ready)

        states[1].hold_subscriptions()
        states[1].drop_connections()
        with anyio.fail_after(WAIT):
            await states[1].wait_until(lambda s: s.subscriptions_held == per_broker)
        states[1].hold_subscriptions(False)
        await until(lambda: container.health().ready)
        container.request_stop()


@pytest.mark.anyio
async def test_a_connection_waits_for_at_most_its_window_of_subscribes() -> None:
    url, state = memory_broker("growth")
    per_connection = SUBSCRIBES_IN_FLIGHT + 4
    container = Container(settings_for(url),
                          listeners(MAX_CONNECTIONS * per_connection // 4, pool=4))
    window = MAX_CONNECTIONS * SUBSCRIBES_IN_FLIGHT
    state.hold_subscriptions()
    async with anyio.create_task_group() as running:
        running.start_soon(container.run)
        with anyio.fail_after(WAIT):
            await state.wait_until(lambda s: s.subscriptions_held == window)
        await anyio.wait_all_tasks_blocked()
        assert state.subscriptions_held == window  # the others wait for room, not the broker
        state.hold_subscriptions(False)
        await until(lambda: container.health().ready)
        container.request_stop()


@pytest.mark.anyio
async def test_slots_start_a_batch_per_turn_of_the_loop_which_reads_between() -> None:
    url, _ = memory_broker("growth")
    container = Container(settings_for(url), listeners(LAUNCHED_TOGETHER * 3 // 4 + 1, pool=4))
    total = LAUNCHED_TOGETHER * 3 + 4
    seen = [0]

    async def watch() -> None:  # one look per turn of the loop
        while seen[-1] < total:
            await anyio.lowlevel.checkpoint()
            seen.append(len(container.slots.running))

    async with anyio.create_task_group() as running:
        running.start_soon(watch)
        running.start_soon(container.run)
        await until(lambda: container.health().ready)
        assert max(b - a for a, b in pairwise(seen)) == LAUNCHED_TOGETHER
        container.request_stop()


class Walked(set[Slot]):
    """The container's running slots, counting the walks over them."""

    walks = 0

    def __iter__(self) -> Iterator[Slot]:
        self.walks += 1
        return super().__iter__()


@pytest.mark.anyio
async def test_a_health_snapshot_walks_the_slots_once_however_many_listeners() -> None:
    brokers = [memory_broker("growth") for _ in range(3)]
    settings = partitioned_settings([url for url, _ in brokers],
                                    [f"queue:growth_{n}" for n in range(LISTENERS)])
    container = Container(settings, listeners(LISTENERS))
    async with anyio.create_task_group() as running:
        running.start_soon(container.run)
        await until(lambda: container.health().ready)
        walked = container.slots.running = Walked(container.slots.running)
        health = container.health()
        assert walked.walks == 1
        assert [(lh.subscribed, lh.members) for lh in health.listeners] == [(3, 3)] * LISTENERS
        container.request_stop()


def test_an_outage_names_ten_members_and_counts_the_others() -> None:
    seen: list[BrokerEvent] = []
    members = [Member("a", Destination.parse(f"queue:growth_{n}")) for n in range(25)]
    status = BrokerStatus("a", BrokerSettings(url="memory://growth"), Events([seen.append]),
                          lambda: members)
    status.up(0)
    status.down("connection lost")
    status.up(0)
    lost, restored = (e.detail for e in seen if e.member is None)
    named = ", ".join(str(m) for m in members[:LISTED_MEMBERS])
    assert lost == f"connection lost; members unavailable: {named} and 15 more"
    assert restored.endswith(f"; members available again: {named} and 15 more")
