"""Store-and-forward on a real broker: a producer's outbox (``mdb.exactly_once.Outbox``) keeps
its messages while ActiveMQ is down (killed by PID) and forwards them, in order per key, once
it is back (docs/exactly-once.md, "Producers: the outbox and store-and-forward"). The same on
the memory broker: tests/unit/test_store_and_forward.py."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from mdb.config.broker_settings import BrokerSettings
from mdb.config.database_settings import DatabaseSettings
from mdb.config.settings import Settings
from mdb.exactly_once import Outbox, tables
from mdb.exactly_once.database.database import Database
from mdb.routing.producer import Producer
from tests.harness.apps.in_process import unique
from tests.harness.servers.brokers import private_brokers
from tests.harness.traffic.messages import read

pytestmark = [pytest.mark.anyio, pytest.mark.activemq]


async def test_messages_wait_while_activemq_is_down_and_go_in_order_per_key(
        tmp_path: Path) -> None:
    with private_brokers("activemq") as [broker]:
        settings = Settings(
            brokers={"default": BrokerSettings(url=broker.url, send_wait_for_reconnect=0,
                                               reconnect_delay=0.2, reconnect_max_delay=1.0)},
            # A short lease: the forwarding task sweeps every half second.
            databases={"main": DatabaseSettings(url=f"sqlite+aiosqlite:///{tmp_path}/a.db",
                                                outbox_lease=1.5)})
        database = Database("main", settings.databases["main"])
        await tables.upgrade(database.engine)
        await database.close()
        queue = f"queue:{unique('saf')}"
        async with Producer(settings) as producer, Outbox(producer) as outbox:

            async def send(body: str) -> None:
                async with outbox.database.session() as session:
                    await outbox.send(session, queue, body, key=body[0])
                await outbox.dispatch()

            broker.kill()
            for body in ["A1", "B1", "A2", "B2", "A3"]:
                await send(body)  # committed; the broker is down: it waits
            broker.start()
            async with anyio.create_task_group() as forwarding:
                forwarding.start_soon(outbox.forward)
                await send("B3")
                arrived = await read(broker.url, queue, 6)
                forwarding.cancel_scope.cancel()
    sent = [d.body.decode() for d in arrived]
    assert [b for b in sent if b[0] == "A"] == ["A1", "A2", "A3"]
    assert [b for b in sent if b[0] == "B"] == ["B1", "B2", "B3"]
