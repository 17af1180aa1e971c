"""The stomp+activemq adapter, driven directly through the broker seam against a real ActiveMQ.

The broker is started by ``tests.harness.activemq``: one for this module. What ActiveMQ and
RabbitMQ share (a killed or hung broker, connect failures) is tested once per broker in
``test_stomp_brokers``. Without ActiveMQ installed the tests are skipped, except in CI
(``CI=true``) where that is a failure. Every wait is bounded by ``fail_after`` so a broken
adapter fails instead of hanging; nothing asserts a duration.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from mdb.broker import ConnectionOptions
from mdb.errors import BrokerError, ConfigurationError, ConnectionLost, SubscriptionFailed
from mdb.message import ID, OutgoingMessage, new_id
from mdb_stomp import StompBroker
from tests.adapters.stomp_support import (
    connected,
    message,
    queue_request,
    receive,
    unique,
)
from tests.conftest import private_brokers
from tests.harness.activemq import ActiveMQ

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
        assert first.broker_message_id and not first.broker_redelivered
        assert second.body == binary.body
        assert second.headers[ID] == binary.headers[ID]
        assert second.headers.get("amq-msg-type") != "text"
        assert subscription.requeue_destination == queue

        await connection.ack(first)
        await connection.ack(second)


# -- transactions ----------------------------------------------------------------------------


async def test_commit_makes_ack_and_send_take_effect_together(activemq: ActiveMQ) -> None:
    source, target = unique("queue"), unique("queue")
    async with connected(activemq.url) as connection:
        consumer = await connection.subscribe(queue_request(source))
        watcher = await connection.subscribe(queue_request(target, prefetch=10))
        original = message("original")
        await connection.send(source, original)
        delivery = await receive(consumer)

        transaction = await connection.begin()
        await transaction.ack(delivery)
        forwarded = message("forwarded")
        await transaction.send(target, forwarded)
        before = message("sent before the commit")
        await connection.send(target, before)
        # Queues are FIFO: had the transacted send escaped early it would come first.
        assert (await receive(watcher)).headers[ID] == before.headers[ID]

        await transaction.commit()
        assert (await receive(watcher)).headers[ID] == forwarded.headers[ID]

        # The ack took effect too: after resubscribing, the next message is a new one.
        await consumer.close()
        after = message("after")
        await connection.send(source, after)
        again = await connection.subscribe(queue_request(source))
        assert (await receive(again)).headers[ID] == after.headers[ID]


async def test_abort_discards_sends_and_leaves_the_delivery_unsettled(activemq: ActiveMQ) -> None:
    source, target = unique("queue"), unique("queue")
    async with connected(activemq.url) as connection:
        consumer = await connection.subscribe(queue_request(source))
        watcher = await connection.subscribe(queue_request(target, prefetch=10))
        original = message("original")
        await connection.send(source, original)
        delivery = await receive(consumer)

        transaction = await connection.begin()
        await transaction.ack(delivery)
        await transaction.send(target, message("discarded"))
        await transaction.abort()
        await transaction.abort()  # idempotent, never raises

        marker = message("marker")
        await connection.send(target, marker)
        assert (await receive(watcher)).headers[ID] == marker.headers[ID]

        await consumer.close()
        again = await connection.subscribe(queue_request(source))
        redelivered = await receive(again)
        assert redelivered.headers[ID] == original.headers[ID]
        assert redelivered.broker_redelivered


async def test_an_unsettled_delivery_comes_back_redelivered_after_the_subscription_closes(
    activemq: ActiveMQ,
) -> None:
    queue = unique("queue")
    async with connected(activemq.url) as connection:
        sent = message("unsettled")
        await connection.send(queue, sent)
        first = await connection.subscribe(queue_request(queue))
        delivery = await receive(first)
        assert not delivery.broker_redelivered
        await first.close()
        await first.close()  # idempotent

        with pytest.raises(ConnectionLost):
            await connection.ack(delivery)  # stale: its subscription is gone
        with pytest.raises(ConnectionLost):
            await first.receive()

        second = await connection.subscribe(queue_request(queue))
        again = await receive(second)
        assert again.headers[ID] == sent.headers[ID]
        assert again.broker_message_id == delivery.broker_message_id
        assert again.broker_redelivered
        await connection.ack(again)


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


async def test_receive_nowait_shares_the_stream_of_receive_and_never_waits(
    activemq: ActiveMQ,
) -> None:
    queue = unique("queue")
    async with connected(activemq.url) as connection:
        subscription = await connection.subscribe(queue_request(queue, prefetch=3))
        assert subscription.receive_nowait() is None
        sent = [message(f"m{i}") for i in range(3)]
        for item in sent:
            await connection.send(queue, item)
        got = [await receive(subscription)]
        while len(got) < 3:  # each one either already here, or awaited
            got.append(subscription.receive_nowait() or await receive(subscription))
        assert [d.headers[ID] for d in got] == [m.headers[ID] for m in sent]
        assert subscription.receive_nowait() is None  # all three are held: nothing more comes
        for delivery in got:
            await connection.ack(delivery)
        await subscription.close()
        assert subscription.receive_nowait() is None


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
