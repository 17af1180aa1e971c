"""Java and mdb on one ActiveMQ: the broker (STOMP for mdb, OpenWire for Java) and the Java peer."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.harness.servers.activemq import ActiveMQ, activemq_available
from tests.harness.servers.brokers import missing
from tests.harness.servers.process import free_port
from tests.harness.traffic.java import JmsTool, java_available, openwire_config


@pytest.fixture(scope="session")
def java_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ActiveMQ, JmsTool]]:
    """One ActiveMQ that mdb reaches over STOMP and ActiveMQ's own Java client over OpenWire."""
    if not activemq_available():
        missing("ActiveMQ Classic")
    if not java_available():
        missing("javac and ActiveMQ's JMS client jars")
    port = free_port()
    with ActiveMQ(config=openwire_config(tmp_path_factory.mktemp("openwire"), port)) as broker:
        yield broker, JmsTool(f"tcp://127.0.0.1:{port}", broker.username, broker.password)
