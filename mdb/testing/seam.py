"""The broker seam's contract (``mdb.broker``) as tests, for an adapter to run on its broker.

In the adapter's test suite, one module::

    import pytest
    from mdb.testing.seam import *  # noqa: F403  (the tests below)

    @pytest.fixture
    def seam_url() -> str:
        return "myscheme://user:pw@localhost:1234"   # a running broker of your adapter

Every test connects with ``broker_for(ConnectionOptions(url=seam_url))`` (the adapter found by
the URL's scheme, as the container finds it), uses destinations of its own and runs under
anyio's pytest plugin (``anyio_backend``, asyncio by default). The rules checked, each in the
docstrings of ``mdb.broker``: a round trip keeps body and headers; a commit makes its acks and
sends take effect together, an abort discards the sends and leaves the delivery unsettled;
a subscription that closes hands its unsettled deliveries back, flagged redelivered; prefetch
bounds what is pushed; ``receive_nowait`` takes from the same stream as ``receive`` and never
waits; the requeue destination reaches its subscription only; after ``close`` every object of
the connection is stale. What the adapter's ``Capabilities`` declare is checked as it says:
a connection's are its broker's; a delivery ``dead_letters`` accepts is settled by
``dead_letter``, another is refused and left unsettled; closing a subscription that holds a
delivery closes its connection only where ``closing_ends_connection`` says so; where the
broker holds delayed sends back, a delayed send is held from its commit and then goes behind
later ones; a browse sees a queue's messages in order and leaves them there, in that order
(where ``browsing`` declares a change, flagged redelivered at most).
"""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest

from mdb.adapters import broker_for
from mdb.broker import (
    Broker,
    Connection,
    ConnectionOptions,
    Delivery,
    Subscription,
    SubscriptionRequest,
    Transaction,
)
from mdb.destinations import Destination
from mdb.errors import BrokerError, ConnectionLost, TransactionRolledBack
from mdb.message import ID, OutgoingMessage, new_id

__all__ = [
    "test_a_closed_connection_makes_every_object_stale",
    "test_a_closed_subscription_hands_unsettled_deliveries_back_flagged",
    "test_a_connection_can_do_what_its_broker_declares",
    "test_a_delayed_send_is_held_from_its_commit_then_goes_behind_later_ones",
    "test_a_round_trip_keeps_body_and_headers",
    "test_abort_discards_sends_and_leaves_the_delivery_unsettled",
    "test_an_aborted_ack_is_settled_by_a_later_transaction",
    "test_browsing_sees_the_messages_in_order_and_leaves_them_there",
    "test_closing_a_subscription_holding_a_delivery_ends_its_connection_only_where_declared",
    "test_commit_makes_acks_and_sends_take_effect_together",
    "test_dead_letter_settles_only_a_delivery_the_capabilities_accept",
    "test_prefetch_bounds_the_unsettled_deliveries_pushed",
    "test_receive_nowait_takes_from_the_same_stream_and_never_waits",
    "test_the_requeue_destination_reaches_its_subscription_only",
]

WAIT = 15.0  # bound on one wait: a hang guard, not a timing


def _broker(url: str) -> Broker:
    return broker_for(ConnectionOptions(url=url, client_id=f"seam-{uuid.uuid4().hex[:8]}",
                                        connect_timeout=WAIT, receipt_timeout=WAIT))


@asynccontextmanager
async def _connected(url: str, broker: Broker | None = None) -> AsyncIterator[Connection]:
    connection = await (broker or _broker(url)).connect()
    try:
        yield connection
    finally:
        await connection.close()


def _queue() -> Destination:
    return Destination.parse(f"queue:seam_{uuid.uuid4().hex[:12]}")


@asynccontextmanager
async def _with_queues(url: str) -> AsyncIterator[tuple[Connection, Destination, Destination]]:
    """A connection to ``url`` and two queues of its own: where messages come from, and where
    a transaction sends."""
    async with _connected(url) as connection:
        yield connection, _queue(), _queue()


def _on(destination: Destination, prefetch: int = 1, name: str | None = None,
        ) -> SubscriptionRequest:
    return SubscriptionRequest(destination, name=name, durable=True, selector=None,
                               prefetch=prefetch)


def _message(text: str, **headers: str) -> OutgoingMessage:
    return OutgoingMessage(text.encode(), {ID: new_id(), "content-type": "text/plain",
                                           **headers})


