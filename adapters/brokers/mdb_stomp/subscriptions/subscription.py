"""``StompSubscription``: one SUBSCRIBE on one wire, and the tokens of its deliveries.

Closing a subscription. Where an UNSUBSCRIBE leaves the unacked deliveries with the connection
(RabbitMQ, ``Dialect.unsubscribe_releases_unacked``), closing a subscription that still holds
any closes the whole connection, the only way to have them redelivered; see
``StompSubscription.close`` and ``holds_unsettled``.

Staleness. A delivery's token names its subscription and through it its wire (connection
generation), so an ack of a delivery from another generation, or from a closed subscription,
is recognised by ``ack_token`` and never written to any broker.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from mdb.errors import ConnectionLost, SubscriptionFailed
from mdb.messages.destinations import Destination
from mdb.seam.broker import Delivery, Subscription, SubscriptionRequest
from mdb_stomp.dialects.dialect import Dialect
from mdb_stomp.protocol.frames import delivery_of
from mdb_stomp.protocol.receipts import ReceiptErrors, Unanswered
from mdb_stomp.protocol.wire import CLOSE_GRACE, Wire
from mdb_stomp.subscriptions.prefetched import Prefetched
from mdb_stomp.subscriptions.unsettled import Unsettled

log = logging.getLogger("mdb_stomp")


@dataclass(frozen=True, slots=True, eq=False)
class AckToken:
    """``Delivery.token``: the MESSAGE frame's ``ack`` header and the subscription (hence the
    connection generation) it came from."""

    ack_id: str
    subscription: StompSubscription


def ack_token(delivery: Delivery, wire: Wire) -> AckToken:
    """The delivery's token if acking it on ``wire`` is meaningful, else ``ConnectionLost``
    saying why nothing will be written."""
    token = delivery.token
    if not isinstance(token, AckToken) or token.subscription.wire is not wire:
        raise ConnectionLost(
            f"{wire.address}: the delivery of {delivery.headers.get('message-id')} came from "
            "another connection; the broker that sent it redelivers it"
        )
    if token.subscription.closed:
        raise ConnectionLost(
            f"{wire.address}: the subscription of {delivery.headers.get('message-id')} was closed; "
            "the broker redelivers it"
        )
    wire.check_alive()
    return token


def ack_alone(delivery: Delivery, wire: Wire) -> None:
    """ACK ``delivery`` on ``wire`` outside a transaction, without a receipt; raises, writing
    nothing, as ``StompConnection.ack`` says."""
    token = ack_token(delivery, wire)
    token.subscription.unsettled.settle_alone(token.ack_id)
    wire.write("ACK", {"id": token.ack_id})


def holds_unsettled(subscription: Subscription) -> bool:
    """Whether ``subscription`` holds a delivery not settled yet, received or not: closing it
    then closes its connection where an UNSUBSCRIBE leaves unacked deliveries with it
    (``Capabilities.closing_ends_connection`` of such a broker, ``StompSubscription.close``)."""
    return isinstance(subscription, StompSubscription) and bool(subscription.unsettled)


class StompSubscription(Subscription):
    """One SUBSCRIBE on one connection; deliveries are buffered up to the prefetch. Made by
    ``open``."""

    settled_on_arrival = False  # client acks: every MESSAGE carries its ack id

    def __init__(
        self,
        wire: Wire,
        sub_id: str,
        destination: Destination,
        requeue: Destination,
        *,
        cumulative: bool,
        releases_unacked: bool,
        dialect: Dialect,
    ) -> None:
        self.wire = wire
        self._dialect = dialect
        self._id = sub_id
        self._destination = destination
        self._requeue = requeue
        self._releases_unacked = releases_unacked
        self._prefetched = Prefetched()
        self._closed = False
        #: This subscription's unsettled deliveries; transactions claim their acks in it.
        self.unsettled = Unsettled(cumulative=cumulative)

    @classmethod
    async def open(
        cls, wire: Wire, dialect: Dialect, request: SubscriptionRequest
    ) -> StompSubscription:
        """SUBSCRIBE and wait for its receipt; see ``StompConnection.subscribe``."""
        spec = dialect.subscribe_spec(request)
        wire.check_alive()
        sub_id = wire.next_id()
        subscription = cls(
            wire, sub_id, request.destination, spec.requeue_destination,
            cumulative=spec.ack_mode == "client",
            releases_unacked=dialect.unsubscribe_releases_unacked, dialect=dialect,
        )
        errors = ReceiptErrors(
            str(request.destination), refused=SubscriptionFailed, unconfirmed=SubscriptionFailed
        )
        # Attached before the SUBSCRIBE: MESSAGE frames may overtake the receipt.
        wire.attach(sub_id, subscription)
        try:
            await wire.confirm("SUBSCRIBE", {**spec.headers, "destination": spec.path,
                                             "id": sub_id, "ack": spec.ack_mode})
        except Unanswered as unanswered:
            # A refused SUBSCRIBE made nothing to unsubscribe from.
            subscription._abandon(unsubscribe=unanswered.why != "refused")
            raise errors.error(unanswered) from None
        except BaseException:
            subscription._abandon(unsubscribe=True)
            raise
        return subscription

    @property
    def closed(self) -> bool:
        """True once closed (or never created): its deliveries can no longer be acked."""
        return self._closed

    @property
    def requeue_destination(self) -> Destination:
        return self._requeue

    @property
    def unsettled_count(self) -> int:
        """Deliveries the broker dispatched to this subscription and not settled (received
        or not)."""
        return len(self.unsettled)

    async def receive(self) -> Delivery:
        """The next delivery. Raises ``ConnectionLost`` once the connection is lost (buffered
        deliveries are dropped, not drained) or the subscription was closed; also, losing the
        connection, when nothing was read on it for longer than the heart-beats allow: a
        process paused with deliveries buffered must not hand one on as fresh when it resumes
        (``Wire.check_heard``). ``receive_nowait``, called right after, needs no such check."""
        delivery = await self._prefetched.get()
        self.wire.check_heard()
        return delivery

    def receive_nowait(self) -> Delivery | None:
        """A delivery already received from the broker and not yet taken, or None (also on a
        lost connection or a closed subscription, whose buffered deliveries are dropped)."""
        return self._prefetched.get_nowait()

    async def close(self) -> None:
        """UNSUBSCRIBE and wait briefly for its receipt; the broker then redelivers what was
        dispatched and not acked, flagged. Acks of this subscription's deliveries after this
        raise ``ConnectionLost``. Never raises.

        Where the broker keeps unacked deliveries with the connection after an UNSUBSCRIBE
        (``Dialect.unsubscribe_releases_unacked`` false: RabbitMQ), the subscription stays
        registered until the UNSUBSCRIBE receipt, so that deliveries still on the way are
        counted too; if any delivery is then unsettled (or the receipt did not come), the
        connection is closed so that the broker redelivers them. Everything else on that
        connection becomes stale, as after a lost connection."""
        if self._closed:
            return
        wire = self.wire
        self._closed = True
        self._prefetched.fail(ConnectionLost, "the subscription was closed")
        if self._releases_unacked:
            wire.detach(self._id)
        confirmed = False
        try:
            if not wire.is_open:
                return
            await wire.confirm(
                "UNSUBSCRIBE",
                {"id": self._id},
                timeout=min(wire.options.receipt_timeout, CLOSE_GRACE),
            )
            confirmed = True
        except (ConnectionLost, Unanswered):
            log.debug("UNSUBSCRIBE %s on %s unconfirmed", self._id, wire.address)
        finally:
            wire.detach(self._id)
        if not self._releases_unacked and wire.is_open and (self.unsettled or not confirmed):
            log.info(
                "closing the connection to %s: %d unsettled deliveries of a closed "
                "subscription return to the broker only when it closes",
                wire.address,
                len(self.unsettled),
            )
            await wire.close()

    # -- called by the wire, on the loop ----------------------------------------------------

    def deliver(self, headers: dict[str, str], body: bytes | str | None,
                damage: str | None = None) -> None:
        """A MESSAGE frame of this subscription: buffered as a delivery, unsettled; ``damage``
        says what was wrong with a frame the wire found damaged (``Delivery.problem``)."""
        ack_id = headers["ack"]  # the wire hands over only frames that have one
        self.unsettled.dispatched(ack_id)
        self._prefetched.put(delivery_of(self._dialect, self._destination, headers, body, damage,
                                         AckToken(ack_id, self)))

    def connection_lost(self, why: str) -> None:
        """The wire is lost: ``receive`` raises ``ConnectionLost`` saying ``why``."""
        self._prefetched.fail(ConnectionLost, why)

    def cancelled(self, why: str) -> None:
        """The broker ended this subscription (the wire detached it already): closed, and
        ``receive`` raises ``ConnectionLost`` saying ``why``. What it had delivered and not
        settled is the broker's again (its queue's, when that comes back); the container subscribes
        again."""
        self._closed = True
        self._prefetched.fail(ConnectionLost, why)

    def _abandon(self, *, unsubscribe: bool) -> None:
        """The SUBSCRIBE was not confirmed: closed, detached, and unsubscribed if asked."""
        self._closed = True
        self._prefetched.fail(ConnectionLost, "the subscription was not created")
        self.wire.detach(self._id)
        if unsubscribe:
            self.wire.unsubscribe_quietly(self._id)
