"""The stomp+activemq adapter, driven directly through the broker seam against a real ActiveMQ.

The broker is started by ``tests.harness.activemq``: one per module for the ordinary tests, a
private one for each test that kills or hangs it. Without ActiveMQ installed the tests are
skipped, except in CI (``CI=true``) where that is a failure. Every wait is bounded by
``fail_after`` so a broken adapter fails instead of hanging; nothing asserts a duration.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import anyio
import pytest

from mdb.broker import ConnectionOptions, Delivery, Subscription, SubscriptionRequest
from mdb.destinations import Destination
from mdb.errors import (
    BrokerError,
    ConfigurationError,
    ConnectionFailed,
    ConnectionLost,
    SendOutcomeUnknown,
    SubscriptionFailed,
    TransactionRolledBack,
)
from mdb.message import ID, OutgoingMessage, new_id
from mdb_stomp import StompBroker, StompConnection
from tests.harness.activemq import ActiveMQ, activemq_available, free_port

pytestmark = pytest.mark.anyio

WAIT = 15.0  # bound on any single wait: a hang guard, not a timing assertion


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _require_activemq() -> None:
    if activemq_available():
        return
    if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
        pytest.fail("ActiveMQ (Debian package 'activemq') and java are required when CI=true")
    pytest.skip("ActiveMQ is not installed (apt-get install activemq)")


@pytest.fixture(scope="module")
def activemq() -> Iterator[ActiveMQ]:
    """This module's own broker (shadows any session-wide one: these tests leave queues)."""
    _require_activemq()
    broker = ActiveMQ().start()
    yield broker
    broker.close()


@pytest.fixture
def private_activemq() -> Iterator[ActiveMQ]:
    """A broker of the test's own, for tests that kill or hang it."""
    _require_activemq()
    broker = ActiveMQ().start()
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


async def test_topic_subscription_is_shared_by_name_and_each_name_gets_a_copy(
    activemq: ActiveMQ,
) -> None:
    topic = unique("topic")
    async with connected(activemq.url) as one, connected(activemq.url) as two:
        shared_a = await one.subscribe(topic_request(topic, "shared"))
        shared_b = await two.subscribe(topic_request(topic, "shared"))
        other = await one.subscribe(topic_request(topic, "other-name", prefetch=10))
        sent = [message(f"m{i}") for i in range(2)]
        for item in sent:
            await one.send(topic, item)

        # Prefetch 1 and nothing acked: each subscriber of "shared" holds one message. Were
        # they separate subscriptions, both would have started with the first message.
        got_a = await receive(shared_a)
        got_b = await receive(shared_b)
        assert {got_a.headers[ID], got_b.headers[ID]} == {m.headers[ID] for m in sent}
        assert got_a.destination == got_b.destination == topic

        copies = [await receive(other) for _ in sent]
        assert [d.headers[ID] for d in copies] == [m.headers[ID] for m in sent]

        # The requeue destination reaches this subscription and no other.
        assert shared_a.requeue_destination == shared_b.requeue_destination
        assert shared_a.requeue_destination.name == f"Consumer.shared.VirtualTopic.{topic.name}"
        assert other.requeue_destination.name == f"Consumer.other-name.VirtualTopic.{topic.name}"
        await one.ack(got_a)
        await two.ack(got_b)
        requeued = message("again")
        await one.send(shared_a.requeue_destination, requeued)
        marker = message("marker")
        await one.send(other.requeue_destination, marker)
        for copy in copies:
            await one.ack(copy)
        assert (await receive(other)).headers[ID] == marker.headers[ID]
        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as group:
                winner: list[Delivery] = []

                async def take(subscription: Subscription) -> None:
                    winner.append(await subscription.receive())
                    group.cancel_scope.cancel()

                group.start_soon(take, shared_a)
                group.start_soon(take, shared_b)
        assert [d.headers[ID] for d in winner] == [requeued.headers[ID]]


