"""Messages in and out of a test: sent with a ``Producer`` as an application sends them, sent
through the seam with the ``mdb_id`` the test chose (copies of one, as a broker redelivers
them), and taken from a queue through the seam."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import anyio
from anyio.abc import TaskGroup

from mdb import Container, Producer
from mdb.messages.destinations import Destination
from mdb.messages.headers import ID
from mdb.messages.identity import Seal
from mdb.messages.message import OutgoingMessage
from mdb.seam.broker import ConnectionOptions, Delivery, SubscriptionRequest
from mdb.seam.registry import broker_for
from tests.harness.apps.in_process import WAIT, Calls, settings_for, unique


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


async def send_copies(url: str, destination: str, body: bytes, mdb_id: str, copies: int, *,
                      seal: Seal | None = None, headers: Mapping[str, str] | None = None,
                      ) -> None:
    """``copies`` messages with one ``mdb_id`` (and ``headers``), as a redelivered copy
    arrives; proven with ``seal``, as the application's own (``mdb.messages.identity``), else a
    producer's."""
    await _send_with_ids(url, destination, [(body, mdb_id)] * copies, seal, headers or {})


async def send_foreign(url: str, destination: str, bodies: Sequence[bytes],
                       **headers: str) -> None:
    """Messages as a producer that is not mdb sends them: no header of mdb's unless
    ``headers`` forge one."""
    await _send_through_the_seam(url, destination, [(body, headers) for body in bodies], None)


async def send_bodies(url: str, destination: str, bodies: Sequence[str], *,
                      seal: Seal | None = None) -> None:
    """``bodies``, each with the ``mdb_id`` ``id-<body>``: messages whose ids a test knows;
    proven with ``seal``, as ``send_copies``."""
    await _send_with_ids(url, destination, [(b.encode(), f"id-{b}") for b in bodies], seal,
                         {})


async def _send_with_ids(url: str, destination: str, messages: Sequence[tuple[bytes, str]],
                         seal: Seal | None, headers: Mapping[str, str]) -> None:
    """Send each ``(body, mdb_id)`` with ``headers`` through the seam, proven with ``seal``
    if given."""
    await _send_through_the_seam(
        url, destination, [(body, {**headers, ID: mdb_id}) for body, mdb_id in messages], seal)


async def _send_through_the_seam(url: str, destination: str,
                                 messages: Sequence[tuple[bytes, Mapping[str, str]]],
                                 seal: Seal | None) -> None:
    """Send each ``(body, headers)`` through the seam, as text, proven with ``seal`` if
    given."""
    connection = await broker_for(ConnectionOptions(url=url, client_id=unique("w"))).connect()
    try:
        for body, headers in messages:
            message = OutgoingMessage(body, {"content-type": "text/plain", **headers})
            await connection.send(Destination.parse(destination),
                                  message if seal is None else seal.sealed(message))
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

