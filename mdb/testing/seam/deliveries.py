"""The seam's contract on deliveries and transactions (``mdb.testing.seam``): round trips,
commits and aborts, unsettled deliveries handed back, prefetch, ``receive_nowait``, the requeue
destination, delayed sends and the broker's dead-letter queue."""

from __future__ import annotations

import dataclasses
import uuid

import anyio
import pytest

from mdb.errors import BrokerError, ConnectionLost
from mdb.messages.destinations import Destination
from mdb.messages.headers import ID
from mdb.testing.seam.connecting import (
    WAIT,
    acked,
    connected,
    held,
    new_queue,
    receive,
    request_on,
    seam_broker,
    send_all,
    take_one,
    text_message,
    with_queues,
)


@pytest.mark.anyio
async def test_a_round_trip_keeps_body_and_headers(seam_url: str) -> None:
    queue = new_queue()
    async with connected(seam_url) as connection:
        sent = text_message("héllo", colour="blue")
        await connection.send(queue, sent)
        delivery = await take_one(seam_url, queue)
    assert delivery.body == "héllo".encode()
    assert delivery.headers[ID] == sent.headers[ID]
    assert delivery.headers["colour"] == "blue"
    assert not delivery.broker_redelivered
    assert delivery.destination == queue


@pytest.mark.anyio
async def test_commit_makes_acks_and_sends_take_effect_together(seam_url: str) -> None:
    async with with_queues(seam_url) as (connection, source, target):
        subscription, _, tx = await acked(connection, source, "first", "second")
        watcher = await connection.subscribe(request_on(target, prefetch=10))
        await tx.send(target, text_message("derived"))
        await connection.send(target, text_message("sent before the commit"))
        # A queue is FIFO: had the transacted send escaped before the commit, it came first.
        assert (await receive(watcher)).body == b"sent before the commit"
        await tx.commit()
        assert (await receive(watcher)).body == b"derived"
        # The commit settled ``first``: once the subscription closes only ``second`` is left.
        await subscription.close()
        await watcher.close()
    assert (await take_one(seam_url, source)).body == b"second"


@pytest.mark.anyio
async def test_an_aborted_ack_is_settled_by_a_later_transaction(seam_url: str) -> None:
    async with with_queues(seam_url) as (connection, source, target):
        subscription, delivery, aborted = await acked(connection, source, "original", "next")
        await aborted.abort()
        await aborted.abort()  # never raises
        committed = await connection.begin()
        await committed.ack(delivery)  # still unsettled, still this subscription's
        await committed.send(target, text_message("forwarded"))
        await committed.commit()
        # Settled: the subscription goes on with the next message, not a redelivery.
        following = await receive(subscription)
        assert (following.body, following.broker_redelivered) == (b"next", False)
        await connection.ack(following)
        await subscription.close()
    assert (await take_one(seam_url, target)).body == b"forwarded"


@pytest.mark.anyio
async def test_abort_discards_sends_and_leaves_the_delivery_unsettled(seam_url: str) -> None:
    async with with_queues(seam_url) as (connection, source, target):
        _, _, tx = await acked(connection, source, "kept")
        await tx.send(target, text_message("discarded"))
        await tx.abort()
        await connection.send(target, text_message("marker"))
    # Unsettled: back once its subscription (here its connection) closed, flagged.
    again = await take_one(seam_url, source)
    assert (again.body, again.broker_redelivered) == (b"kept", True)
    assert (await take_one(seam_url, target)).body == b"marker"


@pytest.mark.anyio
async def test_a_closed_subscription_hands_unsettled_deliveries_back_flagged(
        seam_url: str) -> None:
    queue = new_queue()
    async with connected(seam_url) as connection:
        sent = text_message("unsettled")
        await connection.send(queue, sent)
        subscription = await connection.subscribe(request_on(queue))
        first = await receive(subscription)
        assert not first.broker_redelivered
        await subscription.close()
        with anyio.fail_after(WAIT), pytest.raises(ConnectionLost):
            await subscription.receive()  # a closed subscription never delivers again
    again = await take_one(seam_url, queue)
    assert again.headers[ID] == sent.headers[ID]
    assert again.broker_redelivered


