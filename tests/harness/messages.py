"""Messages in and out of a test: sent with a ``Producer`` as an application sends them, sent
through the seam with the ``mdb_id`` the test chose (copies of one, as a broker redelivers
them), and taken from a queue through the seam."""

from __future__ import annotations

from collections.abc import Sequence

import anyio
from anyio.abc import TaskGroup

from mdb import Container, Producer
from mdb.adapters import broker_for
from mdb.broker import ConnectionOptions, Delivery, SubscriptionRequest
from mdb.destinations import Destination
from mdb.message import ID, OutgoingMessage
from tests.harness.in_process import WAIT, Calls, settings_for, unique


async def send_all(url: str, destination: str, bodies: Sequence[object]) -> list[str]:
    """Send ``bodies`` with a ``Producer``; their ``mdb_id``s."""
    async with Producer(settings_for(url)) as producer:
        return [await producer.send(destination, body) for body in bodies]


async def send(url: str, destination: str, body: object, **headers: str) -> str:
    """Send one ``body`` with ``headers`` with a ``Producer``; its ``mdb_id``."""
    async with Producer(settings_for(url)) as producer:
        return await producer.send(destination, body, headers=headers)


async def still_flowing(url: str, container: Container, calls: Calls, queue: str) -> None:
    """The container is ready and processes the next (harmless) message: what a hostile
    message must leave it (docs/security.md). ``calls`` records each body under ``"body"``."""
    assert container.health().ready
    await send(url, queue, "after")
    await calls.wait(lambda c: "after" in c.of("body"))
    assert container.health().ready


def send_soon(tg: TaskGroup, producer: Producer, destination: str, body: object) -> anyio.Event:
    """Start sending ``body`` in ``tg``; the event is set once the send returned, so that a test
    sees a send wait (for its broker to come back) and then end."""
    sent = anyio.Event()

    async def send() -> None:
        await producer.send(destination, body)
        sent.set()

    tg.start_soon(send)
    return sent


async def send_copies(url: str, destination: str, body: bytes, mdb_id: str, copies: int) -> None:
    """``copies`` messages with one ``mdb_id``, as a redelivered copy arrives."""
    await _send_with_ids(url, destination, [(body, mdb_id)] * copies)


async def send_bodies(url: str, destination: str, bodies: Sequence[str]) -> None:
    """``bodies``, each with the ``mdb_id`` ``id-<body>``: messages whose ids a test knows."""
    await _send_with_ids(url, destination, [(b.encode(), f"id-{b}") for b in bodies])


async def _send_with_ids(url: str, destination: str, messages: Sequence[tuple[bytes, str]],
                         ) -> None:
    """Send each ``(body, mdb_id)`` through the seam, as text."""
    connection = await broker_for(ConnectionOptions(url=url, client_id=unique("w"))).connect()
    try:
        for body, mdb_id in messages:
            await connection.send(Destination.parse(destination),
                                  OutgoingMessage(body, {ID: mdb_id, "content-type": "text/plain"}))
    finally:
        await connection.close()


async def read(url: str, destination: str, count: int, timeout: float = WAIT) -> list[Delivery]:
    """Take ``count`` messages from a queue through the seam, acking each."""
    connection = await broker_for(ConnectionOptions(url=url, client_id=unique("reader"))).connect()
    try:
        subscription = await connection.subscribe(SubscriptionRequest(
            Destination.parse(destination), name=None, durable=True, selector=None, prefetch=1))
        taken = []
        with anyio.fail_after(timeout):
            for _ in range(count):
                delivery = await subscription.receive()
                await connection.ack(delivery)
                taken.append(delivery)
        await subscription.close()
        return taken
    finally:
        await connection.close()


async def assert_drained(url: str, destination: str) -> None:
    """Nothing is left on ``destination``, settled or not: a marker sent now is read first."""
    await send_all(url, destination, ["marker"])
    [first] = await read(url, destination, 1)
    assert first.body == b"marker"

