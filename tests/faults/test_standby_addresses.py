"""One broker at two addresses on real ActiveMQ: two private, independent brokers stand for a
master and its standby. They share no store, so this only proves that the container's
connections and the producer's move to the second address when the first is killed -9, and
that the listener is subscribed again there. The shared-store master/slave (one store: the
messages follow the takeover) is tested on its own (``test_activemq_ha.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import anyio.to_thread
import pytest

from mdb import BrokerEvent, Container, EventKind, Producer, listener
from mdb.config.broker_settings import BrokerSettings
from mdb.config.settings import Settings
from mdb.observability.redaction import redact_url
from tests.harness.apps.in_process import Calls, specs, unique
from tests.harness.servers.brokers import private_brokers
from tests.harness.servers.process import BrokerProcess

pytestmark = [pytest.mark.activemq, pytest.mark.anyio]


@pytest.fixture(scope="module")
def master_and_standby() -> Iterator[list[BrokerProcess]]:
    """Two private ActiveMQ brokers of this module's own (it kills the first)."""
    with private_brokers("activemq", 2) as brokers:
        yield brokers


async def test_the_container_moves_to_the_standby_address_when_the_master_is_killed(
    master_and_standby: list[BrokerProcess],
) -> None:
    master, standby = master_and_standby
    queue = f"queue:{unique('orders')}"
    settings = Settings(
        app=unique("app"), server="s1", shutdown_grace_period=5.0,
        brokers={"main": BrokerSettings(
            url=[str(master.url), str(standby.url)], heartbeat_ms=1000, connect_timeout=5,
            reconnect_delay=0.1, reconnect_max_delay=0.5)})
    calls, seen = Calls(), Calls()

    @listener(queue, pool=5)  # two connections: both move
    async def on_order(body: str) -> None:
        calls.add("seen", body)

    container = Container(settings, specs(on_order), on_event=[lambda e: seen.add("event", e)])
    async with anyio.create_task_group() as tg, Producer(settings) as producer:
        await tg.start(container.run)
        assert container.health().brokers[0].address == redact_url(str(master.url))
        await producer.send(queue, "on the master")
        await calls.wait(lambda c: "on the master" in c.of("seen"))
        await anyio.to_thread.run_sync(master.kill)
        await seen.wait(lambda c: any(isinstance(e, BrokerEvent)
                                      and e.kind is EventKind.CONNECTION_RESTORED
                                      for e in c.of("event")))
        assert container.health().brokers[0].address == redact_url(str(standby.url))
        await producer.send(queue, "on the standby")  # the producer's link moves too
        await calls.wait(lambda c: "on the standby" in c.of("seen"))
        container.request_stop()
    restored = [str(e) for e in seen.of("event")
                if isinstance(e, BrokerEvent) and e.kind is EventKind.CONNECTION_RESTORED]
    assert len(restored) == 1
    assert f"now on {redact_url(str(standby.url))};" in restored[0]
    assert standby.password not in restored[0]
