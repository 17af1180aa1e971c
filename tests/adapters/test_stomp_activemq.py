"""The stomp+activemq adapter, driven directly through the broker seam against a real ActiveMQ.

The broker is started by ``tests.harness.servers.activemq``: one for this module. What ActiveMQ and
RabbitMQ share (a round trip, a killed or hung broker, connect failures) is tested once per
broker in ``test_stomp_brokers``; the seam's general rules (transactions, prefetch,
``receive_nowait``, stale objects) once for all three adapters by ``test_seam``
(``mdb.testing.seam``). Without ActiveMQ installed the tests are skipped, except in CI
(``CI=true``) where that is a failure. Every wait is bounded by ``fail_after`` so a broken
adapter fails instead of hanging; nothing asserts a duration.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from mdb.commands.dlq.failed import ErrorDestination
from mdb.commands.dlq.replays import Left
from mdb.commands.dlq.selection import Selection
from mdb.config.settings import load_settings
from mdb.errors import BrokerError, ConfigurationError, SubscriptionFailed
from mdb.messages.destinations import Destination
from mdb.messages.headers import ID
from mdb.routing.brokers import Brokers
from mdb.seam.broker import ConnectionOptions
from mdb_stomp import StompBroker
from tests.adapters.stomp_support import (
    connected,
    message,
    new_destination,
    queue_request,
    receive,
    send_messages,
)
from tests.harness.servers.activemq import ActiveMQ
from tests.harness.servers.brokers import private_brokers

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def activemq() -> Iterator[ActiveMQ]:
    """This module's own broker (shadows any session-wide one: these tests leave queues)."""
    with private_brokers("activemq") as [broker]:
        assert isinstance(broker, ActiveMQ)
        yield broker


# -- transactions ----------------------------------------------------------------------------


async def test_an_ack_that_would_also_settle_an_unsettled_earlier_delivery_is_refused(
    activemq: ActiveMQ,
) -> None:
    # Client acks are cumulative and ABORT leaves the acked message unsettled: acking the next
    # one would silently settle the aborted one for good (measured on ActiveMQ 5.17.2).
    queue = new_destination("queue")
    async with connected(activemq.url) as connection:
        sent = await send_messages(connection, queue, 4)
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
    queue = new_destination("queue")
    async with connected(activemq.url) as connection:
        sent = await send_messages(connection, queue, 5)
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
    queue = new_destination("queue")
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


# -- browsing --------------------------------------------------------------------------------


async def test_a_browse_sees_past_the_400_messages_of_a_default_browser_page(
    activemq: ActiveMQ,
) -> None:
    # ActiveMQ's browser stops at maxBrowsePageSize (400 by default, measured on 5.17.2); the
    # reference config raises it so that mdb dlq sees an error destination whole.
    queue = new_destination("queue")
    async with connected(activemq.url) as connection:
        transaction = await connection.begin()
        for index in range(401):
            await transaction.send(queue, message(str(index)))
        await transaction.commit()
    async with connected(activemq.url) as connection:
        seen = [delivery.body async for delivery in connection.browse(queue)]
    assert seen == [str(index).encode() for index in range(401)]


# -- ActiveMQ's own dead-letter queue --------------------------------------------------------


async def test_a_message_activemq_dead_lettered_is_replayed_where_activemq_says_it_came_from(
    activemq: ActiveMQ,
) -> None:
    # A NACK moves a persistent message to ActiveMQ.DLQ with `original-destination`, which a
    # producer's SEND may set too (measured on 5.17.2): a replay takes it for the origin,
    # and still sends only where a listener of the application consumes.
    orders, victim = new_destination("queue"), new_destination("queue")
    dead_letters = Destination.parse("queue:ActiveMQ.DLQ")
    async with connected(activemq.url) as connection:
        [sent] = await send_messages(connection, orders, 1)
        subscription = await connection.subscribe(queue_request(orders))
        await connection.dead_letter(await receive(subscription))
        await subscription.close()
        forged = message("forged", **{"original-destination": f"/queue/{victim.name}"})
        await connection.send(orders, forged)
        subscription = await connection.subscribe(queue_request(orders))
        await connection.dead_letter(await receive(subscription))
        await subscription.close()
    settings = load_settings(None, brokers={"default": {"url": activemq.url}})
    errors = ErrorDestination(Brokers(settings), dead_letters, origins=[orders])
    ours = Selection(ids=frozenset({sent.headers[ID], forged.headers[ID]}))
    assert {f.original_destination async for f in errors.list(ours)} == {
        str(orders), str(victim)}
    left: list[Left] = []
    done = await errors.replay(ours, left=left.append)
    assert (done.taken, [stray.id for stray in left]) == (1, [forged.headers[ID]])
    async with connected(activemq.url) as connection:
        assert [d.headers[ID] async for d in connection.browse(orders)] == [sent.headers[ID]]
        assert [d.headers[ID] async for d in connection.browse(victim)] == []
    assert [f.id async for f in errors.list(ours)] == [forged.headers[ID]]
