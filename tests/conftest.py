"""Fixtures shared by every test: the anyio backend and the real brokers.

Broker tests may skip when a broker is absent on a developer's machine, never in CI
(``CI=true``): there the missing broker is a failure.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def missing(what: str) -> None:
    if IN_CI:
        pytest.fail(f"{what} is required in CI (CI=true); tests/run installs it")
    pytest.skip(f"{what} is not installed here (tests/run installs it)")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def activemq() -> Iterator[object]:
    from tests.harness.activemq import ActiveMQ, activemq_available

    if not activemq_available():
        missing("ActiveMQ Classic")
    broker = ActiveMQ()
    broker.start()
    try:
        yield broker
    finally:
        broker.close()


@pytest.fixture(scope="session")
def activemq_trio() -> Iterator[list[object]]:
    """Three ActiveMQ brokers, started together: one per member of a partitioned topic."""
    from tests.harness.activemq import ActiveMQ, activemq_available

    if not activemq_available():
        missing("ActiveMQ Classic")
    brokers = [ActiveMQ() for _ in range(3)]
    try:
        with ThreadPoolExecutor(len(brokers)) as starting:
            list(starting.map(ActiveMQ.start, brokers))
        yield list(brokers)
    finally:
        for broker in brokers:
            broker.close()


@pytest.fixture(scope="session")
def rabbitmq() -> Iterator[object]:
    from tests.harness.rabbitmq import RabbitMQ, rabbitmq_available

    if not rabbitmq_available():
        missing("RabbitMQ with the STOMP plugin")
    broker = RabbitMQ()
    broker.start()
    try:
        yield broker
    finally:
        broker.close()


@pytest.fixture(
    params=[
        "memory",
        pytest.param("activemq", marks=pytest.mark.activemq),
        pytest.param("rabbitmq", marks=pytest.mark.rabbitmq),
    ]
)
def broker_url(request: pytest.FixtureRequest) -> str:
    """The contract suite runs once per broker."""
    if request.param == "memory":
        return f"memory://{uuid.uuid4().hex[:8]}"
    return str(request.getfixturevalue(request.param).url)


@pytest.fixture(params=["memory", pytest.param("activemq_trio", marks=pytest.mark.activemq)])
def member_urls(request: pytest.FixtureRequest) -> list[str]:
    """Three brokers, one per member of a partitioned topic: in memory, then real ones."""
    if request.param == "memory":
        return [f"memory://{uuid.uuid4().hex[:8]}" for _ in range(3)]
    return [str(broker.url) for broker in request.getfixturevalue(request.param)]
