"""The stomp adapter's behaviour that is the same on ActiveMQ and RabbitMQ: a round trip of
body and headers, named topic subscriptions shared by name or refused, a browse holding a page
at most, a killed broker, a hung broker, and connect failures.
Each test runs once per broker (``pytest.mark.activemq`` / ``pytest.mark.rabbitmq``); the
broker-specific facts are pinned in ``test_stomp_activemq`` and ``test_stomp_rabbitmq``.

The tests that kill or hang a broker get a private one of their own (``private_broker``), the
others use the session's (``broker``: the ``activemq`` and ``rabbitmq`` fixtures of
``tests/conftest.py``). Every wait is bounded by ``fail_after``; nothing asserts a duration.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
import threading
import time
from collections.abc import Iterator
from typing import cast

import anyio
import pytest

from mdb.errors import (
    ConnectionFailed,
    ConnectionLost,
    SendOutcomeUnknown,
    SubscriptionFailed,
    TransactionRolledBack,
)
from mdb.messages.destinations import Destination
from mdb.messages.headers import ID
from mdb.messages.message import OutgoingMessage, new_id
from mdb.seam.broker import PAGE, Delivery, Subscription, SubscriptionRequest
from mdb_stomp import StompBroker
from mdb_stomp.protocol.wire import Wire
from mdb_stomp.subscriptions.subscription import StompSubscription
from tests.adapters.stomp_support import (
    WAIT,
    connected,
    message,
    new_destination,
    options,
    queue_request,
    receive,
    send_messages,
    topic_request,
)
from tests.harness.servers.brokers import private_brokers
from tests.harness.servers.process import BrokerProcess, free_port

pytestmark = pytest.mark.anyio

BROKERS = [
    pytest.param("activemq", marks=pytest.mark.activemq),
    pytest.param("rabbitmq", marks=pytest.mark.rabbitmq),
]
SCHEMES = ["stomp+activemq", "stomp+rabbitmq"]


@pytest.fixture(params=BROKERS)
def broker(request: pytest.FixtureRequest) -> BrokerProcess:
    """The session's broker (``tests/conftest.py``), for tests that leave it as they found it."""
    return cast(BrokerProcess, request.getfixturevalue(request.param))


@pytest.fixture(params=BROKERS)
def private_broker(request: pytest.FixtureRequest) -> Iterator[BrokerProcess]:
    """A broker of the test's own, for tests that kill or hang it."""
    with private_brokers(request.param) as [broker]:
        yield broker


async def test_send_and_receive_on_a_queue_round_trips_body_and_headers(
    broker: BrokerProcess,
) -> None:
    queue = new_destination("queue")
    tricky = "a:b\\c\nd"  # every character STOMP 1.2 must escape in a header
    text = message("héllo\nworld", app_header=tricky)
    binary = OutgoingMessage(
        b"\x00\x01\xffbin", {ID: new_id(), "content-type": "application/octet-stream"}
    )
    async with connected(broker.url) as connection:
        subscription = await connection.subscribe(queue_request(queue, prefetch=10))
        await connection.send(queue, text)
        await connection.send(queue, binary)

        first = await receive(subscription)
        second = await receive(subscription)

        assert first.destination == queue
        assert first.body == text.body
        assert first.headers[ID] == text.headers[ID]
        assert first.headers["app_header"] == tricky
        assert first.headers["persistent"] == "true"
        assert not first.broker_redelivered
        assert second.body == binary.body
        assert second.headers[ID] == binary.headers[ID]
        assert subscription.requeue_destination == queue
        if broker.scheme == "stomp+activemq":
            assert first.headers["content-type"] == "text/plain"
            assert first.headers["amq-msg-type"] == "text"  # a Java consumer sees a TextMessage
            assert first.message_id == first.headers["message-id"]
            assert second.headers.get("amq-msg-type") != "text"
        else:
            assert "amq-msg-type" not in first.headers  # an ActiveMQ-only header
            # RabbitMQ keeps no id of its own for a message: its message-id names this delivery.
            assert first.message_id is None

        await connection.ack(first)
        await connection.ack(second)


# Where each dialect puts the queue behind a named topic subscription: ActiveMQ's virtual topic
# consumer queue, RabbitMQ's x-queue-name queue. Either way a plain queue is the requeue
# destination, reaching that subscription and no other.
SHARED_QUEUE = {
    "stomp+activemq": "queue:Consumer.{name}.VirtualTopic.{topic}",
    "stomp+rabbitmq": "queue:Consumer.{name}.{topic}",
}


