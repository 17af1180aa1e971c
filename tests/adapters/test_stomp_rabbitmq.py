"""The stomp+rabbitmq adapter, driven directly through the broker seam against a real RabbitMQ.

These tests pin the RabbitMQ facts the dialect rests on (see ``mdb_stomp.dialects.rabbitmq``):
shared subscriptions through ``x-queue-name``, individual acks, selectors refused (the container
evaluates topic selectors itself), a new ``message-id`` on every delivery, and unacked deliveries
that only come back when their connection closes. The node is started by
``tests.harness.servers.rabbitmq``: one for this module.
What RabbitMQ and ActiveMQ share (a round trip, a killed or hung broker, connect failures) is
tested once per broker in ``test_stomp_brokers``, the seam's general rules (transactions,
prefetch, stale objects) by ``test_seam`` (``mdb.testing.seam``). Without RabbitMQ installed
the tests are skipped, except in CI (``CI=true``) where that is a failure. Every wait is
bounded by ``fail_after``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import anyio
import pytest

from mdb.errors import ConnectionLost, SendOutcomeUnknown, SubscriptionFailed
from mdb.messages.headers import ID
from mdb.messages.message import OutgoingMessage
from mdb.seam.broker import SubscriptionRequest
from mdb_stomp import RabbitMQDialect, StompBroker
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
from tests.harness.servers.rabbitmq import RabbitMQ

pytestmark = [pytest.mark.anyio, pytest.mark.rabbitmq]


@pytest.fixture(scope="module")
def rabbitmq() -> Iterator[RabbitMQ]:
    """This module's own node (shadows any session-wide one: these tests leave queues)."""
    with private_brokers("rabbitmq") as [broker]:
        assert isinstance(broker, RabbitMQ)
        yield broker


# -- browsing and taking ---------------------------------------------------------------------


async def test_a_browse_or_a_take_cut_short_leaves_no_marker_behind(rabbitmq: RabbitMQ) -> None:
    """A browse without a broker's browser, and a take, end at a marker of their own: however
    they end (closed early, cancelled), the queue holds its messages and nothing else
    (``mdb_stomp.queues.end_marker``)."""
    queue = new_destination("queue")
    async with connected(rabbitmq.url) as connection:
        await send_messages(connection, queue, 5)
        with anyio.fail_after(WAIT):
            async with contextlib.aclosing(connection.browse(queue)) as browse:
                first = await anext(browse)
            with anyio.CancelScope() as interrupted:  # Ctrl-C: the command is cancelled
                async with contextlib.aclosing(connection.browse(queue)) as browse:
                    await anext(browse)
                    interrupted.cancel()
                    await anext(browse)
    async with connected(rabbitmq.url) as connection:
        with anyio.fail_after(WAIT):
            async with contextlib.aclosing(connection.take(queue)) as take:
                await anext(take)  # not settled: the take's end hands it back
    async with connected(rabbitmq.url) as connection:
        with anyio.fail_after(WAIT), anyio.CancelScope() as interrupted:
            async with contextlib.aclosing(connection.take(queue)) as take:
                await anext(take)
                interrupted.cancel()
                await anext(take)
    assert rabbitmq.stored()[queue.name] == 5
    # RabbitMQ names each delivery anew: a browse shows none of its own frames' names.
    assert not {"message-id", "ack", "subscription"} & first.headers.keys()


# -- sending and receiving -------------------------------------------------------------------


async def test_an_amqp_message_id_its_producer_gave_is_the_messages_id(rabbitmq: RabbitMQ) -> None:
    """The id a foreign producer gives a message is all RabbitMQ keeps of one
    (``mdb.messages.identity`` knows a message sent without ``mdb_id`` by it)."""
    queue = new_destination("queue")
    async with connected(rabbitmq.url) as connection:
        subscription = await connection.subscribe(queue_request(queue, prefetch=10))
        await connection.send(queue, OutgoingMessage(b"x", {"amqp-message-id": "order-7"}))
        delivery = await receive(subscription)
        assert delivery.message_id == "order-7"
        await connection.ack(delivery)


