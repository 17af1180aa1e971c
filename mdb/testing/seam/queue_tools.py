"""The seam's contract on an operator's three (``mdb.testing.seam``; docs/architecture.md,
"The broker seam"): a browse, a take and a queue's lock."""

from __future__ import annotations

import contextlib

import anyio
import pytest

from mdb.errors import QueueLocked
from mdb.seam.broker import (
    ConnectionOptions,
)
from mdb.seam.registry import broker_for
from mdb.testing.seam.connecting import (
    WAIT,
    connected,
    new_queue,
    receive,
    request_on,
    send_all,
    take_one,
    text_message,
)


@pytest.mark.anyio
async def test_browsing_sees_the_messages_in_order_and_leaves_them_there(seam_url: str) -> None:
    queue = new_queue()
    async with connected(seam_url) as connection:
        await send_all(connection, queue, "one")
        # Headers a browse may use for its own ends are the producer's here: nothing ends.
        await connection.send(queue, text_message("two", browser="end", mdb_end_marker="x",
                                              mdb_browse_end="x"))
        await send_all(connection, queue, "three")
        declared = (await connection.capabilities()).browsing
    for _ in range(2):  # the second browse sees what the first left
        async with connected(seam_url) as connection:
            with anyio.fail_after(WAIT):
                seen = [d async for d in connection.browse(queue)]
        assert [d.body for d in seen] == [b"one", b"two", b"three"]
        assert seen[1].headers["browser"] == "end"
        assert declared is not None or not any(d.broker_redelivered for d in seen)
    async with connected(seam_url) as connection:
        with anyio.fail_after(WAIT):
            assert [d async for d in connection.browse(new_queue())] == []
    assert [(await take_one(seam_url, queue)).body for _ in range(3)] == [
        b"one", b"two", b"three"]


@pytest.mark.anyio
async def test_a_browse_closed_early_leaves_the_queue_as_it_was(seam_url: str) -> None:
    queue = new_queue()
    async with connected(seam_url) as connection:
        await send_all(connection, queue, "one", "two", "three")
        browse = connection.browse(queue)
        with anyio.fail_after(WAIT):
            assert (await anext(browse)).body == b"one"
            await browse.aclose()
    async with connected(seam_url) as connection, contextlib.aclosing(
            connection.browse(queue)) as again:
        with anyio.fail_after(WAIT):
            assert [d.body async for d in again] == [b"one", b"two", b"three"]


@pytest.mark.anyio
async def test_a_take_ends_once_nothing_is_left_whatever_another_consumer_took(
        seam_url: str) -> None:
    queue = new_queue()
    # A receipt's time is the longest a take may wait before it looks whether any is left.
    broker = broker_for(ConnectionOptions(url=seam_url, connect_timeout=WAIT,
                                          receipt_timeout=WAIT / 5))
    async with connected(seam_url, broker) as other, connected(seam_url, broker) as connection:
        await send_all(connection, queue, "one", "two", "three")
        held = await other.subscribe(request_on(queue))
        first = await receive(held)  # another consumer holds it meanwhile, then takes it
        taken = []
        with anyio.fail_after(WAIT):
            async with contextlib.aclosing(connection.take(queue)) as deliveries:
                async for delivery in deliveries:
                    taken.append(delivery.body)
                    await connection.ack(delivery)
                    if len(taken) == 2:
                        await other.ack(first)
        assert (first.body, taken) == (b"one", [b"two", b"three"])


@pytest.mark.anyio
async def test_a_take_closed_early_leaves_the_rest_as_it_was(seam_url: str) -> None:
    queue = new_queue()
    async with connected(seam_url) as connection:
        await send_all(connection, queue, "one", "two", "three")
        with anyio.fail_after(WAIT):
            async with contextlib.aclosing(connection.take(queue)) as deliveries:
                first = await anext(deliveries)
                tx = await connection.begin()
                await tx.ack(first)
                await tx.commit()
    async with connected(seam_url) as connection, contextlib.aclosing(
            connection.browse(queue)) as left:
        with anyio.fail_after(WAIT):
            assert [d.body async for d in left] == [b"two", b"three"]


@pytest.mark.anyio
async def test_a_lock_is_held_by_one_connection_until_it_closes(seam_url: str) -> None:
    queue = new_queue()
    async with connected(seam_url) as second:
        async with connected(seam_url) as first:
            await first.lock(queue)
            await first.lock(queue)  # held already
            with pytest.raises(QueueLocked):
                await second.lock(queue)
            await second.lock(new_queue())  # another queue's is another lock
            assert second.is_open
        await second.lock(queue)  # free once the first closed
