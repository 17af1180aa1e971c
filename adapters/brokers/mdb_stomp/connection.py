"""``StompConnection``: the broker seam's ``Connection`` on one STOMP 1.2 wire.

The adapter in one picture: ``StompBroker.connect`` opens a ``Wire`` (``mdb_stomp.protocol.wire``:
the stomp.py connection, its threads bridged onto the loop, receipts, open or lost) and wraps it in
a ``StompConnection``; subscriptions (``mdb_stomp.subscriptions.subscription``) and transactions
(``mdb_stomp.transaction``) made from it hold the same wire and talk to it only through its
public methods. What differs between brokers is asked of the ``Dialect``.

Staleness. A connection is one generation: once it is lost (socket closed, heartbeat timeout,
failed write, ``close``) every pending receipt fails, every subscription's ``receive`` raises
``ConnectionLost`` and prefetched deliveries are dropped (the broker redelivers them, flagged).
An ack of a delivery from another generation, or from a closed subscription, is never written
(see ``mdb_stomp.subscriptions.subscription``).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import replace

import anyio

from mdb import clock
from mdb.errors import BrokerError, SendOutcomeUnknown, SubscriptionFailed
from mdb.messages.destinations import Destination
from mdb.messages.message import OutgoingMessage, ReplyTo
from mdb.seam.broker import Capabilities, Connection, Delivery, SubscriptionRequest
from mdb_stomp.dialects import scheduler
from mdb_stomp.dialects.dialect import Dialect
from mdb_stomp.protocol.frames import send_frame
from mdb_stomp.protocol.receipts import ReceiptErrors
from mdb_stomp.protocol.wire import OpenWire, Wire
from mdb_stomp.queues.browser import browsed
from mdb_stomp.queues.lock import held
from mdb_stomp.queues.read_through import read_back
from mdb_stomp.queues.take import to_marker, watched
from mdb_stomp.subscriptions.subscription import StompSubscription, ack_alone, ack_token
from mdb_stomp.temporary import StompTemporaryQueue
from mdb_stomp.transaction import StompTransaction


class StompConnection(Connection):
    """One STOMP 1.2 connection (one generation) to a broker that can do what ``known`` says
    before connecting. Made by ``StompBroker.connect``; ``open_wire`` opens more connections
    to the same broker, for what this one does on connections of its own (where the broker has
    no browser, a browse and a take's end; the locks it holds)."""

    def __init__(self, wire: Wire, dialect: Dialect, known: Capabilities,
                 open_wire: OpenWire) -> None:
        self._wire = wire
        self._dialect = dialect
        self._known = known
        self._open_wire = open_wire
        self._locks: dict[Destination, Wire] = {}
        self._probing = anyio.Lock()
        self._probed: Capabilities | None = None  # with the probe's answer, once asked

    @property
    def is_open(self) -> bool:
        return self._wire.is_open

    async def subscribe(self, request: SubscriptionRequest) -> StompSubscription:
        """SUBSCRIBE and wait for its receipt. ``SubscriptionFailed`` when the dialect or the
        broker refuses it (an invalid selector, ...) or no receipt comes in time;
        ``ConnectionLost`` when the connection is or goes down meanwhile."""
        return await StompSubscription.open(self._wire, self._dialect, request)

    async def delete_subscription(self, topic: Destination, name: str) -> None:
        """SUBSCRIBE to the subscription, then UNSUBSCRIBE with the dialect's deleting headers,
        each with a receipt. The SUBSCRIBE is not attached: what the broker pushes meanwhile
        is dropped unacked and deleted with the queue."""
        wire = self._wire
        spec = self._dialect.subscribe_spec(
            SubscriptionRequest(topic, name, durable=True, selector=None, prefetch=1))
        deleting = self._dialect.delete_headers(spec)
        sub_id = wire.next_id()
        errors = ReceiptErrors(
            f"subscription {name!r} of {topic}",
            refused=SubscriptionFailed,
            unconfirmed=SubscriptionFailed,
            consequence="the outcome is unknown",
        )
        await wire.request("SUBSCRIBE", {**spec.headers, "destination": spec.path, "id": sub_id,
                                         "ack": spec.ack_mode}, errors=errors)
        await wire.request("UNSUBSCRIBE", {**deleting, "id": sub_id}, errors=errors)

    async def temporary_queue(self) -> StompTemporaryQueue:
        """A ``/temp-queue/`` of this connection (``mdb_stomp.temporary``)."""
        return await StompTemporaryQueue.open(self._wire, self._dialect)

    async def begin(self) -> StompTransaction:
        """A transaction settled as the broker allows (``mdb_stomp.transaction``): a BEGIN,
        held until its first frame (no receipt: a refused BEGIN fails the COMMIT), or nothing
        written before the commit. ``ConnectionLost`` when down."""
        return StompTransaction(self._wire, self._dialect, self._wire.next_id())

    async def ack(self, delivery: Delivery) -> None:
        """ACK outside a transaction, without a receipt.

        Raises, writing nothing: ``ConnectionLost`` when the delivery is stale (from another
        connection or a closed subscription) or the connection is down, and the broker
        redelivers it, flagged; ``BrokerError`` when the delivery was already settled or
        acked in an open transaction, or an earlier delivery of its subscription is still
        unsettled (the cumulative ACK would settle that one too, see
        ``mdb_stomp.subscriptions.unsettled``).
        """
        ack_alone(delivery, self._wire)

    async def dead_letter(self, delivery: Delivery) -> None:
        """NACK with a receipt: the broker moves the message to its dead-letter queue (see
        ``Dialect.dead_letters``). Checked as ``ack`` checks, writing nothing on a failure;
        ``BrokerError`` also for a delivery the dialect would not dead-letter, or when the
        broker refused the NACK or did not answer in time."""
        if not self._dialect.dead_letters(delivery):
            raise BrokerError(f"{self._dialect.broker} may drop message "
                              f"{delivery.headers.get('message-id')} if it is NACKed: not "
                              "dead-lettered")
        token = ack_token(delivery, self._wire)
        token.subscription.unsettled.settle_alone(token.ack_id)
        await self._wire.request("NACK", {"id": token.ack_id}, errors=ReceiptErrors(
            f"the NACK of {delivery.headers.get('message-id')}", refused=BrokerError,
            unconfirmed=BrokerError, consequence="it is on the dead-letter queue or comes back"))

    async def send(self, destination: ReplyTo, message: OutgoingMessage) -> None:
        """SEND with a receipt. ``ConnectionLost`` when it surely was not sent (down before or
        during the write); ``SendOutcomeUnknown`` when no receipt came (timeout, or the
        connection dropped after the write); ``BrokerError`` when the broker refused it. A copy
        that expires first is not sent (``Dialect.outlived``)."""
        headers = send_frame(destination, message, self._dialect)
        if headers is None:
            return
        await self._wire.request(
            "SEND",
            headers,
            message.body,
            errors=ReceiptErrors(
                str(destination),
                refused=BrokerError,
                unconfirmed=SendOutcomeUnknown,
                lost=SendOutcomeUnknown,
                consequence="the message may have been stored",
            ),
        )

    def browse(self, queue: Destination) -> AsyncGenerator[Delivery, None]:
        """Through the broker's queue browser where it has one (``mdb_stomp.queues.browser``), else
        by reading the messages on a connection of its own and handing them back
        (``mdb_stomp.queues.read_through``, ``Capabilities.browsing``)."""
        headers = self._dialect.browse_headers()
        if headers is not None:
            return browsed(self._wire, self._dialect, queue, headers)
        self._wire.check_alive()
        return read_back(self._open_wire, self._dialect, queue)

    def take(self, queue: Destination) -> AsyncGenerator[Delivery, None]:
        """Watched by the broker's queue browser where it has one, else up to an end marker
        of its own, and then its end closes this connection (``mdb_stomp.queues.take``)."""
        browser = self._dialect.browse_headers()
        if browser is not None:
            return watched(self._wire, self._dialect, queue, browser)
        return to_marker(self._wire, self._dialect, queue, self._open_wire)

    async def lock(self, queue: Destination) -> None:
        """Held by a connection of its own, tied to this one (``mdb_stomp.queues.lock``): ActiveMQ's
        JMS client ID ``mdb.lock.<queue>``, RabbitMQ's exclusive queue of that name, which
        the user must be allowed to declare."""
        self._wire.check_alive()
        if queue not in self._locks:
            self._locks[queue] = await held(self._open_wire, self._dialect, queue, self._wire)

    async def capabilities(self) -> Capabilities:
        """What the broker can do, whether it holds delayed sends back answered: always on
        RabbitMQ (delay queues, ``RabbitMQDialect.delayed``); on ActiveMQ when its scheduler is
        on, which the first call probes (``mdb_stomp.dialects.scheduler``) and later ones remember
        for this connection. Never while a test drives ``mdb.clock``: the broker's time would not
        follow it."""
        if clock.current() is not clock.SYSTEM:
            return replace(self._known, cannot_hold_delays="mdb.clock is a test's clock, which "
                           "the broker's own time does not follow")
        if not self._dialect.probes_delay:
            return self._known
        async with self._probing:
            if self._probed is None:
                self._probed = replace(self._known,
                                       cannot_hold_delays=await scheduler.probe(self._wire))
            return self._probed

    async def close(self) -> None:
        """DISCONNECT, wait briefly for its receipt, then close the socket; then the same for
        each lock's connection. Never raises and returns within about min(receipt_timeout,
        2 s) for each even on a hung broker."""
        await self._wire.close()
        for lock in self._locks.values():
            await lock.close()
