"""``read_back``: reading a queue over a plain STOMP consumer without taking its messages, on a
broker without a queue browser over STOMP (RabbitMQ): how a browse there sees them, and how a
take that stopped early removes its end marker (``mdb_stomp.queues.end_marker``) and nothing else.

It rests on what RabbitMQ does with the unacked deliveries of a subscription it is told to end:
it keeps them with the connection until that closes (``Dialect.unsubscribe_releases_unacked``
False). So the messages are read a page at a time, a SUBSCRIBE with a prefetch of ``PAGE``
each, never acked, the next page subscribed once the broker sent the whole of one (so none is
on its way at the UNSUBSCRIBE), on a connection of its own; at the marker it acks the marker
alone and closes the connection, and the broker puts each message back where it was, in its
order, flagged redelivered (measured on 3.10.8, classic queues: ten messages read in pages of
three, on three subscriptions of one connection, all back in order after it closed). At most a
page of deliveries is on the client's side at once; the broker keeps the rest. While it reads,
the queue's other consumers get none of what it holds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncGenerator
from contextlib import suppress

import anyio

from mdb.errors import BrokerError, ConnectionLost, SubscriptionFailed
from mdb.messages.destinations import Destination
from mdb.seam.broker import PAGE, Delivery, SubscriptionRequest
from mdb_stomp.dialects.dialect import Dialect
from mdb_stomp.protocol.frames import delivery_of
from mdb_stomp.protocol.receipts import ReceiptErrors
from mdb_stomp.protocol.wire import OpenWire, Wire
from mdb_stomp.queues.end_marker import EndMarker
from mdb_stomp.subscriptions.prefetched import Prefetched


class _Page:
    """The MESSAGE frames of one SUBSCRIBE, none of them settled but by the reader: how many
    came, and the deliveries not read yet (their token the frame's ``ack``)."""

    settled_on_arrival = False  # client acks: every frame carries its ack id

    def __init__(self, dialect: Dialect, queue: Destination) -> None:
        self._dialect = dialect
        self._queue = queue
        self.prefetched = Prefetched()
        self.came = 0

    def deliver(self, headers: dict[str, str], body: bytes | str | None,
                damage: str | None = None) -> None:
        self.came += 1
        self.prefetched.put(delivery_of(self._dialect, self._queue, headers, body, damage,
                                        headers["ack"]))

    def connection_lost(self, why: str) -> None:
        self.prefetched.fail(ConnectionLost, why)

    def cancelled(self, why: str) -> None:
        self.prefetched.fail(SubscriptionFailed, why)


class _Reader:
    """One SUBSCRIBE to ``queue`` of a page's prefetch at a time on ``wire``, as the dialect
    subscribes to a queue (individual acks on RabbitMQ)."""

    def __init__(self, wire: Wire, dialect: Dialect, queue: Destination) -> None:
        self._wire = wire
        self._dialect = dialect
        self._queue = queue
        self._spec = dialect.subscribe_spec(SubscriptionRequest(
            queue, None, durable=False, selector=None, prefetch=PAGE))
        self._errors = ReceiptErrors(f"reading {queue}", refused=SubscriptionFailed,
                                     unconfirmed=SubscriptionFailed)
        self._id: str | None = None
        self.page = _Page(dialect, queue)

    async def subscribe(self) -> None:
        """End the subscription of the page read (if any) and subscribe for the next."""
        wire = self._wire
        await self.unsubscribe()
        self._id = wire.next_id()
        self.page = _Page(self._dialect, self._queue)
        wire.attach(self._id, self.page)
        await wire.request("SUBSCRIBE", {**self._spec.headers, "destination": self._spec.path,
                                         "id": self._id, "ack": self._spec.ack_mode},
                           errors=self._errors)

    async def next(self) -> Delivery:
        """The next delivery read; once the broker sent a whole page, from the next page."""
        found = self.page.prefetched.get_nowait()
        if found is not None:
            return found
        if self.page.came >= PAGE:
            await self.subscribe()
        return await self.page.prefetched.get()

    async def unsubscribe(self) -> None:
        if self._id is None:
            return
        sub_id, self._id = self._id, None
        try:
            if self._wire.is_open:
                await self._wire.request("UNSUBSCRIBE", {"id": sub_id}, errors=self._errors)
        finally:
            self._wire.detach(sub_id)


async def read_back(open_wire: OpenWire, dialect: Dialect, queue: Destination,
                    marker: EndMarker | None = None) -> AsyncGenerator[Delivery, None]:
    """The messages of ``queue`` up to ``marker`` (sent already; by default one of its own,
    sent first), on a connection of its own, then handed back in their places by closing it
    (see the module docstring). Each delivery shows the message's headers, not the frame's
    own (``Dialect.delivery_headers``), and cannot be settled. Ended early (``aclose``, a
    cancellation), it reads on to the marker, unseen, to take the marker off the queue, shielded
    from the cancellation: only one more (a second Ctrl-C) or the connection's loss leaves the
    marker there (``mdb_stomp.queues.end_marker``)."""
    wire = await open_wire()
    reader = _Reader(wire, dialect, queue)
    sent = marker is not None
    try:
        await reader.subscribe()
        if marker is None:
            marker = EndMarker()
            await marker.send(wire, dialect, queue)
            sent = True
        while not marker.ends((found := await reader.next()).headers):
            yield dataclasses.replace(found, token=None, headers={
                name: value for name, value in found.headers.items()
                if name not in dialect.delivery_headers})
        wire.write("ACK", {"id": str(found.token)})
    except BaseException:
        if sent and marker is not None and wire.is_open:
            with anyio.CancelScope(shield=True), suppress(BrokerError):
                while not marker.ends((found := await reader.next()).headers):
                    pass
                wire.write("ACK", {"id": str(found.token)})
                await wire.close()
        raise
    finally:
        await wire.close()  # what it read goes back; the DISCONNECT follows the marker's ACK