@pytest.mark.anyio
async def test_prefetch_bounds_the_unsettled_deliveries_pushed(seam_url: str) -> None:
    queue = new_queue()
    async with connected(seam_url) as connection:
        await send_all(connection, queue, "one", "two", "three")
        subscription = await connection.subscribe(request_on(queue, prefetch=2))
        first = await receive(subscription)
        second = await receive(subscription)
        # Two unsettled: the third may not have been pushed.
        assert subscription.receive_nowait() is None
        await connection.ack(first)
        third = await receive(subscription)
        assert [d.body for d in (first, second, third)] == [b"one", b"two", b"three"]
        await connection.ack(second)
        await connection.ack(third)
        await subscription.close()


@pytest.mark.anyio
async def test_receive_nowait_takes_from_the_same_stream_and_never_waits(
        seam_url: str) -> None:
    queue = new_queue()
    async with connected(seam_url) as connection:
        subscription = await connection.subscribe(request_on(queue, prefetch=3))
        assert subscription.receive_nowait() is None  # nothing sent: None, at once
        await send_all(connection, queue, "one", "two", "three")
        taken = [await receive(subscription)]
        while len(taken) < 3:  # what was pushed already, else wait for it
            taken.append(subscription.receive_nowait() or await receive(subscription))
        assert [d.body for d in taken] == [b"one", b"two", b"three"]
        for delivery in taken:
            await connection.ack(delivery)
        await subscription.close()
        assert subscription.receive_nowait() is None  # closed: None, never raises


@pytest.mark.anyio
async def test_the_requeue_destination_reaches_its_subscription_only(seam_url: str) -> None:
    topic = Destination.parse(f"topic:seam_{uuid.uuid4().hex[:12]}")
    async with connected(seam_url) as connection:
        mine = await connection.subscribe(request_on(topic, name=f"mine{uuid.uuid4().hex[:6]}"))
        other = await connection.subscribe(request_on(topic, name=f"other{uuid.uuid4().hex[:6]}"))
        await connection.send(mine.requeue_destination, text_message("again"))
        await connection.send(topic, text_message("everyone"))
        received = []
        for _ in range(2):
            delivery = await receive(mine)
            await connection.ack(delivery)
            received.append(delivery.body)
        assert sorted(received) == [b"again", b"everyone"]
        only = await receive(other)
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
    queue = new_queue()
    async with connected(seam_url) as connection:
        why = (await connection.capabilities()).cannot_hold_delays
        if why is not None:
            pytest.skip(f"the broker cannot hold a delayed send: {why}")
        subscription = await connection.subscribe(request_on(queue, prefetch=10))
        aborted = await connection.begin()
        await aborted.send(queue, dataclasses.replace(text_message("aborted"), delay=0.3))
        await aborted.abort()
        committed = await connection.begin()
        held = dataclasses.replace(text_message("held", colour="blue"), delay=0.3)
        await committed.send(queue, held)
        await committed.commit()
        await connection.send(queue, text_message("later"))
        first, second = await receive(subscription), await receive(subscription)
        assert (first.body, second.body) == (b"later", b"held")
        assert (second.headers[ID], second.headers["colour"]) == (held.headers[ID], "blue")
        await connection.ack(first)
        await connection.ack(second)


@pytest.mark.anyio
async def test_dead_letter_settles_only_a_delivery_the_capabilities_accept(
        seam_url: str) -> None:
    queue, broker = new_queue(), seam_broker(seam_url)
    async with connected(seam_url, broker) as connection:
        subscription, delivery = await held(connection, queue, "dead")
        accepted = broker.capabilities.dead_letters(delivery)
        if accepted:
            await connection.dead_letter(delivery)
        else:
            with pytest.raises(BrokerError):
                await connection.dead_letter(delivery)
        await subscription.close()  # may close the connection (closing_ends_connection)
    async with connected(seam_url) as connection:
        await connection.send(queue, text_message("marker"))
    # Dead-lettered, it is gone from its queue; refused, it is back, flagged, before the marker.
    first = await take_one(seam_url, queue)
    if accepted:
        assert first.body == b"marker"
    else:
        assert (first.body, first.broker_redelivered) == (b"dead", True)
        assert (await take_one(seam_url, queue)).body == b"marker"
