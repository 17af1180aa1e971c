"""The RabbitMQ equivalents of the Java interop tests (docs/interop.md): RabbitMQ has no
JMS client here, so both sides are mdb, on its STOMP plugin's own conventions: a requester's
``/temp-queue/`` in ``reply-to``, seen by the replier as a ``/reply-queue/``; and a retry copy
keeps what its STOMP frames carry (priority, expiration)."""

from __future__ import annotations

from typing import cast

import pytest

from mdb import Context, Producer, Redelivery, listener
from mdb.messages.copies import original_expiry
from mdb.messages.headers import DELIVERY_COUNT, ERROR_TYPE, ORIGINAL_EXPIRY
from tests.harness.apps.in_process import Calls, running, settings_for, unique
from tests.harness.servers.process import BrokerProcess
from tests.harness.traffic.messages import read

pytestmark = [pytest.mark.anyio, pytest.mark.rabbitmq]


async def test_a_request_travels_by_rabbitmqs_reply_queues(rabbitmq: BrokerProcess) -> None:
    queue = f"queue:{unique('rabbit_asks')}"
    reply_tos: list[str] = []

    @listener(queue)
    async def handler(body: str, ctx: Context) -> None:
        reply_tos.append(str(ctx.message.reply_to))
        await ctx.reply(body.upper(), {"answered_by": "mdb"})

    async with running(settings_for(rabbitmq.url), handler), \
            Producer(settings_for(rabbitmq.url)) as producer:
        reply = await producer.request(queue, "hello rabbit", timeout=30,
                                       correlation_id="rabbit-1")
    # The requester wrote reply-to:/temp-queue/<name>; RabbitMQ hands the replier a name of its
    # own making, which only it can route back.
    [reply_to] = reply_tos
    assert reply_to.startswith("/reply-queue/")
    assert (reply.body, reply.correlation_id, reply.headers["answered_by"]) == (
        b"HELLO RABBIT", "rabbit-1", "mdb")


async def test_retry_and_error_copies_on_rabbitmq_keep_priority_and_expiration(
        rabbitmq: BrokerProcess) -> None:
    """RabbitMQ's STOMP plugin reads ``priority`` and ``expiration`` (a TTL in ms) on a SEND as
    the AMQP properties, and writes them on each MESSAGE frame: a retry copy sends them again,
    its ``expiration`` the time left to the expiry mdb keeps in ``mdb_expires``; the error copy
    its priority, and its original's expiry as ``mdb_original_expiry`` only."""
    queue, errors = f"queue:{unique('rabbit_copy')}", f"queue:{unique('rabbit_copy_errors')}"
    calls = Calls()
    kept = ("priority", "expiration", "persistent", "region", "mdb_expires")

    @listener(queue, redelivery=Redelivery(limit=1, delay=0), error_destination=errors)
    async def handler(body: str, ctx: Context) -> None:
        calls.add("seen", {k: ctx.headers.get(k) for k in kept})
        raise RuntimeError("refused")

    async with Producer(settings_for(rabbitmq.url)) as producer:
        await producer.send(queue, "keep me",
                            {"priority": "8", "expiration": "3600000", "region": "eu"})
    async with running(settings_for(rabbitmq.url), handler):
        [moved] = await read(rabbitmq.url, errors, 1)
    first, again = (cast(dict[str, str], seen) for seen in calls.of("seen"))
    left = [int(headers.pop("expiration") or 0) for headers in (first, again)]
    assert left[0] == 3_600_000 >= left[1] > 0
    assert first["mdb_expires"].isdigit()
    assert first == {"priority": "8", "persistent": "true", "region": "eu",
                     "mdb_expires": first["mdb_expires"]}
    assert again == first
    assert {k: moved.headers.get(k) for k in kept} == {
        "priority": "8", "persistent": "true", "region": "eu", "expiration": None,
        "mdb_expires": None}
    assert moved.headers[ORIGINAL_EXPIRY] == original_expiry(int(first["mdb_expires"]))[
        ORIGINAL_EXPIRY]
    assert (moved.headers[DELIVERY_COUNT], moved.headers[ERROR_TYPE]) == ("2", "RuntimeError")
