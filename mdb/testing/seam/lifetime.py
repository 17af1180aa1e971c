"""The seam's contract on a connection's lifetime (``mdb.testing.seam``): a closed connection
makes its objects stale, a connection can do what its broker declares, and closing a
subscription ends its connection only where the capabilities say so."""

from __future__ import annotations

import contextlib
import dataclasses

import anyio
import pytest

from mdb.errors import ConnectionLost, TransactionRolledBack
from mdb.testing.seam.connecting import (
    WAIT,
    connected,
    held,
    new_queue,
    request_on,
    seam_broker,
    take_one,
    text_message,
    with_queues,
)


@pytest.mark.anyio
async def test_a_closed_connection_makes_every_object_stale(seam_url: str) -> None:
    async with with_queues(seam_url) as (connection, queue, target):
        subscription, delivery = await held(connection, queue, "held")
        tx = await connection.begin()
        await connection.close()
        assert not connection.is_open
        with anyio.fail_after(WAIT):
            with pytest.raises(ConnectionLost):
                await subscription.receive()
            assert subscription.receive_nowait() is None
            for attempt in (connection.subscribe(request_on(queue)), connection.begin(),
                            connection.ack(delivery), connection.send(queue, text_message("x"))):
                with pytest.raises(ConnectionLost):
                    await attempt
            for work in (tx.ack(delivery), tx.send(target, text_message("stale"))):
                with contextlib.suppress(ConnectionLost):  # nothing, or ConnectionLost
                    await work
            with pytest.raises(TransactionRolledBack):
                await tx.commit()
    # Nothing done on a stale object reached the broker; the delivery came back, flagged.
    async with connected(seam_url) as reader:
        await reader.send(target, text_message("marker"))
    assert (await take_one(seam_url, target)).body == b"marker"
    again = await take_one(seam_url, queue)
    assert (again.body, again.broker_redelivered) == (b"held", True)


@pytest.mark.anyio
async def test_a_connection_can_do_what_its_broker_declares(seam_url: str) -> None:
    broker = seam_broker(seam_url)
    async with connected(seam_url, broker) as connection:
        found = await connection.capabilities()
    # Whether a delayed send is held back only a connection may know; the rest is declared.
    assert dataclasses.replace(found, cannot_hold_delays=None) == dataclasses.replace(
        broker.capabilities, cannot_hold_delays=None)


@pytest.mark.anyio
async def test_closing_a_subscription_holding_a_delivery_ends_its_connection_only_where_declared(
        seam_url: str) -> None:
    queue, broker = new_queue(), seam_broker(seam_url)
    async with connected(seam_url, broker) as connection:
        subscription, _ = await held(connection, queue, "held")
        ends = broker.capabilities.closing_ends_connection(subscription)
        assert ends is broker.capabilities.closing_keeps_unsettled  # it holds one
        await subscription.close()
        assert connection.is_open is not ends
    again = await take_one(seam_url, queue)
    assert (again.body, again.broker_redelivered) == (b"held", True)