async def _send(connection: Connection, destination: Destination, *bodies: str) -> None:
    """Send a message of each of ``bodies`` to ``destination``, in order."""
    for body in bodies:
        await connection.send(destination, _message(body))


async def _receive(subscription: Subscription) -> Delivery:
    with anyio.fail_after(WAIT):
        return await subscription.receive()


async def _acked(connection: Connection, source: Destination,
                  *bodies: str) -> tuple[Subscription, Delivery, Transaction]:
    """Send ``bodies`` to ``source``, subscribe to it, receive the first of them and ack it
    in a new transaction, left open."""
    await _send(connection, source, *bodies)
    subscription = await connection.subscribe(_on(source))
    delivery = await _receive(subscription)
    tx = await connection.begin()
    await tx.ack(delivery)
    return subscription, delivery, tx


async def _take_one(url: str, destination: Destination) -> Delivery:
    """The next message of ``destination``, read on a connection of its own and acked."""
    async with _connected(url) as connection:
        subscription = await connection.subscribe(_on(destination))
        delivery = await _receive(subscription)
        await connection.ack(delivery)
        await subscription.close()
        return delivery


@pytest.mark.anyio
async def test_a_round_trip_keeps_body_and_headers(seam_url: str) -> None:
    queue = _queue()
    async with _connected(seam_url) as connection:
        sent = _message("héllo", colour="blue")
        await connection.send(queue, sent)
        delivery = await _take_one(seam_url, queue)
    assert delivery.body == "héllo".encode()
    assert delivery.headers[ID] == sent.headers[ID]
    assert delivery.headers["colour"] == "blue"
    assert not delivery.broker_redelivered
    assert delivery.destination == queue


@pytest.mark.anyio
async def test_commit_makes_acks_and_sends_take_effect_together(seam_url: str) -> None:
    async with _with_queues(seam_url) as (connection, source, target):
        subscription, _, tx = await _acked(connection, source, "first", "second")
        watcher = await connection.subscribe(_on(target, prefetch=10))
        await tx.send(target, _message("derived"))
        await connection.send(target, _message("sent before the commit"))
        # A queue is FIFO: had the transacted send escaped before the commit, it came first.
        assert (await _receive(watcher)).body == b"sent before the commit"
        await tx.commit()
        assert (await _receive(watcher)).body == b"derived"
        # The commit settled ``first``: once the subscription closes only ``second`` is left.
        await subscription.close()
        await watcher.close()
    assert (await _take_one(seam_url, source)).body == b"second"


@pytest.mark.anyio
async def test_an_aborted_ack_is_settled_by_a_later_transaction(seam_url: str) -> None:
    async with _with_queues(seam_url) as (connection, source, target):
        subscription, delivery, aborted = await _acked(connection, source, "original", "next")
        await aborted.abort()
        await aborted.abort()  # never raises
        committed = await connection.begin()
        await committed.ack(delivery)  # still unsettled, still this subscription's
        await committed.send(target, _message("forwarded"))
        await committed.commit()
        # Settled: the subscription goes on with the next message, not a redelivery.
        following = await _receive(subscription)
        assert (following.body, following.broker_redelivered) == (b"next", False)
        await connection.ack(following)
        await subscription.close()
    assert (await _take_one(seam_url, target)).body == b"forwarded"


@pytest.mark.anyio
async def test_abort_discards_sends_and_leaves_the_delivery_unsettled(seam_url: str) -> None:
    async with _with_queues(seam_url) as (connection, source, target):
        _, _, tx = await _acked(connection, source, "kept")
        await tx.send(target, _message("discarded"))
        await tx.abort()
        await connection.send(target, _message("marker"))
    # Unsettled: back once its subscription (here its connection) closed, flagged.
    again = await _take_one(seam_url, source)
    assert (again.body, again.broker_redelivered) == (b"kept", True)
    assert (await _take_one(seam_url, target)).body == b"marker"