async def test_a_named_topic_subscription_is_shared_and_each_name_gets_a_copy(
    broker: BrokerProcess,
) -> None:
    topic = new_destination("topic")
    shared_queue = SHARED_QUEUE[broker.scheme]
    async with connected(broker.url) as one, connected(broker.url) as two:
        shared_a = await one.subscribe(topic_request(topic, "shared"))
        shared_b = await two.subscribe(topic_request(topic, "shared"))
        other = await one.subscribe(topic_request(topic, "other-name", prefetch=10))
        sent = await send_messages(one, topic, 2)

        # Prefetch 1 and nothing acked: each subscriber of "shared" holds one message. Were
        # they separate subscriptions, both would have started with the first message.
        got_a = await receive(shared_a)
        got_b = await receive(shared_b)
        assert {got_a.headers[ID], got_b.headers[ID]} == {m.headers[ID] for m in sent}
        assert got_a.destination == got_b.destination == topic

        copies = [await receive(other) for _ in sent]
        assert [d.headers[ID] for d in copies] == [m.headers[ID] for m in sent]

        assert shared_a.requeue_destination == shared_b.requeue_destination
        assert shared_a.requeue_destination == Destination.parse(
            shared_queue.format(name="shared", topic=topic.name)
        )
        assert other.requeue_destination == Destination.parse(
            shared_queue.format(name="other-name", topic=topic.name)
        )
        await one.ack(got_a)
        await two.ack(got_b)
        for copy in copies:
            await one.ack(copy)
        requeued = message("again")
        await one.send(shared_a.requeue_destination, requeued)
        marker = message("marker")
        await one.send(other.requeue_destination, marker)
        # "other" gets the marker and not the requeued message: it reaches only "shared".
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


# A subscription name each dialect refuses: "/" and "*" mean something to ActiveMQ's
# destinations, "." to RabbitMQ's routing keys.
BAD_NAME = {"stomp+activemq": "bad/name*", "stomp+rabbitmq": "bad.name"}


async def test_topic_subscriptions_the_dialect_cannot_make_are_refused(
    broker: BrokerProcess,
) -> None:
    topic = new_destination("topic")
    async with connected(broker.url) as connection:
        with pytest.raises(SubscriptionFailed, match="durable"):
            await connection.subscribe(
                SubscriptionRequest(topic, "n", durable=False, selector=None, prefetch=1)
            )
        with pytest.raises(SubscriptionFailed, match="name"):
            await connection.subscribe(
                SubscriptionRequest(topic, None, durable=True, selector=None, prefetch=1)
            )
        with pytest.raises(SubscriptionFailed, match="may contain only"):
            await connection.subscribe(topic_request(topic, BAD_NAME[broker.scheme]))
        assert connection.is_open


