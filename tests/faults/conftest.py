"""Fixtures of the fault tests: brokers of their own, which the tests kill, hang and restart
(never the session's shared brokers)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.harness.servers.brokers import missing, private_brokers
from tests.harness.servers.netns import Network, network_available, private_network
from tests.harness.servers.process import BrokerProcess


@pytest.fixture(scope="module")
def trio() -> Iterator[list[BrokerProcess]]:
    """Three private ActiveMQ brokers for one test module, started together; a test leaves
    them all running."""
    with private_brokers("activemq", 3) as brokers:
        yield brokers


@pytest.fixture(scope="module")
def network() -> Iterator[Network]:
    """A private bridge for one test module's brokers, and network namespaces linked to it
    whose links a test cuts (``tests.harness.servers.netns``)."""
    if not network_available():
        missing("root and iproute2 (network namespaces)")
    with private_network() as made:
        yield made