async def test_a_durable_topic_subscription_keeps_messages_while_detached(
    rabbitmq: RabbitMQ,
) -> None:
    topic = new_destination("topic")
    async with connected(rabbitmq.url) as connection:
        first = await connection.subscribe(topic_request(topic, "keeper"))
        await first.close()
        kept = message("while away")
        await connection.send(topic, kept)
        again = await connection.subscribe(topic_request(topic, "keeper"))
        delivery = await receive(again)
        assert delivery.headers[ID] == kept.headers[ID]
        await connection.ack(delivery)


async def test_subscriptions_rabbitmq_cannot_honour_are_refused(rabbitmq: RabbitMQ) -> None:
    queue, topic = new_destination("queue"), new_destination("topic")
    async with connected(rabbitmq.url) as connection:
        # The STOMP plugin ignores the selector header and would deliver every message.
        with pytest.raises(SubscriptionFailed, match="does not support selectors"):
            await connection.subscribe(queue_request(queue, selector="colour = 'red'"))
        with pytest.raises(SubscriptionFailed, match="does not support selectors"):
            await connection.subscribe(
                SubscriptionRequest(topic, "n", durable=True, selector="a = 1", prefetch=1)
            )
        # What neither dialect can make (not durable, no name, a bad name) is refused in
        # test_stomp_brokers.
        assert connection.is_open


def test_the_dialect_is_chosen_by_the_url_scheme() -> None:
    broker = StompBroker(options("stomp+rabbitmq://127.0.0.1:61613"))
    assert isinstance(broker._dialect, RabbitMQDialect)
    assert RabbitMQDialect.vhost == "/"


# -- acks, transactions and redelivery -------------------------------------------------------


async def test_acks_are_individual_so_deliveries_may_be_settled_in_any_order(
    rabbitmq: RabbitMQ,
) -> None:
    queue = new_destination("queue")
    async with connected(rabbitmq.url) as connection:
        sent = await send_messages(connection, queue, 3)
        subscription = await connection.subscribe(queue_request(queue, prefetch=3))
        first, second, third = [await receive(subscription) for _ in sent]
        await connection.ack(second)  # with ack:client this would settle "first" too
        transaction = await connection.begin()
        await transaction.ack(third)
        await transaction.commit()
        # "first" alone is unsettled: closing hands it back (see the next tests).
        await subscription.close()
    async with connected(rabbitmq.url) as connection:
        again = await receive(await connection.subscribe(queue_request(queue)))
        assert again.headers[ID] == first.headers[ID]
        assert again.broker_redelivered
        await connection.ack(again)


async def test_closing_a_subscription_that_holds_deliveries_closes_its_connection(
    rabbitmq: RabbitMQ,
) -> None:
    # RabbitMQ keeps the unacked deliveries of an unsubscribed consumer with the connection:
    # only closing the connection hands them back, flagged and with a new message-id.
    queue = new_destination("queue")
    sent = message("unsettled")
    async with connected(rabbitmq.url) as connection:
        await connection.send(queue, sent)
        subscription = await connection.subscribe(queue_request(queue))
        delivery = await receive(subscription)
        assert not delivery.broker_redelivered
        await subscription.close()
        assert not connection.is_open
        with pytest.raises(ConnectionLost):
            await connection.ack(delivery)
    async with connected(rabbitmq.url) as connection:
        again = await receive(await connection.subscribe(queue_request(queue)))
        assert again.headers[ID] == sent.headers[ID]
        assert again.broker_redelivered
        assert again.headers["message-id"] != delivery.headers["message-id"]
        await connection.ack(again)


async def test_closing_a_settled_subscription_keeps_the_connection(rabbitmq: RabbitMQ) -> None:
    queue = new_destination("queue")
    async with connected(rabbitmq.url) as connection:
        subscription = await connection.subscribe(queue_request(queue))
        await connection.send(queue, message("settled"))
        await connection.ack(await receive(subscription))
        await subscription.close()
        assert connection.is_open
        again = await connection.subscribe(queue_request(queue))
        later = message("later")
        await connection.send(queue, later)
        # Queues are FIFO: a delivery handed back by the close would come first.
        assert (await receive(again)).headers[ID] == later.headers[ID]


