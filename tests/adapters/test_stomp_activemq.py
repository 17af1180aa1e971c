"""The stomp+activemq adapter, driven directly through the broker seam against a real ActiveMQ.

The broker is started by ``tests.harness.activemq``: one for this module. What ActiveMQ and
RabbitMQ share (a killed or hung broker, connect failures) is tested once per broker in
``test_stomp_brokers``; the seam's general rules (transactions, prefetch, ``receive_nowait``,
stale objects) once for all three adapters by ``test_seam`` (``mdb.testing.seam``). Without
ActiveMQ installed the tests are skipped, except in CI (``CI=true``) where that is a failure.
Every wait is bounded by ``fail_after`` so a broken adapter fails instead of hanging; nothing
asserts a duration.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from mdb.broker import ConnectionOptions
from mdb.errors import BrokerError, ConfigurationError, SubscriptionFailed
from mdb.message import ID, OutgoingMessage, new_id
from mdb_stomp import StompBroker
from tests.adapters.stomp_support import (
    connected,
    message,
    queue_request,
    receive,
    unique,
)
from tests.harness.activemq import ActiveMQ
from tests.harness.brokers import private_brokers

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def activemq() -> Iterator[ActiveMQ]:
    """This module's own broker (shadows any session-wide one: these tests leave queues)."""
    with private_brokers("activemq") as [broker]:
        assert isinstance(broker, ActiveMQ)
        yield broker


# -- sending and receiving -------------------------------------------------------------------


async def test_send_and_receive_on_a_queue_round_trips_body_and_headers(activemq: ActiveMQ) -> None:
    queue = unique("queue")
    tricky = "a:b\\c\nd"  # every character STOMP 1.2 must escape in a header
    text = message("héllo\nworld", app_header=tricky)
    binary = OutgoingMessage(
        b"\x00\x01\xffbin", {ID: new_id(), "content-type": "application/octet-stream"}
    )
    async with connected(activemq.url) as connection:
        subscription = await connection.subscribe(queue_request(queue, prefetch=10))
        await connection.send(queue, text)
        await connection.send(queue, binary)

        first = await receive(subscription)
        second = await receive(subscription)

        assert first.destination == queue
        assert first.body == text.body
        assert first.headers[ID] == text.headers[ID]
        assert first.headers["app_header"] == tricky
        assert first.headers["content-type"] == "text/plain"
        assert first.headers["persistent"] == "true"
        assert first.headers["amq-msg-type"] == "text"  # a Java consumer sees a TextMessage
        assert first.message_id == first.headers["message-id"] and not first.broker_redelivered
        assert second.body == binary.body
        assert second.headers[ID] == binary.headers[ID]
        assert second.headers.get("amq-msg-type") != "text"
        assert subscription.requeue_destination == queue

        await connection.ack(first)
        await connection.ack(second)


# -- transactions ----------------------------------------------------------------------------


async def test_an_ack_that_would_also_settle_an_unsettled_earlier_delivery_is_refused(
    activemq: ActiveMQ,
) -> None:
    # Client acks are cumulative and ABORT leaves the acked message unsettled: acking the next
    # one would silently settle the aborted one for good (measured on ActiveMQ 5.17.2).
    queue = unique("queue")
    async with connected(activemq.url) as connection:
        sent = [message(f"m{i}") for i in range(4)]
        for item in sent:
            await connection.send(queue, item)
        subscription = await connection.subscribe(queue_request(queue, prefetch=4))
        first, second, third, fourth = [await receive(subscription) for _ in sent]

        aborted = await connection.begin()
        await aborted.ack(first)
        await aborted.abort()
        later = await connection.begin()
        with pytest.raises(BrokerError, match="cumulative"):
            await later.ack(second)
        await later.abort()
        with pytest.raises(BrokerError, match="cumulative"):
            await connection.ack(second)

        # Settling in order works: the way the container requeues a failed delivery.
        requeue = await connection.begin()
        await requeue.ack(first)
        await requeue.ack(second)
        await requeue.commit()
        with pytest.raises(BrokerError, match="already settled"):
            await connection.ack(first)
        await connection.ack(third)
        await connection.ack(fourth)

        # Nothing is left to redeliver.
        await subscription.close()
        marker = message("marker")
        await connection.send(queue, marker)
        again = await connection.subscribe(queue_request(queue))
        assert (await receive(again)).headers[ID] == marker.headers[ID]


async def test_prefetch_bounds_unsettled_deliveries(activemq: ActiveMQ) -> None:
    queue = unique("queue")
    async with connected(activemq.url) as connection:
        sent = [message(f"m{i}") for i in range(5)]
        for item in sent:
            await connection.send(queue, item)
        bounded = await connection.subscribe(queue_request(queue, prefetch=2))
        held = [await receive(bounded), await receive(bounded)]

        # Every message goes to one consumer only: if the first had been pushed more than its
        # prefetch, the second could not get all the remaining three.
        rest = await connection.subscribe(queue_request(queue, prefetch=10))
        others = [await receive(rest) for _ in range(3)]
        ids = [d.headers[ID] for d in held + others]
        assert sorted(ids) == sorted(m.headers[ID] for m in sent)
        assert [d.headers[ID] for d in held] == [m.headers[ID] for m in sent[:2]]


async def test_an_invalid_selector_is_a_subscription_failure(activemq: ActiveMQ) -> None:
    queue = unique("queue")
    async with connected(activemq.url) as connection:
        with pytest.raises(SubscriptionFailed, match="refused"):
            await connection.subscribe(queue_request(queue, selector="colour = = 'red'"))
        assert connection.is_open

        selective = await connection.subscribe(
            queue_request(queue, prefetch=10, selector="colour = 'red'")
        )
        await connection.send(queue, message("blue", colour="blue"))
        red = message("red", colour="red")
        await connection.send(queue, red)
        assert (await receive(selective)).headers[ID] == red.headers[ID]


# -- configuration ---------------------------------------------------------------------------


def test_urls_the_adapter_cannot_serve_are_configuration_errors() -> None:
    for url in (
        "stomp+nosuchbroker://localhost:61613",
        "stomp+activemq://",
        "stomp+activemq://h:x",
    ):
        with pytest.raises(ConfigurationError):
            StompBroker(ConnectionOptions(url=url))
