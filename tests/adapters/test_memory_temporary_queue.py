"""The memory broker's temporary queues (``Connection.temporary_queue``, for requests)."""

from __future__ import annotations

import uuid

import anyio
import pytest

import mdb_memory
from mdb.errors import ConnectionLost
from mdb.messages.destinations import Destination
from mdb.messages.message import OutgoingMessage, ReplyAddress
from mdb.seam.broker import ConnectionOptions
from mdb_memory import MemoryBroker

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_a_reply_reaches_the_temporary_queue_settled_and_close_deletes_it() -> None:
    name = f"temp-{uuid.uuid4().hex[:12]}"
    connection = await MemoryBroker(ConnectionOptions(url=f"memory://{name}")).connect()
    state = mdb_memory.broker_state(name)
    try:
        replies = await connection.temporary_queue()
        address = replies.reply_to
        queue = Destination.parse(address.address)
        await connection.send(Destination.parse("queue:requests"),
                              OutgoingMessage(b"ask", {"mdb_id": "r"}, reply_to=address))
        [request] = state.browse("queue:requests")
        assert request.reply_to == address
        await connection.send(ReplyAddress(str(request.reply_to)),
                              OutgoingMessage(b"answer", {"mdb_id": "a"}, correlation_id="r"))
        with anyio.fail_after(5):
            reply = await replies.receive()
        assert (reply.body, reply.correlation_id) == (b"answer", "r")
        stats = state.stats(queue)
        assert stats is not None and (stats.in_flight, stats.dequeued) == (0, 1)
        await replies.close()
        assert state.stats(queue) is None
        with pytest.raises(ConnectionLost):
            await replies.receive()
    finally:
        await connection.close()
        mdb_memory.reset(name)
