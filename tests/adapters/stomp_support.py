"""Helpers shared by the STOMP adapter tests: connection options, unique destinations,
messages, bounded receives, and private brokers started by ``tests.harness``.

Without a broker installed its tests are skipped, except in CI (``CI=true``) where that is a
failure. Every wait is bounded by ``WAIT`` so a broken adapter fails instead of hanging.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

from mdb.broker import ConnectionOptions, Delivery, Subscription, SubscriptionRequest
from mdb.destinations import Destination
from mdb.message import ID, OutgoingMessage, new_id
from mdb_stomp import StompBroker, StompConnection
from tests.harness.activemq import ActiveMQ, activemq_available
from tests.harness.process import BrokerProcess
from tests.harness.rabbitmq import RabbitMQ, rabbitmq_available

WAIT = 15.0  # bound on any single wait: a hang guard, not a timing assertion

# kind -> (harness class, available?, what CI must install, how to install it here)
_BROKERS: dict[str, tuple[Callable[[], BrokerProcess], Callable[[], bool], str, str]] = {
    "activemq": (
        ActiveMQ,
        activemq_available,
        "ActiveMQ (Debian package 'activemq') and java are required when CI=true",
        "ActiveMQ is not installed (apt-get install activemq)",
    ),
    "rabbitmq": (
        RabbitMQ,
        rabbitmq_available,
        "RabbitMQ (Debian package 'rabbitmq-server') is required when CI=true",
        "RabbitMQ is not installed (apt-get install rabbitmq-server)",
    ),
}


def require_broker(kind: str) -> None:
    """Skip (fail in CI) unless broker ``kind`` ("activemq" or "rabbitmq") is installed."""
    _, available, in_ci, here = _BROKERS[kind]
    if available():
        return
    if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
        pytest.fail(in_ci)
    pytest.skip(here)


def own_broker(kind: str) -> Iterator[Any]:
    """A started broker of ``kind`` for a fixture to yield; closed after the fixture's use."""
    require_broker(kind)
    broker = _BROKERS[kind][0]().start()
    yield broker
    broker.close()


def options(url: str, **overrides: object) -> ConnectionOptions:
    values: dict[str, object] = {
        "heartbeat_ms": 1000,
        "connect_timeout": 5.0,
        "receipt_timeout": 5.0,
    }
    values.update(overrides)
    return ConnectionOptions(url=url, **values)  # type: ignore[arg-type]


@asynccontextmanager
async def connected(url: str, **overrides: object) -> AsyncIterator[StompConnection]:
    connection = await StompBroker(options(url, **overrides)).connect()
    try:
        yield connection
    finally:
        await connection.close()


def unique(kind: str) -> Destination:
    return Destination.parse(f"{kind}:mdbtest-{uuid.uuid4().hex[:12]}")


def queue_request(
    destination: Destination, prefetch: int = 1, selector: str | None = None
) -> SubscriptionRequest:
    return SubscriptionRequest(
        destination, name=None, durable=True, selector=selector, prefetch=prefetch
    )


def topic_request(destination: Destination, name: str, prefetch: int = 1) -> SubscriptionRequest:
    return SubscriptionRequest(
        destination, name=name, durable=True, selector=None, prefetch=prefetch
    )


def message(body: bytes | str, **headers: str) -> OutgoingMessage:
    data = body.encode() if isinstance(body, str) else body
    return OutgoingMessage(data, {ID: new_id(), "content-type": "text/plain", **headers})


async def receive(subscription: Subscription) -> Delivery:
    with anyio.fail_after(WAIT):
        return await subscription.receive()
