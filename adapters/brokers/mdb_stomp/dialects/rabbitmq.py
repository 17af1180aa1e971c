"""RabbitMQ's dialect (``RabbitMQDialect``, URL scheme ``stomp+rabbitmq``): see the class
docstring for the mapping and the facts it rests on."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping

from mdb.errors import EncodeError, SubscriptionFailed
from mdb.messages.copies import original_expiry, outlives_original
from mdb.messages.destinations import Destination, Kind
from mdb.messages.message import OutgoingMessage, ReplyTo
from mdb.seam.broker import SubscriptionRequest
from mdb_stomp.dialects.dialect import (
    DELIVERY_HEADERS,
    LOCK_PREFIX,
    PROTOCOL_HEADERS,
    Dialect,
    LockSpec,
    SubscribeSpec,
    queue_segment,
)

# RabbitMQ's delay queues (``RabbitMQDialect.delayed``). A message dead-lettered from one keeps
# the arguments of the SEND that declared it as headers, and gains x-first-death-* (x-death,
# an array, does not cross STOMP; 3.13 adds x-last-death-*): a copy sent with them would
# declare its queue with them (a TTL and dead-lettering on an error destination).
DELAY_QUEUE_PREFIX = "mdb.delay."
MAX_QUEUE_NAME_BYTES = 255
DEAD_LETTER_HEADERS = frozenset(
    {"x-message-ttl", "x-dead-letter-exchange", "x-dead-letter-routing-key", "x-death",
     "x-first-death-exchange", "x-first-death-queue", "x-first-death-reason",
     "x-last-death-exchange", "x-last-death-queue", "x-last-death-reason"}
)
# A message's time to live (``expiration``, ms) and the absolute expiry mdb keeps for it
# (``EXPIRES``, ms since the epoch on mdb's clock): see ``RabbitMQDialect.expiry``.
EXPIRATION = "expiration"
EXPIRES = "mdb_expires"

class RabbitMQDialect(Dialect):
    """RabbitMQ 3.x with the STOMP plugin: ``x-queue-name`` queues for named shared
    subscriptions, individual acks, no selectors.

    Mapping::

        logical                    STOMP path     requeue destination
        queue:X                    /queue/X       queue:X
        topic:X  (send)            /topic/X       -
        topic:X  (subscribe, N)    /topic/X  with durable:true, auto-delete:false,
                                   x-queue-name:Consumer.N.X      queue:Consumer.N.X

    Measured on RabbitMQ 3.10.8 (Debian ``rabbitmq-server``, STOMP plugin, stomp.py 9, STOMP
    1.2), with raw stomp.py against a private node of ``tests.harness.servers.rabbitmq``:

    * CONNECT must name a vhost (``/`` unless the URL's path names another, see
      ``StompBroker``): stomp.py otherwise sends the host name as the vhost and the broker
      answers ``ERROR Bad CONNECT: Virtual host '127.0.0.1' access denied``. A SUBSCRIBE the
      user may not make is answered by an ERROR ``access_refused`` naming no receipt, then
      the receipt, then the connection closes (``Wire.confirm`` makes it a refusal).
    * ``SUBSCRIBE /topic/T`` with ``durable:true``, ``auto-delete:false`` and ``x-queue-name:Q``
      binds the durable queue Q to ``amq.topic`` with key T; every subscriber naming Q shares it
      (prefetch 1 each, two messages: one each). ``SEND /queue/Q`` and ``SEND /amq/queue/Q``
      both reach only Q (the default exchange routes by queue name), so the requeue destination
      is the plain ``queue:Q``. ``/amq/queue/Q`` to a queue that does not exist is silently
      dropped (a receipt, no error), while ``/queue/Q`` declares it and keeps the message:
      the safer of the two. Deliveries from Q carry ``destination:/queue/Q``.
    * SUBSCRIBEs that declare one new queue at once, from connections to different nodes of a
      cluster, may race: measured on a three-node 3.10.8 cluster (quorum queues; four
      connections, one per node and one more, subscribing at once to a new topic's queue),
      3 rounds of 80 answered one to three SUBSCRIBEs with an ERROR ``not_found`` ("NOT_FOUND -
      no queue 'Q' in vhost '/'", naming no receipt) and the others with ``AMQP channel
      died``, and closed each of those connections; a SUBSCRIBE made again right after was
      answered. ``lost_race`` makes that ERROR a lost connection, and the SUBSCRIBE is made
      again, as after the others.
    * Prefetch is the ``prefetch-count`` SUBSCRIBE header. ``ack:client`` is cumulative (acking
      the 2nd of 3 unacked deliveries settled the 1st too) and ``client-individual`` is not;
      this dialect uses ``client-individual``, so the adapter's cumulative-ack guard stays
      off for it.
    * Transactions are buffered by the plugin and replayed at COMMIT: a transacted ACK frees no
      prefetch place before the COMMIT (unlike ActiveMQ), a transacted SEND reaches the queue
      only at the COMMIT (after a plain SEND made later), ABORT discards the sends and leaves
      the acked delivery unacked on the live subscription (not redelivered while it lives).
      COMMIT answers its receipt. A COMMIT of an unknown transaction and an ACK with an unknown
      id answer ``ERROR`` frames *without* ``receipt-id`` and keep the connection open: the
      adapter then sees no receipt and reports ``TransactionRolledBack`` after
      ``receipt_timeout``.
    * A delivery not acked when its consumer's connection closes comes back with
      ``redelivered:true`` and a NEW ``message-id`` (mdb identifies messages by ``mdb_id``).
      But UNSUBSCRIBE does NOT hand unacked deliveries back: they stay with the connection
      until it closes (neither a resubscription on the same connection nor another connection
      got it), and a NACK after the UNSUBSCRIBE is refused (``Subscription not found``); a NACK
      before it would be redispatched to the same consumer at once. Hence
      ``unsubscribe_releases_unacked = False``: closing a subscription that holds unsettled
      deliveries closes its connection, and the broker redelivers them, flagged. Nor does the
      UNSUBSCRIBE's receipt end what is on the way: a delivery dispatched while the plugin
      cancelled the consumer comes after that receipt as an ``ERROR`` ``Subscription not
      found`` ("There is no current subscription with tag 'T_1'"), never as a MESSAGE, and
      stays unacked with the connection (measured on 3.10.8: prefetch 1,000 on 3,000 queued
      messages, UNSUBSCRIBE after the first MESSAGE: 22 to 217 MESSAGE frames before the
      receipt, 161 to 189 such ERRORs after it in 4 trials of 5, every one of them unacked
      while the connection stayed open). ``orphans_delivery`` says so, and the wire closes
      the connection (a subscription holding no unsettled delivery keeps it open otherwise).
    * The ``selector`` header is ignored (a message not matching it was delivered), so a
      subscription with a selector is refused rather than silently given every message. (The
      container evaluates topic listeners' selectors itself and never asks for one.)
    * A SEND with ``persistent:false`` to a ``/queue/X`` nobody declared yet makes X
      exclusive; every SEND here is ``persistent:true``, copies too.
    * A SEND's ``priority`` and ``expiration`` (a TTL in ms, enforced: the message is dropped
      once it passed) are the AMQP properties, written back on every MESSAGE frame as given:
      ``expiration`` is the TTL the producer set, not the time left. ``expires`` means
      nothing here (a plain header). A copy (``copy``) sends ``priority`` again; its
      ``expiration`` is the time left (``expiry``), an error copy's none.
    * A receipt asked on a transacted SEND is answered only at the COMMIT (the frames of a
      transaction run then), and neither it nor the COMMIT's proves the SEND was stored: a
      kill -9 of the node right after them lost it, and kept or lost the transaction's ACK
      independently of it. A SEND's receipt outside a transaction is a publisher confirm,
      given once the message is stored (on a quorum queue, by a majority of the nodes):
      ``atomic_transactions = False``, and mdb settles with those
      (``mdb_stomp.dialects.confirmed``). No header limit was met: a SEND with 2,000 headers, or one
      of 200 KB, or 1.6 MB of headers in all, was stored (the adapter's limits are ActiveMQ's:
      ``mdb_stomp.protocol.limits``).
    * Heart-beats count in whole seconds, its own at least 1 s, so mdb's tolerance of its
      silence is 2.5 s; it drops a connection after 2 to 3 of mdb's intervals of silence, at
      least one interval after a cut. mdb's interval is therefore at least 4 s here
      (``mdb_stomp.protocol.heartbeats``).
    * A SEND the user may not make (no ``configure`` permission on the queue, which a SEND to
      ``/queue/X`` declares) in a transaction is refused only after the COMMIT's receipt: an
      ERROR ``access_refused`` follows it and the connection closes. The transaction's ACKs,
      written after its SENDs, die with the channel: the message comes back, flagged
      redelivered, never lost — but a COMMIT receipt does not prove its sends were taken.
    * A NACK requeues the message by default (``requeue:true``, at its old place: the head of
      the queue); with ``requeue:false`` RabbitMQ drops it unless its queue has a dead-letter
      exchange, which STOMP can neither declare on an existing queue nor see: mdb never NACKs
      here (``dead_letters`` is False).

    Queue types (``queue_type``; measured on a three-node 3.10.8 cluster of
    ``tests.harness.servers.rabbitmq_cluster``, docs/rabbitmq.md#queue-types). A SUBSCRIBE, and a
    SEND to ``/queue/X``, *declare* their queue with the ``x-queue-type`` header as its type; with a
    type set, every such frame carries it, because a declaration that differs from the queue
    (a plain ``SEND /queue/X`` to a quorum queue X, a quorum SUBSCRIBE over a classic queue) is
    refused (``PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'X'``) and the
    connection closed: ``explain`` adds the way out. ``x-queue-type:classic`` matches a classic
    queue declared without it. A quorum queue must be durable and not auto-delete (refused
    otherwise), which every queue mdb declares already is. ``/temp-queue/`` reply queues stay
    classic (they live and die with one connection). The header is kept on the message as a
    property, and a quorum queue adds ``x-delivery-count`` (1, 2, ... on each redelivery,
    with ``redelivered:true``): both are ``protocol_headers``, left out of copies. mdb counts
    deliveries in ``mdb_delivery_count``, which a re-send carries on (the quorum queue's count
    starts again with every re-sent copy).
    """

    scheme = "stomp+rabbitmq"
    broker = "RabbitMQ"
    vhost = "/"
    has_vhosts = True
    unsubscribe_releases_unacked = False
    subscribes_temporary_queues = False
    atomic_transactions = False
    heartbeat_unit_ms = 1000
    min_heartbeat_ms = 4000
    queue_types = frozenset({"classic", "quorum"})
    browsing = ("no browser over STOMP: each message is read and put back where it was, "
                "flagged redelivered, and the queue's consumers get none of it meanwhile "
                "(mdb_stomp.queues.read_through)")
    # The expiry headers too: ``expiry`` writes those of a copy (an error copy has none).
    protocol_headers = PROTOCOL_HEADERS | DEAD_LETTER_HEADERS | {
        "x-queue-type", "x-delivery-count", EXPIRATION, EXPIRES}
    delivery_headers = DELIVERY_HEADERS | {"message-id"}  # a new one on each delivery

    def explain(self, error: str) -> str:
        if "inequivalent arg 'x-queue-type'" not in error:
            return error
        return (f"{error} (the queue exists with another type than brokers.{self.name}."
                f"queue_type ({self.queue_type or 'unset: classic'}) declares: drain it and "
                "delete it (`mdb subscriptions --delete`, or `rabbitmqctl delete_queue NAME`) "
                "so that mdb declares it again, or set queue_type to the queue's type)")

    def _declared(self) -> dict[str, str]:
        """The header that declares a queue's type, if one is set."""
        return {} if self.queue_type is None else {"x-queue-type": self.queue_type}

    def lost_race(self, error: str) -> bool:
        # Every SUBSCRIBE here declares its queue: one not found was being declared meanwhile.
        return error.startswith("not_found: NOT_FOUND - no queue ")

    def orphans_delivery(self, error: str) -> bool:
        # Also the answer to an ACK of a subscription already closed: that delivery too stays
        # unacked with the connection (mdb acks nothing stale, but a closed connection is the
        # one way to hand it back).
        return error == "Subscription not found"

    def send_path(self, destination: Destination) -> str:
        if destination.kind is Kind.QUEUE:
            return f"/queue/{destination.name}"
        return f"/topic/{destination.name}"

    def send_headers(self, message: OutgoingMessage, target: ReplyTo) -> dict[str, str]:
        headers = ({"persistent": "true"} if message.copy_of is None
                   else self.copy(message, message.copy_of))
        headers.update(self.expiry(message, round(time.time() * 1000)))
        # A SEND to /queue/X declares X: with the queue's own type, or it is refused. A reply
        # address is not mdb's to declare.
        if isinstance(target, Destination) and target.kind is Kind.QUEUE:
            headers.update(self._declared())
        return headers

    def expiry(self, message: OutgoingMessage, now_ms: int) -> dict[str, str]:
        """The expiry headers of a SEND of ``message`` at ``now_ms`` (ms since the epoch).

        RabbitMQ keeps a message's time to live, not its expiry: ``expiration`` comes back as
        the producer gave it, and RabbitMQ removes it from a message it dead-letters (a copy
        out of a delay queue), so mdb keeps the absolute expiry in ``mdb_expires``. A message
        mdb sends with an ``expiration`` above 0 gets one; a copy keeps the one it has, or
        gets one at its first copy, the time to live counted from then (from a producer that
        is not mdb, RabbitMQ does not say when it was sent), and its ``expiration`` is the
        time left (0 once it passed: see ``outlived``). A copy out of a delay queue has no
        ``expiration`` left, only ``mdb_expires``: RabbitMQ no longer expires it, but a copy of
        it still keeps its expiry. An error copy, or a replay, has neither: it keeps that
        expiry as information only (``mdb.messages.copies.outlives_original``)."""
        if message.copy_of is None:
            ttl = _milliseconds(message.headers.get(EXPIRATION))
            if EXPIRES in message.headers or not ttl:
                return {}
            return {EXPIRES: str(now_ms + ttl)}
        received = message.copy_of
        expires = _milliseconds(received.get(EXPIRES))
        if expires is None:
            ttl = _milliseconds(received.get(EXPIRATION))
            expires = None if ttl is None else now_ms + ttl
        if outlives_original(message.headers):
            return original_expiry(expires)
        if expires is None:
            return {}
        return {EXPIRES: str(expires), EXPIRATION: str(max(expires - now_ms, 0))}

    def outlived(self, message: OutgoingMessage, headers: Mapping[str, str],
                 delay_ms: int) -> bool:
        """A copy whose time left (``expiry``) ends before its delay does, or has ended: sent
        to a delay queue, RabbitMQ would dead-letter it when its time to live ends (the
        shorter one wins), early and without its ``expiration``, to be delivered after its
        expiry; sent with ``expiration:0``, it is delivered to a waiting consumer all the
        same. RabbitMQ drops an expired message: mdb does not send it."""
        left = _milliseconds(headers.get(EXPIRATION))
        return message.copy_of is not None and EXPIRES in headers and left is not None and (
            left <= delay_ms)

    def delayed(self, queue: Destination, delay_ms: int,
                headers: Mapping[str, str]) -> tuple[str, dict[str, str]]:
        """A delay queue of ``queue`` for this delay, ``mdb.delay.<ms>.<queue>``: every
        message in it expires after ``delay_ms`` (``x-message-ttl``) and is dead-lettered
        through the default exchange to ``queue`` (``x-dead-letter-exchange:""``,
        ``x-dead-letter-routing-key``). The SEND declares it (durable) with these arguments;
        the name says them all, so two SENDs never declare it differently (which RabbitMQ
        refuses, closing the connection). A name too long for RabbitMQ (255 bytes) ends in a
        digest of the queue's instead. See docs/rabbitmq.md for what was measured."""
        if queue.kind is not Kind.QUEUE:
            raise EncodeError(f"{queue}: RabbitMQ holds a delayed message for a queue only")
        name = _queue_name(f"{DELAY_QUEUE_PREFIX}{delay_ms}.", queue)
        return f"/queue/{name}", {"x-message-ttl": str(delay_ms), "x-dead-letter-exchange": "",
                                  "x-dead-letter-routing-key": queue.name}

    def lock(self, queue: Destination) -> LockSpec:
        """An exclusive queue, ``mdb.lock.<queue>``, that the connection declares by
        subscribing to it: RabbitMQ deletes it with the connection, and refuses it to any
        other meanwhile (an ERROR ``resource_locked``, "cannot obtain exclusive access to
        locked queue", then the receipt, and the connection closes; measured on 3.10.8). A
        classic queue whatever ``queue_type`` says (a quorum queue cannot be exclusive); the
        user needs the ``configure`` permission on it, as on every queue mdb declares."""
        name = _queue_name(LOCK_PREFIX, queue)
        return LockSpec({}, SubscribeSpec(
            f"/queue/{name}", "auto", {"exclusive": "true", "durable": "false",
                                       "auto-delete": "true"}, Destination(Kind.QUEUE, name)))

    def locked_out(self, error: str) -> bool:
        return "resource_locked" in error.lower()

    def message_id(self, headers: Mapping[str, str]) -> str | None:
        """The AMQP ``message-id`` property its producer gave the message, if any: a STOMP
        SEND's ``amqp-message-id`` header, written back on each MESSAGE frame (measured on
        3.10.8; a SEND with a ``message-id`` header of its own is refused). The broker gives a
        message no id of its own: the ``message-id`` of a MESSAGE frame names that delivery, a
        new one on each."""
        return headers.get("amqp-message-id") or None

    def subscribe_spec(self, request: SubscriptionRequest) -> SubscribeSpec:
        destination = request.destination
        if request.selector:
            raise SubscriptionFailed(
                f"{destination}: RabbitMQ does not support selectors (its STOMP plugin ignores "
                f"the selector {request.selector!r}; filtering a queue here would take messages "
                "from other consumers): remove the selector for this listener, or listen to a "
                "topic, where mdb evaluates selectors itself"
            )
        headers = {"prefetch-count": str(request.prefetch), **self._declared()}
        if destination.kind is Kind.QUEUE:
            return SubscribeSpec(
                f"/queue/{destination.name}", "client-individual", headers, destination
            )
        queue = self.topic_queue(request)
        headers.update({"durable": "true", "auto-delete": "false", "x-queue-name": queue})
        return SubscribeSpec(
            f"/topic/{destination.name}",
            "client-individual",
            headers,
            Destination(Kind.QUEUE, queue),
        )

    def subscription_queue(self, topic: Destination, name: str) -> str:
        return f"Consumer.{queue_segment(topic, name)}.{topic.name}"

    def delete_headers(self, spec: SubscribeSpec) -> dict[str, str]:
        # Measured on 3.10.8: durable:true with the x-queue-name deletes the queue and its
        # messages, even under other subscribers; without the x-queue-name nothing is deleted.
        # A plain UNSUBSCRIBE (StompSubscription.close) never carries these headers.
        return {"durable": "true", "x-queue-name": spec.headers["x-queue-name"]}


def _queue_name(prefix: str, queue: Destination) -> str:
    """``prefix`` and ``queue``'s name, or where that is too long for RabbitMQ (255 bytes) a
    digest of the name instead."""
    name = f"{prefix}{queue.name}"
    if len(name.encode()) > MAX_QUEUE_NAME_BYTES:
        name = f"{prefix}{hashlib.sha256(queue.name.encode()).hexdigest()}"
    return name


def _milliseconds(value: str | None) -> int | None:
    """A count of milliseconds in a header, None where there is none (or not a count)."""
    return int(value) if value is not None and value.isdigit() else None