@pytest.mark.anyio
async def test_a_closed_subscription_hands_unsettled_deliveries_back_flagged(
        seam_url: str) -> None:
    queue = _queue()
    async with _connected(seam_url) as connection:
        sent = _message("unsettled")
        await connection.send(queue, sent)
        subscription = await connection.subscribe(_on(queue))
        first = await _receive(subscription)
        assert not first.broker_redelivered
        await subscription.close()
        with anyio.fail_after(WAIT), pytest.raises(ConnectionLost):
            await subscription.receive()  # a closed subscription never delivers again
    again = await _take_one(seam_url, queue)
    assert again.headers[ID] == sent.headers[ID]
    assert again.broker_redelivered


@pytest.mark.anyio
async def test_prefetch_bounds_the_unsettled_deliveries_pushed(seam_url: str) -> None:
    queue = _queue()
    async with _connected(seam_url) as connection:
        await _send(connection, queue, "one", "two", "three")
        subscription = await connection.subscribe(_on(queue, prefetch=2))
        first = await _receive(subscription)
        second = await _receive(subscription)
        # Two unsettled: the third may not have been pushed.
        assert subscription.receive_nowait() is None
        await connection.ack(first)
        third = await _receive(subscription)
        assert [d.body for d in (first, second, third)] == [b"one", b"two", b"three"]
        await connection.ack(second)
        await connection.ack(third)
        await subscription.close()


@pytest.mark.anyio
async def test_receive_nowait_takes_from_the_same_stream_and_never_waits(
        seam_url: str) -> None:
    queue = _queue()
    async with _connected(seam_url) as connection:
        subscription = await connection.subscribe(_on(queue, prefetch=3))
        assert subscription.receive_nowait() is None  # nothing sent: None, at once
        await _send(connection, queue, "one", "two", "three")
        taken = [await _receive(subscription)]
        while len(taken) < 3:  # what was pushed already, else wait for it
            taken.append(subscription.receive_nowait() or await _receive(subscription))
        assert [d.body for d in taken] == [b"one", b"two", b"three"]
        for delivery in taken:
            await connection.ack(delivery)
        await subscription.close()
        assert subscription.receive_nowait() is None  # closed: None, never raises


@pytest.mark.anyio
async def test_the_requeue_destination_reaches_its_subscription_only(seam_url: str) -> None:
    topic = Destination.parse(f"topic:seam_{uuid.uuid4().hex[:12]}")
    async with _connected(seam_url) as connection:
        mine = await connection.subscribe(_on(topic, name=f"mine{uuid.uuid4().hex[:6]}"))
        other = await connection.subscribe(_on(topic, name=f"other{uuid.uuid4().hex[:6]}"))
        await connection.send(mine.requeue_destination, _message("again"))
        await connection.send(topic, _message("everyone"))
        received = []
        for _ in range(2):
            delivery = await _receive(mine)
            await connection.ack(delivery)
            received.append(delivery.body)
        assert sorted(received) == [b"again", b"everyone"]
        only = await _receive(other)
        await connection.ack(only)
        assert only.body == b"everyone"  # the requeued copy did not reach it
        for subscription in (mine, other):
            await subscription.close()


@pytest.mark.anyio
async def test_a_delayed_send_is_held_from_its_commit_then_goes_behind_later_ones(
    seam_url: str,
) -> None:
    """Where the broker holds delayed sends back (``Capabilities.cannot_hold_delays``), a
    delayed send in a transaction is held from the commit and an abort discards it; once due it
    joins the back of the queue with its headers. The aborted one, held as long and sent first,
    would come first. Skipped where the broker cannot hold one."""
    queue = _queue()
    async with _connected(seam_url) as connection:
        why = (await connection.capabilities()).cannot_hold_delays
        if why is not None:
            pytest.skip(f"the broker cannot hold a delayed send: {why}")
        subscription = await connection.subscribe(_on(queue, prefetch=10))
        aborted = await connection.begin()
        await aborted.send(queue, dataclasses.replace(_message("aborted"), delay=0.3))
        await aborted.abort()
        committed = await connection.begin()
        held = dataclasses.replace(_message("held", colour="blue"), delay=0.3)
        await committed.send(queue, held)
        await committed.commit()
        await connection.send(queue, _message("later"))
        first, second = await _receive(subscription), await _receive(subscription)
        assert (first.body, second.body) == (b"later", b"held")
        assert (second.headers[ID], second.headers["colour"]) == (held.headers[ID], "blue")
        await connection.ack(first)
        await connection.ack(second)


