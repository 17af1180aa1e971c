"""Browsing a queue over STOMP (``StompConnection.browse``), as the dialect's broker allows.

* A broker with a queue browser (ActiveMQ, ``Dialect.browse_headers``): a SUBSCRIBE with
  ``browser:true`` and ``ack:auto``; the broker sends a copy of each message of the queue, in
  order, then a MESSAGE with ``browser:end`` and no body, and leaves each message where it
  was, with its id, but flagged ``redelivered`` on its next delivery, and shows at most the
  queue's ``maxBrowsePageSize`` messages, 400 by default (the reference ``activemq.xml``
  raises it; measured on 5.17.2). ``StompBrowser`` reads them.
* A broker with none (RabbitMQ: its STOMP plugin has no browser, and ``basic.get`` is not
  reachable over STOMP): ``taken_and_returned`` takes every message with a client-ack
  subscription of unlimited prefetch, after sending a marker of its own to the back of the
  queue, hands each on until the marker comes, acks (removes) the marker and closes the
  subscription without acking the others, which closes the connection
  (``Dialect.unsubscribe_releases_unacked``). The broker puts each message back where it was,
  in its order, flagged ``redelivered`` (RabbitMQ requeues a message to its original position;
  measured on 3.10.8 with classic queues). A marker left by a browse cut short is removed by
  the next one it meets. While browsing, the queue's other consumers get nothing of it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncGenerator

from mdb.broker import Delivery, SubscriptionRequest
from mdb.destinations import Destination
from mdb.errors import BrokerError, ConnectionLost, SubscriptionFailed
from mdb_stomp.dialect import Dialect
from mdb_stomp.frames import reply_fields, text
from mdb_stomp.receipts import ReceiptErrors, Unanswered
from mdb_stomp.subscription import StompSubscription, ack_token
from mdb_stomp.wire import Wire

MARKER = "mdb_browse_end"
"""The header of the marker a browse without a broker's browser sends to the queue's back."""

_END = object()


class StompBrowser:
    """One ``browser:true`` subscription: its MESSAGE frames, up to ``browser:end``. Made by
    ``browsed``."""

    settled_on_arrival = True  # ack:auto: a browser's copies carry no ack header

    def __init__(self, wire: Wire, dialect: Dialect, queue: Destination) -> None:
        self._wire = wire
        self._dialect = dialect
        self._queue = queue
        self._items: asyncio.Queue[object] = asyncio.Queue()

    def deliver(self, headers: dict[str, str], body: bytes | str | None,
                damage: str | None = None) -> None:
        if headers.get("browser") == "end":
            self._items.put_nowait(_END)
            return
        reply_to, correlation_id = reply_fields(headers)
        content = body if isinstance(body, bytes) else text(body).encode()
        self._items.put_nowait(Delivery(
            destination=self._queue, body=content, headers=headers,
            message_id=self._dialect.message_id(headers),
            broker_redelivered=headers.get("redelivered") == "true", token=None,
            protocol_headers=self._dialect.protocol_headers, reply_to=reply_to,
            correlation_id=correlation_id,
            problem=self._dialect.problem(headers, content, damage)))

    def connection_lost(self, why: str) -> None:
        self._items.put_nowait(ConnectionLost(why))

    def cancelled(self, why: str) -> None:
        self._items.put_nowait(SubscriptionFailed(why))

    async def next(self) -> Delivery | None:
        """The next copy, or None at ``browser:end``; raises how the browse failed."""
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
    browser = StompBrowser(wire, dialect, queue)
    sub_id = wire.next_id()
    wire.attach(sub_id, browser)
    try:
        try:
            await wire.confirm("SUBSCRIBE", {**headers,
                                             "destination": dialect.send_path(queue),
                                             "id": sub_id, "ack": "auto"})
        except Unanswered as unanswered:
            errors = ReceiptErrors(f"browsing {queue}", refused=SubscriptionFailed,
                                   unconfirmed=SubscriptionFailed)
            raise errors.error(unanswered) from None
        while (delivery := await browser.next()) is not None:
            yield delivery
    finally:
        wire.detach(sub_id)
        if wire.is_open:
            wire.unsubscribe_quietly(sub_id)


async def taken_and_returned(wire: Wire, dialect: Dialect,
                             queue: Destination) -> AsyncGenerator[Delivery, None]:
    """The messages of ``queue``, taken and handed back (see the module docstring): the
    connection is closed at the end, or when the iterator is closed early."""
    subscription = await StompSubscription.open(
        wire, dialect, SubscriptionRequest(queue, None, durable=False, selector=None,
                                           prefetch=0))
    marker = uuid.uuid4().hex
    try:
        await wire.request("SEND", {"destination": dialect.send_path(queue), MARKER: marker},
                           errors=ReceiptErrors(f"the end marker of a browse of {queue}",
                                                refused=BrokerError, unconfirmed=BrokerError))
        while True:
            delivery = await subscription.receive()
            found = delivery.headers.get(MARKER)
            if found is None:
                yield delivery
                continue
            token = ack_token(delivery, wire)  # a marker, ours or one a browse left: removed
            token.subscription.unsettled.settle_alone(token.ack_id)
            wire.write("ACK", {"id": token.ack_id})
            if found == marker:
                return
    finally:
        # The connection's end hands every message back; an UNSUBSCRIBE first would only have
        # the broker answer the frames still on their way with errors.
        await wire.close()
        await subscription.close()
