"""Browsing a queue through the broker's queue browser (``StompConnection.browse`` where the
dialect has one, ``Dialect.browse_headers``: ActiveMQ's).

A SUBSCRIBE with ``browser:true``: the broker sends a copy of each message of the queue, in
order, then an end frame, and leaves each message where it was, with its id, but flagged
``redelivered`` on its next delivery; it shows at most the queue's ``maxBrowsePageSize``
messages, 400 by default (the reference ``activemq.xml`` raises it; measured on 5.17.2). The
subscription acks its copies (``ack:client``), which takes none of them off the queue: so the
broker sends no more than the prefetch (``PAGE``) ahead of what the browse handed on, an ACK
of the copies handed on lets the next ones come, and a browse holds a page at most whatever
the size of the queue. The end frame is the dialect's to tell (``Dialect.browse_end``), never
a header a producer can give a message. A browse without a broker's browser is
``mdb_stomp.queues.read_through.read_back``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

from mdb.errors import BrokerError, ConnectionLost, SubscriptionFailed
from mdb.messages.destinations import Destination
from mdb.seam.broker import PAGE, Delivery
from mdb_stomp.dialects.dialect import Dialect
from mdb_stomp.protocol.frames import delivery_of
from mdb_stomp.protocol.receipts import ReceiptErrors, Unanswered
from mdb_stomp.protocol.wire import Wire

_END = object()
_ACKED_EVERY = PAGE // 2  # copies handed on between two ACKs: the next half page comes meanwhile


class StompBrowser:
    """One ``browser:true`` subscription: its copies, up to the end frame. Made by
    ``browsed``."""

    # Copies are never settled (their ACKs only pace the broker), and the end frame carries no
    # ack header: the wire hands over every frame.
    settled_on_arrival = True

    def __init__(self, dialect: Dialect, queue: Destination) -> None:
        self._dialect = dialect
        self._queue = queue
        self._items: asyncio.Queue[object] = asyncio.Queue()

    def deliver(self, headers: dict[str, str], body: bytes | str | None,
                damage: str | None = None) -> None:
        if self._dialect.browse_end(headers):
            self._items.put_nowait(_END)
            return
        shown = {name: value for name, value in headers.items()
                 if name not in self._dialect.delivery_headers}
        self._items.put_nowait((delivery_of(self._dialect, self._queue, shown, body, damage, None),
                                headers.get("ack")))

    def connection_lost(self, why: str) -> None:
        self._items.put_nowait(ConnectionLost(why))

    def cancelled(self, why: str) -> None:
        self._items.put_nowait(SubscriptionFailed(why))

    async def next(self) -> tuple[Delivery, str | None] | None:
        """The next copy and its ack id, or None at the end; raises how the browse failed."""
        item = await self._items.get()
        if isinstance(item, BrokerError):
            self._items.put_nowait(item)  # every later call raises it too
            raise item
        return None if item is _END else item  # type: ignore[return-value]


async def browsed(wire: Wire, dialect: Dialect, queue: Destination,
                  headers: dict[str, str]) -> AsyncGenerator[Delivery, None]:
    """The messages of ``queue`` through the broker's browser, subscribed with ``headers``
    (``Dialect.browse_headers``; see the module docstring)."""
    wire.check_alive()
    browser = StompBrowser(dialect, queue)
    sub_id = wire.next_id()
    wire.attach(sub_id, browser)
    try:
        try:
            await wire.confirm("SUBSCRIBE", {**headers,
                                             "destination": dialect.send_path(queue),
                                             "id": sub_id, "ack": "client"})
        except Unanswered as unanswered:
            errors = ReceiptErrors(f"browsing {queue}", refused=SubscriptionFailed,
                                   unconfirmed=SubscriptionFailed)
            raise errors.error(unanswered) from None
        handed = 0
        while (copy := await browser.next()) is not None:
            delivery, ack_id = copy
            yield delivery
            handed += 1
            if ack_id is not None and handed % _ACKED_EVERY == 0:
                wire.write("ACK", {"id": ack_id})  # cumulative: the copies handed on
    finally:
        wire.detach(sub_id)
        if wire.is_open:
            wire.unsubscribe_quietly(sub_id)