@pytest.mark.anyio
async def test_a_closed_connection_makes_every_object_stale(seam_url: str) -> None:
    async with _with_queues(seam_url) as (connection, queue, target):
        await connection.send(queue, _message("held"))
        subscription = await connection.subscribe(_on(queue))
        delivery = await _receive(subscription)
        tx = await connection.begin()
        await connection.close()
        assert not connection.is_open
        with anyio.fail_after(WAIT):
            with pytest.raises(ConnectionLost):
                await subscription.receive()
            assert subscription.receive_nowait() is None
            for attempt in (connection.subscribe(_on(queue)), connection.begin(),
                            connection.ack(delivery), connection.send(queue, _message("x"))):
                with pytest.raises(ConnectionLost):
                    await attempt
            for work in (tx.ack(delivery), tx.send(target, _message("stale"))):
                with contextlib.suppress(ConnectionLost):  # nothing, or ConnectionLost
                    await work
            with pytest.raises(TransactionRolledBack):
                await tx.commit()
    # Nothing done on a stale object reached the broker; the delivery came back, flagged.
    async with _connected(seam_url) as reader:
        await reader.send(target, _message("marker"))
    assert (await _take_one(seam_url, target)).body == b"marker"
    again = await _take_one(seam_url, queue)
    assert (again.body, again.broker_redelivered) == (b"held", True)


@pytest.mark.anyio
async def test_a_connection_can_do_what_its_broker_declares(seam_url: str) -> None:
    broker = _broker(seam_url)
    async with _connected(seam_url, broker) as connection:
        found = await connection.capabilities()
    # Whether a delayed send is held back only a connection may know; the rest is declared.
    assert dataclasses.replace(found, cannot_hold_delays=None) == dataclasses.replace(
        broker.capabilities, cannot_hold_delays=None)


@pytest.mark.anyio
async def test_dead_letter_settles_only_a_delivery_the_capabilities_accept(
        seam_url: str) -> None:
    queue, broker = _queue(), _broker(seam_url)
    async with _connected(seam_url, broker) as connection:
        await connection.send(queue, _message("dead"))
        subscription = await connection.subscribe(_on(queue))
        delivery = await _receive(subscription)
        accepted = broker.capabilities.dead_letters(delivery)
        if accepted:
            await connection.dead_letter(delivery)
        else:
            with pytest.raises(BrokerError):
                await connection.dead_letter(delivery)
        await subscription.close()  # may close the connection (closing_ends_connection)
    async with _connected(seam_url) as connection:
        await connection.send(queue, _message("marker"))
    # Dead-lettered, it is gone from its queue; refused, it is back, flagged, before the marker.
    first = await _take_one(seam_url, queue)
    if accepted:
        assert first.body == b"marker"
    else:
        assert (first.body, first.broker_redelivered) == (b"dead", True)
        assert (await _take_one(seam_url, queue)).body == b"marker"


@pytest.mark.anyio
async def test_closing_a_subscription_holding_a_delivery_ends_its_connection_only_where_declared(
        seam_url: str) -> None:
    queue, broker = _queue(), _broker(seam_url)
    async with _connected(seam_url, broker) as connection:
        await connection.send(queue, _message("held"))
        subscription = await connection.subscribe(_on(queue))
        await _receive(subscription)  # unsettled
        ends = broker.capabilities.closing_ends_connection(subscription)
        await subscription.close()
        assert connection.is_open is not ends
    again = await _take_one(seam_url, queue)
    assert (again.body, again.broker_redelivered) == (b"held", True)


@pytest.mark.anyio
async def test_browsing_sees_the_messages_in_order_and_leaves_them_there(seam_url: str) -> None:
    queue = _queue()
    async with _connected(seam_url) as connection:
        await _send(connection, queue, "one", "two", "three")
        declared = (await connection.capabilities()).browsing
    for _ in range(2):  # the second browse sees what the first left
        async with _connected(seam_url) as connection:
            with anyio.fail_after(WAIT):
                seen = [d async for d in connection.browse(queue)]
        assert [d.body for d in seen] == [b"one", b"two", b"three"]
        assert declared is not None or not any(d.broker_redelivered for d in seen)
    async with _connected(seam_url) as connection:
        with anyio.fail_after(WAIT):
            assert [d async for d in connection.browse(_queue())] == []
    assert [(await _take_one(seam_url, queue)).body for _ in range(3)] == [
        b"one", b"two", b"three"]
