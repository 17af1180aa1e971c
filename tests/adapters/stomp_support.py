"""Helpers shared by the STOMP adapter tests: connection options, destinations of their own,
messages and bounded receives.

Without a broker installed its tests are skipped, except in CI (``CI=true``) where that is a
failure (``tests.harness.servers.brokers.private_brokers``). Every wait is bounded by ``WAIT`` so a
broken adapter fails instead of hanging.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio

from mdb.messages.destinations import Destination
from mdb.messages.headers import ID
from mdb.messages.message import OutgoingMessage, new_id
from mdb.seam.broker import ConnectionOptions, Delivery, Subscription, SubscriptionRequest
from mdb_stomp import StompBroker, StompConnection
from tests.harness.apps.in_process import unique

WAIT = 15.0  # bound on any single wait: a hang guard, not a timing assertion


def options(url: str, **overrides: object) -> ConnectionOptions:
    # The product's default heart-beats: at 1 s, a broker starved of CPU for 2.5 s (rabbitmqctl
    # starting its own Erlang VM beside it on two cores) was taken for lost. The tests that are
    # about heart-beats ask for their own.
    values: dict[str, object] = {
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


def new_destination(kind: str) -> Destination:
    """A ``queue`` or ``topic`` of a name no other test uses."""
    return Destination.parse(f"{kind}:{unique('mdbtest')}")


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


async def send_messages(connection: StompConnection, destination: Destination,
                        count: int) -> list[OutgoingMessage]:
    """Send ``count`` messages, ``m0``, ``m1``, …, to ``destination``; the messages sent."""
    sent = [message(f"m{i}") for i in range(count)]
    for item in sent:
        await connection.send(destination, item)
    return sent


async def receive(subscription: Subscription) -> Delivery:
    with anyio.fail_after(WAIT):
        return await subscription.receive()