async def test_a_browse_holds_a_page_at_most_whatever_the_size_of_the_queue(
        broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    read = [0]  # MESSAGE frames read by every connection of the process
    on_message = Wire.on_message

    def counted(wire: Wire, headers: dict[str, str], body: bytes | str | None) -> None:
        read[0] += 1
        on_message(wire, headers, body)

    queue, elsewhere = new_destination("queue"), new_destination("queue")
    async with connected(broker.url) as connection:
        await send_messages(connection, queue, 3 * PAGE)
        monkeypatch.setattr(Wire, "on_message", counted)
        held = handed = 0
        with anyio.fail_after(WAIT):
            async with contextlib.aclosing(connection.browse(queue)) as browse:
                async for _ in browse:
                    handed += 1
                    # A round trip to the broker for each: time for it to send what it would.
                    await connection.send(elsewhere, message("x"))
                    held = max(held, read[0] - handed)
    assert handed == 3 * PAGE
    assert 0 < held <= PAGE


async def test_a_killed_broker_makes_everything_stale_and_redelivers_flagged_after_restart(
    private_broker: BrokerProcess,
) -> None:
    queue = new_destination("queue")
    # The queue outlives the crash: a broker may lose a queue declared moments before a kill
    # -9, with what was confirmed into it (docs/failover.md, "Known limits"): RabbitMQ did,
    # in 2 runs of this test in 20. A clean restart stores it.
    async with connected(private_broker.url) as declaring:
        await (await declaring.subscribe(queue_request(queue))).close()
    await anyio.to_thread.run_sync(private_broker.restart)
    connection = await StompBroker(options(private_broker.url)).connect()
    subscription = await connection.subscribe(queue_request(queue))
    sent = message("in flight")
    await connection.send(queue, sent)
    delivery = await receive(subscription)
    transaction = await connection.begin()
    await transaction.ack(delivery)

    await anyio.to_thread.run_sync(private_broker.kill)

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

    # ActiveMQ keeps the redelivered flag across the crash through the reference config
    # (persistJMSRedelivered). RabbitMQ usually does, but one full-suite run saw this test fail
    # on RabbitMQ (not reproduced in 8 runs alone); RabbitMQ journals the "delivered" mark
    # asynchronously, so the flag is not asserted there (see docs/rabbitmq.md).
    await anyio.to_thread.run_sync(private_broker.restart)
    async with connected(private_broker.url) as fresh:
        with pytest.raises(ConnectionLost):
            await fresh.ack(delivery)  # from the old connection: never written
        stale = await fresh.begin()
        with pytest.raises(ConnectionLost):
            await stale.ack(delivery)
        with pytest.raises(TransactionRolledBack):
            await stale.commit()
        again = await receive(await fresh.subscribe(queue_request(queue)))
        assert again.headers[ID] == sent.headers[ID]
        if private_broker.scheme == "stomp+activemq":
            assert again.broker_redelivered
        await fresh.ack(again)


async def test_a_hung_broker_is_noticed_by_heartbeats_and_receipts(
    private_broker: BrokerProcess,
) -> None:
    queue = new_destination("queue")
    async with connected(private_broker.url, heartbeat_ms=1000, receipt_timeout=0.5) as connection:
        subscription = await connection.subscribe(queue_request(queue))
        transaction = await connection.begin()
        await transaction.send(queue, message("held"))

        private_broker.pause()
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
                    await StompBroker(options(private_broker.url, connect_timeout=1.0)).connect()
        finally:
            private_broker.resume()


async def test_a_delivery_buffered_before_the_process_froze_is_not_handed_on_after_it(
    broker: BrokerProcess,
) -> None:
    """A process paused (SIGSTOP, a suspended VM) past the silence its heart-beats allow may
    resume and take a delivery it had read before the pause, while the broker gave up on it
    meanwhile and handed that delivery to another consumer: it is not handed on, the connection
    is lost, and the broker delivers it again."""
    queue = new_destination("queue")
    async with connected(broker.url) as producer:
        for body in ("first", "buffered"):
            await producer.send(queue, message(body))
    async with connected(broker.url, heartbeat_ms=1000) as connection:
        subscription = await connection.subscribe(queue_request(queue, prefetch=2))
        first = await receive(subscription)
        assert isinstance(subscription, StompSubscription)
        with anyio.fail_after(WAIT):
            while len(subscription.unsettled) < 2:  # the second read and buffered, not taken
                await anyio.sleep(0.01)
        # The pause: the loop runs nothing, reads nothing. mdb's limit is 0.625 s on ActiveMQ
        # and 2.5 s on RabbitMQ (whose heart-beats count in whole seconds:
        # mdb_stomp.protocol.heartbeats).
        time.sleep(1.0 if broker.scheme == "stomp+activemq" else 3.0)
        with pytest.raises(ConnectionLost, match="nothing heard for"):
            await receive(subscription)
        assert not connection.is_open
    async with connected(broker.url) as fresh:
        subscription = await fresh.subscribe(queue_request(queue, prefetch=2))
        again = [await receive(subscription) for _ in range(2)]
        assert sorted(d.body for d in again) == [b"buffered", b"first"]
        assert first.headers[ID] in {d.headers[ID] for d in again}
        for delivery in again:
            await fresh.ack(delivery)


@pytest.mark.parametrize("scheme", SCHEMES)
async def test_connect_to_a_closed_port_fails(scheme: str) -> None:
    url = f"{scheme}://127.0.0.1:{free_port()}"
    with pytest.raises(ConnectionFailed):
        with anyio.fail_after(WAIT):
            await StompBroker(options(url, connect_timeout=2.0)).connect()


@pytest.mark.parametrize("scheme", SCHEMES)
async def test_connect_to_a_server_that_never_answers_fails_at_the_deadline(scheme: str) -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()  # the kernel completes the TCP handshake; nobody ever replies
        url = f"{scheme}://127.0.0.1:{silent.getsockname()[1]}"
        with pytest.raises(ConnectionFailed, match="CONNECTED"):
            with anyio.fail_after(WAIT):
                await StompBroker(options(url, connect_timeout=1.0)).connect()


@pytest.mark.parametrize("scheme", SCHEMES)
async def test_connect_to_a_server_that_closes_at_once_fails_and_leaves_nothing_unretrieved(
        scheme: str) -> None:
    # A broker that accepts and closes (one starting or stopping: a slave taking over) fails
    # the CONNECT while the TCP connect still runs. Each failure must be taken by the connect:
    # a failed future nobody retrieved is reported by asyncio when it is collected.
    unretrieved: list[str] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _, context: unretrieved.append(context["message"]))
    with socket.socket() as closing:
        closing.bind(("127.0.0.1", 0))
        closing.listen(64)
        url = f"{scheme}://127.0.0.1:{closing.getsockname()[1]}"

        def close_each() -> None:
            with contextlib.suppress(OSError):  # the test closed the listening socket
                while True:
                    closing.accept()[0].close()

        threading.Thread(target=close_each, daemon=True).start()
        try:
            for _ in range(20):  # the loss wins the race against the TCP connect often
                with pytest.raises(ConnectionFailed), anyio.fail_after(WAIT):
                    await StompBroker(options(url, connect_timeout=2.0)).connect()
                gc.collect()
        finally:
            loop.set_exception_handler(None)
    assert unretrieved == []
