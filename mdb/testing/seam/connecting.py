"""What every test of the seam's contract (``mdb.testing.seam``) connects and sends with: a
broker found by the URL's scheme, queues of its own, plain messages, and waits each bounded."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio

from mdb.messages.destinations import Destination
from mdb.messages.headers import ID
from mdb.messages.message import OutgoingMessage, new_id
from mdb.seam.broker import (
    Broker,
    Connection,
    ConnectionOptions,
    Delivery,
    Subscription,
    SubscriptionRequest,
    Transaction,
)
from mdb.seam.registry import broker_for

WAIT = 15.0  # bound on one wait: a hang guard, not a timing


def seam_broker(url: str) -> Broker:
    return broker_for(ConnectionOptions(url=url, client_id=f"seam-{uuid.uuid4().hex[:8]}",
                                        connect_timeout=WAIT, receipt_timeout=WAIT))


@asynccontextmanager
async def connected(url: str, broker: Broker | None = None) -> AsyncIterator[Connection]:
    connection = await (broker or seam_broker(url)).connect()
    try:
        yield connection
    finally:
        await connection.close()


def new_queue() -> Destination:
    return Destination.parse(f"queue:seam_{uuid.uuid4().hex[:12]}")


@asynccontextmanager
async def with_queues(url: str) -> AsyncIterator[tuple[Connection, Destination, Destination]]:
    """A connection to ``url`` and two queues of its own: where messages come from, and where
    a transaction sends."""
    async with connected(url) as connection:
        yield connection, new_queue(), new_queue()


def request_on(destination: Destination, prefetch: int = 1, name: str | None = None,
        ) -> SubscriptionRequest:
    return SubscriptionRequest(destination, name=name, durable=True, selector=None,
                               prefetch=prefetch)


def text_message(text: str, **headers: str) -> OutgoingMessage:
    return OutgoingMessage(text.encode(), {ID: new_id(), "content-type": "text/plain",
                                           **headers})


async def send_all(connection: Connection, destination: Destination, *bodies: str) -> None:
    """Send a message of each of ``bodies`` to ``destination``, in order."""
    for body in bodies:
        await connection.send(destination, text_message(body))


async def receive(subscription: Subscription) -> Delivery:
    with anyio.fail_after(WAIT):
        return await subscription.receive()


async def held(connection: Connection, source: Destination,
               *bodies: str) -> tuple[Subscription, Delivery]:
    """Send ``bodies`` to ``source``, subscribe to it and receive the first of them, left
    unsettled."""
    await send_all(connection, source, *bodies)
    subscription = await connection.subscribe(request_on(source))
    return subscription, await receive(subscription)


async def acked(connection: Connection, source: Destination,
                  *bodies: str) -> tuple[Subscription, Delivery, Transaction]:
    """Send ``bodies`` to ``source``, subscribe to it, receive the first of them and ack it
    in a new transaction, left open."""
    subscription, delivery = await held(connection, source, *bodies)
    tx = await connection.begin()
    await tx.ack(delivery)
    return subscription, delivery, tx


async def take_one(url: str, destination: Destination) -> Delivery:
    """The next message of ``destination``, read on a connection of its own and acked."""
    async with connected(url) as connection:
        subscription = await connection.subscribe(request_on(destination))
        delivery = await receive(subscription)
        await connection.ack(delivery)
        await subscription.close()
        return delivery
