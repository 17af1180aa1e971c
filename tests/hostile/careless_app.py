"""A careless listener module, for tests/hostile/test_failure_secrets.py: its handler fails with
secrets in the exception's text and in its own code, and ``mdb run tests.hostile.careless_app``
sends it two messages at startup (memory broker)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from dependency_injector import containers, providers

from mdb import Redelivery, listener
from mdb.messages.destinations import Destination
from mdb.messages.message import OutgoingMessage
from mdb.seam.broker import ConnectionOptions
from mdb.seam.registry import broker_for

CARD = "4111 1111 1111 1111"
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl"
SECRETS = ("hunter2", "pa55word", "tok-9f8e7d6c", "dict-secret", JWT, "key-5551212",
           "unix-secret", CARD)
TEXT = (f"password=pa55word, token: tok-9f8e7d6c, options {{'password': 'dict-secret'}}, "
        f"Authorization: Bearer {JWT}, passwd: unix-secret, GET /v1?api_key=key-5551212&page=1")
BODIES = ("secrets", "card")


def connect(url: str) -> None:
    raise ConnectionError(f"cannot reach {url}: {TEXT}")


def fail(body: str) -> None:
    """Fail as a careless handler does: with secrets in the text, and a card in ``int()``'s."""
    if body == "card":
        int(CARD)
    connect("postgresql://shop:hunter2@db:5432/orders")  # a secret in the code's own line


async def messages() -> AsyncIterator[None]:
    connection = await broker_for(ConnectionOptions(url="memory://", client_id="p")).connect()
    for body in BODIES:
        await connection.send(Destination.parse("queue:work"),
                              OutgoingMessage(body.encode(), {}))
    await connection.close()
    yield None


class Services(containers.DeclarativeContainer):
    messages = providers.Resource(messages)


@listener("queue:work", redelivery=Redelivery(limit=1, delay=0))
async def on_work(body: str) -> None:
    fail(body)