async def test_topic_subscriptions_the_dialect_cannot_make_are_refused(activemq: ActiveMQ) -> None:
    topic = unique("topic")
    async with connected(activemq.url) as connection:
        with pytest.raises(SubscriptionFailed, match="durable"):
            await connection.subscribe(
                SubscriptionRequest(topic, "n", durable=False, selector=None, prefetch=1)
            )
        with pytest.raises(SubscriptionFailed, match="name"):
            await connection.subscribe(
                SubscriptionRequest(topic, None, durable=True, selector=None, prefetch=1)
            )
        with pytest.raises(SubscriptionFailed, match="may contain only"):
            await connection.subscribe(topic_request(topic, "bad/name*"))
        assert connection.is_open


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


# -- failures --------------------------------------------------------------------------------


async def test_a_killed_broker_makes_everything_on_the_connection_stale(
    private_activemq: ActiveMQ,
) -> None:
    queue = unique("queue")
    connection = await StompBroker(options(private_activemq.url)).connect()
    subscription = await connection.subscribe(queue_request(queue))
    sent = message("in flight")
    await connection.send(queue, sent)
    delivery = await receive(subscription)
    transaction = await connection.begin()
    await transaction.ack(delivery)

    await anyio.to_thread.run_sync(private_activemq.kill)

    with pytest.raises(ConnectionLost):
        await receive(subscription)
    assert not connection.is_open
    with pytest.raises(TransactionRolledBack):
        await transaction.commit()
    with pytest.raises(ConnectionLost):
        await connection.send(queue, message("never sent"))
    with pytest.raises(ConnectionLost):
        await connection.begin()
    with pytest.raises(ConnectionLost):
        await connection.subscribe(queue_request(queue))
    with anyio.fail_after(WAIT):
        await subscription.close()
        await connection.close()

    # The reference config keeps the redelivered flag across the crash (persistJMSRedelivered).
    await anyio.to_thread.run_sync(private_activemq.restart)
    async with connected(private_activemq.url) as fresh:
        with pytest.raises(ConnectionLost):
            await fresh.ack(delivery)  # from the old connection: never written
        stale = await fresh.begin()
        with pytest.raises(ConnectionLost):
            await stale.ack(delivery)
        with pytest.raises(TransactionRolledBack):
            await stale.commit()
        again = await receive(await fresh.subscribe(queue_request(queue)))
        assert again.headers[ID] == sent.headers[ID]
        assert again.broker_redelivered
        await fresh.ack(again)


async def test_a_hung_broker_is_noticed_by_heartbeats_and_receipts(
    private_activemq: ActiveMQ,
) -> None:
    queue = unique("queue")
    async with connected(
        private_activemq.url, heartbeat_ms=1000, receipt_timeout=0.5
    ) as connection:
        subscription = await connection.subscribe(queue_request(queue))
        transaction = await connection.begin()
        await transaction.send(queue, message("held"))

        private_activemq.pause()
        try:
            with pytest.raises(SendOutcomeUnknown):
                await connection.send(queue, message("unconfirmed"))
            with pytest.raises(TransactionRolledBack):
                await transaction.commit()
            with pytest.raises(ConnectionLost):
                await receive(subscription)  # the heartbeat timeout ends the connection
            assert not connection.is_open
            with pytest.raises(ConnectionFailed):
                with anyio.fail_after(WAIT):
                    await StompBroker(options(private_activemq.url, connect_timeout=1.0)).connect()
        finally:
            private_activemq.resume()


async def test_connect_to_a_closed_port_fails() -> None:
    url = f"stomp+activemq://127.0.0.1:{free_port()}"
    with pytest.raises(ConnectionFailed):
        with anyio.fail_after(WAIT):
            await StompBroker(options(url, connect_timeout=2.0)).connect()


async def test_connect_to_a_server_that_never_answers_fails_at_the_deadline() -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()  # the kernel completes the TCP handshake; nobody ever replies
        url = f"stomp+activemq://127.0.0.1:{silent.getsockname()[1]}"
        with pytest.raises(ConnectionFailed, match="CONNECTED"):
            with anyio.fail_after(WAIT):
                await StompBroker(options(url, connect_timeout=1.0)).connect()


def test_urls_the_adapter_cannot_serve_are_configuration_errors() -> None:
    for url in (
        "stomp+nosuchbroker://localhost:61613",
        "stomp+activemq://",
        "stomp+activemq://h:x",
    ):
        with pytest.raises(ConfigurationError):
            StompBroker(ConnectionOptions(url=url))