# -- quorum queues (queue_type) ----------------------------------------------------------------


def queue_types(rabbitmq: RabbitMQ) -> dict[str, str]:
    listed = rabbitmq.ctl("list_queues", "name", "type", "--no-table-headers", "--quiet")
    return dict(line.split("\t") for line in listed.splitlines() if line)


async def test_quorum_queues_take_sends_redelivery_copies_and_their_own_listeners(
    rabbitmq: RabbitMQ,
) -> None:
    # A SEND to /queue/X declares X: without the quorum type it is refused by a quorum queue
    # (and the connection closed), which would break every redelivery's re-send.
    topic, queue = new_destination("topic"), new_destination("queue")
    async with connected(rabbitmq.url, adapter_options={"queue_type": "quorum"}) as connection:
        subscription = await connection.subscribe(topic_request(topic, "quorate"))
        requeue = subscription.requeue_destination
        listener = await connection.subscribe(queue_request(queue))
        await connection.send(topic, message("first"))
        await connection.send(queue, message("to a queue"))
        delivery = await receive(subscription)
        # The container's redelivery: ack, and re-send a copy to the subscription's queue.
        transaction = await connection.begin()
        await transaction.ack(delivery)
        copy = OutgoingMessage(delivery.body, {ID: delivery.headers[ID]},
                               copy_of=delivery.headers)
        await transaction.send(requeue, copy)
        await transaction.commit()
        again = await receive(subscription)
        assert again.headers[ID] == delivery.headers[ID]
        await connection.ack(again)
        await connection.ack(await receive(listener))
    assert {n: t for n, t in queue_types(rabbitmq).items()
            if n in (requeue.name, queue.name)} == {requeue.name: "quorum", queue.name: "quorum"}


async def test_a_queue_of_another_type_is_refused_with_the_way_out(rabbitmq: RabbitMQ) -> None:
    topic, queue = new_destination("topic"), new_destination("queue")
    async with connected(rabbitmq.url) as connection:
        await (await connection.subscribe(topic_request(topic, "classic"))).close()
        await connection.send(queue, message("a classic queue"))
    async with connected(rabbitmq.url, adapter_options={"queue_type": "quorum"}) as connection:
        with pytest.raises(SubscriptionFailed,
                           match=r"inequivalent arg 'x-queue-type' for queue 'Consumer\.classic"
                                 r".*queue_type \(quorum\).*delete_queue"):
            await connection.subscribe(topic_request(topic, "classic"))
    async with connected(rabbitmq.url, adapter_options={"queue_type": "quorum"}) as connection:
        # RabbitMQ answers a refused SEND with an ERROR naming no receipt, then closes.
        with pytest.raises(SendOutcomeUnknown,
                           match=f"for queue '{queue.name}'.*queue_type \\(quorum\\)"):
            await connection.send(queue, message("to the classic queue"))


async def test_a_subscription_whose_queue_goes_ends_instead_of_waiting_forever(
    rabbitmq: RabbitMQ,
) -> None:
    # RabbitMQ cancels the consumers of a queue that went (deleted here; on a cluster, a
    # classic queue whose node died) with an ERROR naming the subscription, and keeps the
    # connection open: nothing else would ever wake the subscription.
    queue = new_destination("queue")
    async with connected(rabbitmq.url) as connection:
        subscription = await connection.subscribe(queue_request(queue))
        rabbitmq.ctl("delete_queue", queue.name)
        with pytest.raises(ConnectionLost, match="ended the subscription"):
            await receive(subscription)
        assert subscription.closed and connection.is_open
    # The plugin declares a /queue/ once per connection: a new one declares it again.
    async with connected(rabbitmq.url) as connection:
        again = await connection.subscribe(queue_request(queue))
        await connection.send(queue, message("again"))
        await connection.ack(await receive(again))
