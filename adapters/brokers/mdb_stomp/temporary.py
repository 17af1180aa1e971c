"""``StompTemporaryQueue``: a STOMP ``/temp-queue/<name>`` for the replies to one connection.

Both brokers name a temporary queue ``/temp-queue/<name>`` in the connection that owns it, and
rewrite that name in the ``reply-to`` of its SENDs into one any connection can send to:

* ActiveMQ creates the queue (a JMS ``TemporaryQueue``, deleted with the connection) at the
  SUBSCRIBE, and a receiver of the request sees ``reply-to:/remote-temp-queue/ID:...`` (a Java
  receiver: a ``TemporaryQueue`` as its ``JMSReplyTo``).
* RabbitMQ creates it at the first SEND naming it in ``reply-to``, subscribes the connection to
  it itself (MESSAGE frames carry ``subscription:/temp-queue/<name>``, without ``ack``: they
  are settled on arrival), and a receiver sees ``reply-to:/reply-queue/<generated>``. So no
  SUBSCRIBE is written (``Dialect.subscribes_temporary_queues``).
"""

from __future__ import annotations

import uuid

from mdb.errors import ConnectionLost, SubscriptionFailed
from mdb.messages.destinations import Destination, Kind
from mdb.messages.message import ReplyAddress
from mdb.seam.broker import Delivery, TemporaryQueue
from mdb_stomp.dialects.dialect import Dialect
from mdb_stomp.protocol.frames import delivery_of
from mdb_stomp.protocol.receipts import ReceiptErrors, Unanswered
from mdb_stomp.protocol.wire import Wire
from mdb_stomp.subscriptions.prefetched import Prefetched


class StompTemporaryQueue(TemporaryQueue):
    """One temporary queue of one connection; made by ``open``."""

    settled_on_arrival = True  # ack:auto, or subscribed by RabbitMQ itself

    def __init__(self, wire: Wire, dialect: Dialect, name: str, sub_id: str,
                 subscribed: bool) -> None:
        self._wire = wire
        self._dialect = dialect
        self._name = name
        self._sub_id = sub_id
        self._subscribed = subscribed
        self._prefetched = Prefetched()
        self._closed = False

    @classmethod
    async def open(cls, wire: Wire, dialect: Dialect) -> StompTemporaryQueue:
        """SUBSCRIBE (``ack:auto``) where the broker needs one, with a receipt."""
        wire.check_alive()
        name = uuid.uuid4().hex
        path = f"/temp-queue/{name}"
        subscribed = dialect.subscribes_temporary_queues
        queue = cls(wire, dialect, name, wire.next_id() if subscribed else path, subscribed)
        wire.attach(queue._sub_id, queue)
        if subscribed:
            try:
                await wire.confirm("SUBSCRIBE", {"destination": path, "id": queue._sub_id,
                                                 "ack": "auto"})
            except Unanswered as unanswered:
                wire.detach(queue._sub_id)
                errors = ReceiptErrors(path, refused=SubscriptionFailed,
                                       unconfirmed=SubscriptionFailed)
                raise errors.error(unanswered) from None
        return queue

    @property
    def reply_to(self) -> ReplyAddress:
        return ReplyAddress(f"/temp-queue/{self._name}")

    async def receive(self) -> Delivery:
        return await self._prefetched.get()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._prefetched.fail(ConnectionLost, "the temporary queue was closed")
        self._wire.detach(self._sub_id)
        if self._subscribed and self._wire.is_open:
            # ActiveMQ deletes the queue with the connection; the UNSUBSCRIBE stops delivery.
            self._wire.unsubscribe_quietly(self._sub_id)

    # -- called by the wire, on the loop ----------------------------------------------------

    def deliver(self, headers: dict[str, str], body: bytes | str | None,
                damage: str | None = None) -> None:
        """A MESSAGE frame (already settled: ``ack:auto``); ``damage`` as for a subscription's.
        Either, or a content the broker could not carry, is the ``Delivery.problem`` (a Java
        replier's MapMessage reaches ``Producer.request`` as an error, never as an empty
        body)."""
        self._prefetched.put(delivery_of(self._dialect, Destination(Kind.QUEUE, self._name),
                                         headers, body, damage, None))

    def connection_lost(self, why: str) -> None:
        self._prefetched.fail(ConnectionLost, why)

    def cancelled(self, why: str) -> None:
        self._prefetched.fail(ConnectionLost, why)
