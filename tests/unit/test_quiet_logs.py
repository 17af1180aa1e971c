"""Quiet logs under broker faults (docs/failover.md, "What the log says during an outage"): a
broker outage is one line when it starts and one when it ends (with the failed attempts and how
long it lasted), however many connections and reconnect attempts the container has."""

from __future__ import annotations

import logging

import anyio
import pytest

from mdb import Container, EventKind, listener
from mdb.config.broker_settings import BrokerSettings
from mdb.config.settings import Settings
from mdb.listeners.events import BrokerEvent, Events
from mdb.routing.links import BrokerLink, BrokerStatus
from mdb_memory import broker_state
from tests.harness.apps.in_process import WAIT, specs, unique

pytestmark = pytest.mark.anyio


async def test_an_outage_is_one_line_when_it_starts_and_one_when_it_ends(
        caplog: pytest.LogCaptureFixture) -> None:
    name = unique("quiet")
    settings = Settings(brokers={"main": BrokerSettings(
        url=f"memory://{name}", reconnect_delay=0.01, reconnect_max_delay=0.02)})

    @listener("queue:orders", pool=4)
    async def on_order(body: bytes) -> None:
        pass

    @listener("topic:prices", pool=2)
    async def on_price(body: bytes) -> None:
        pass

    caplog.set_level(logging.DEBUG)  # every record is captured; the INFO+ ones are what shows
    container = Container(settings, specs(on_order, on_price))
    state = broker_state(name)
    async with anyio.create_task_group() as tg:
        await tg.start(container.run)
        state.refuse_connections()
        state.drop_connections()
        with anyio.fail_after(WAIT):  # every slot has tried more than once
            await state.wait_until(lambda s: s.refused_connections >= 12)
        state.refuse_connections(False)
        with anyio.fail_after(WAIT):  # ready once the last slot subscribed: a state change
            await state.wait_until(lambda _: container.health().ready)
        container.request_stop()
    shown = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO
             and not r.getMessage().startswith("container ready")]
    lost = [m for m in shown if "lost" in m]
    restored = [m for m in shown if "restored" in m]
    assert len(lost) == 1 and lost[0].startswith("connection-lost: broker main"), lost
    assert "queue:orders@main" in lost[0] and "topic:prices@main" in lost[0]  # what is affected
    assert len(restored) == 1, restored
    assert "failed attempts" in restored[0] and "down for" in restored[0]
    assert [m for m in shown if m not in lost + restored] == []  # nothing per connection
    assert container.events.counts[EventKind.MEMBER_UNAVAILABLE] == 2  # still counted, and
    assert container.events.counts[EventKind.MEMBER_AVAILABLE] == 2    # still called back


def test_an_event_names_its_broker_once() -> None:
    lost = BrokerEvent(EventKind.CONNECTION_LOST, "main",
                       detail="broker main (127.0.0.1:1) refused the credentials of user u")
    assert str(lost) == ("connection-lost: broker main (127.0.0.1:1) refused the credentials "
                         "of user u")
    other = BrokerEvent(EventKind.CONNECTION_LOST, "main", detail="broker b is far")
    assert str(other) == "connection-lost: broker main (broker b is far)"


async def test_a_loss_noticed_late_is_not_a_second_outage() -> None:
    """A connection lost in an outage that another connection already reported, and already
    saw end, is part of that outage: no second connection-lost (seen under load on ActiveMQ)."""
    name = unique("late")
    events = Events()
    status = BrokerStatus("main", BrokerSettings(url=f"memory://{name}", reconnect_delay=0.01),
                          events)
    first, late = BrokerLink(status, "a"), BrokerLink(status, "b")
    await first.connect()
    await late.connect()
    broker_state(name).drop_connections()
    await first.connection()  # notices the loss (the outage begins) and reconnects (it ends)
    await late.connection()  # notices its own loss of the same outage, later
    assert events.counts[EventKind.CONNECTION_LOST] == 1
    assert events.counts[EventKind.CONNECTION_RESTORED] == 1
    broker_state(name).drop_connections()
    await late.connection()  # a new outage
    assert events.counts[EventKind.CONNECTION_LOST] == 2
    await first.close()
    await late.close()
