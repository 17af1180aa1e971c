"""How logical destinations and subscriptions map onto one broker's STOMP paths and headers.

STOMP leaves destination names, subscription sharing, durability, prefetch and message types to
each broker. Everything broker-specific lives in a ``Dialect``; the rest of ``mdb_stomp``
(connection, subscription, transaction, wire) only speaks plain STOMP 1.2 and asks the dialect
what to put in frames.

ActiveMQ Classic (``ActiveMQDialect``, URL scheme ``stomp+activemq``)::

    logical                    STOMP path                          requeue destination
    queue:X                    /queue/X                            queue:X
    topic:X  (send)            /topic/VirtualTopic.X               -
    topic:X  (subscribe, N)    /queue/Consumer.N.VirtualTopic.X    queue:Consumer.N.VirtualTopic.X

ActiveMQ's virtual-topic pattern ``Consumer.*.VirtualTopic.>`` takes the subscription name as ONE
path segment (a dotted name would silently never receive anything), which is why the seam's
subscription names never contain '.'; one that does is refused. ``Dialect.subscription_queue``
gives the queue name for operators' tools.

RabbitMQ (``RabbitMQDialect``, URL scheme ``stomp+rabbitmq``): see the class docstring for the
mapping and the facts it rests on.
"""

from __future__ import annotations

import abc
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from mdb import message as m
from mdb.broker import SubscriptionRequest
from mdb.destinations import Destination, Kind
from mdb.errors import EncodeError, SubscriptionFailed
from mdb.message import OutgoingMessage, ReplyAddress, ReplyTo

# The headers of a STOMP MESSAGE frame that describe that delivery or frame rather than the
# sender's application (``Dialect.protocol_headers``), on every dialect: the broker's, and
# those the dialects put on a SEND.
PROTOCOL_HEADERS = frozenset(
    {"message-id", "destination", "subscription", "ack", "redelivered", "receipt", "transaction",
     "content-length", "timestamp", "expires", "priority", "persistent", "amq-msg-type"}
)

# The protocol headers of a MESSAGE frame that a copy's SEND carries over (see ``copy``).
_KEPT_ON_COPY = ("priority", "expires")

# ActiveMQ's scheduler: a message sent with one of these is held back (``delayed``); one
# delivered by the scheduler carries ``scheduledJobId``, which stops it being held again.
SCHEDULED_DELAY = "AMQ_SCHEDULED_DELAY"
SCHEDULER_HEADERS = frozenset(
    {SCHEDULED_DELAY, "AMQ_SCHEDULED_PERIOD", "AMQ_SCHEDULED_REPEAT", "AMQ_SCHEDULED_CRON",
     "scheduledJobId"}
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


@dataclass(frozen=True, slots=True)
class SubscribeSpec:
    """What to put in a SUBSCRIBE frame for one ``SubscriptionRequest``.

    ``ack_mode`` is the STOMP ``ack`` header; ``headers`` holds the other broker-specific ones
    (the connection adds ``id``, ``destination`` and ``receipt``). ``requeue_destination`` is
    the logical destination that reaches only this subscription (see
    ``Subscription.requeue_destination``).
    """

    path: str
    ack_mode: str
    headers: dict[str, str]
    requeue_destination: Destination


class Dialect(abc.ABC):
    """The broker-specific part of the STOMP adapter. Stateless once made; methods are pure.

    ``queue_type`` is ``brokers.<name>.queue_type`` (``name``, for messages): the kind of
    queue to declare, one of ``queue_types`` (None: the broker's default); ``StompBroker``
    refuses any other.
    """

    #: URL scheme that selects this dialect.
    scheme: ClassVar[str]
    #: The broker's name in messages.
    broker: ClassVar[str]
    #: Value for the CONNECT frame's ``host`` header; None lets stomp.py send the host name.
    vhost: ClassVar[str | None] = None
    #: True when the broker has virtual hosts, named by the URL's path (the CONNECT ``host``
    #: header; ``vhost`` is the default): a URL path is refused where this is False.
    has_vhosts: ClassVar[bool] = False
    #: True when an UNSUBSCRIBE hands the subscription's unacked deliveries back to the broker;
    #: False when they stay with the connection until it closes (RabbitMQ), so that closing a
    #: subscription holding any also closes its connection (see ``StompSubscription.close``).
    unsubscribe_releases_unacked: ClassVar[bool] = True
    #: True when a ``/temp-queue/`` is created by subscribing to it (ActiveMQ); False when the
    #: broker creates it and subscribes the connection at the first SEND naming it in
    #: ``reply-to`` (RabbitMQ). See ``mdb_stomp.temporary``.
    subscribes_temporary_queues: ClassVar[bool] = True
    #: True when whether the broker holds a delayed send back depends on its configuration,
    #: which a probe finds out (``mdb_stomp.scheduler``); False when it always does.
    probes_delay: ClassVar[bool] = False
    #: True when the broker runs each frame of a transaction as it reads it and answers a
    #: receipt on a transacted SEND at once: then such a SEND waits for its receipt before the
    #: transaction writes anything more (see ``StompTransaction.send``). False when it runs
    #: them only at the COMMIT and answers their receipts then (RabbitMQ).
    confirms_transacted_sends: ClassVar[bool] = True
    #: The unit the broker counts heart-beat intervals in, and the shortest interval mdb may
    #: promise it so that mdb notices a silent link before the broker does (``heartbeats``).
    heartbeat_unit_ms: ClassVar[int] = 1
    min_heartbeat_ms: ClassVar[int] = 0
    #: The values ``queue_type`` may take on this broker.
    queue_types: ClassVar[frozenset[str]] = frozenset()
    #: The headers of a MESSAGE frame that describe that delivery or frame, or instruct the
    #: broker, rather than carry the sender's application (``Delivery.protocol_headers``):
    #: never copied.
    protocol_headers: ClassVar[frozenset[str]] = PROTOCOL_HEADERS

    def __init__(self, queue_type: str | None = None, name: str = "<name>") -> None:
        self.queue_type = queue_type
        self.name = name

    def explain(self, error: str) -> str:
        """The text of an ERROR frame, with what to do about it where the dialect knows."""
        return error

    @abc.abstractmethod
    def send_path(self, destination: Destination) -> str:
        """The STOMP destination a message for ``destination`` is sent to."""

    def address(self, target: ReplyTo) -> str:
        """The STOMP destination of a send to ``target``: ``send_path`` of a destination, or
        a reply address verbatim (the broker wrote it in a delivery's ``reply-to``)."""
        return target.address if isinstance(target, ReplyAddress) else self.send_path(target)

    @abc.abstractmethod
    def send_headers(self, message: OutgoingMessage, target: ReplyTo) -> dict[str, str]:
        """Headers this broker needs on every SEND of ``message`` to ``target`` (added over the
        message's own); for a copy (``message.copy_of``), those that keep it the same message
        (``copy``)."""

    @abc.abstractmethod
    def delayed(self, queue: Destination, delay_ms: int) -> tuple[str, dict[str, str]]:
        """Where to SEND a message for ``queue`` that the broker holds back ``delay_ms``
        milliseconds first, and the headers that make it so (``OutgoingMessage.delay``)."""

    def copy(self, received: Mapping[str, str]) -> dict[str, str]:
        """The protocol headers of a SEND of a copy of the message received with the headers
        ``received`` (``OutgoingMessage.copy_of``). By default the same ``priority`` and
        ``expires``, and every copy is persistent."""
        headers = {name: received[name] for name in _KEPT_ON_COPY if name in received}
        headers["persistent"] = "true"
        return headers

    def unsupported(self, headers: Mapping[str, str], body: bytes) -> str | None:
        """Why a MESSAGE frame with ``headers`` and ``body`` holds a message whose content this
        broker could not carry over STOMP (``Delivery.unsupported``); None for one it carried."""
        return None

    def dead_letters(self, headers: Mapping[str, str]) -> bool:
        """True when a NACK of the MESSAGE frame with ``headers`` leaves its message on a
        dead-letter queue the broker surely keeps it on (``Delivery.can_dead_letter``). False
        by default: where a NACK may drop the message, mdb never sends one."""
        return False

    @abc.abstractmethod
    def subscribe_spec(self, request: SubscriptionRequest) -> SubscribeSpec:
        """How to subscribe for ``request``. Raises ``SubscriptionFailed`` for a request this
        broker cannot honour, saying what to set instead."""

    @abc.abstractmethod
    def subscription_queue(self, topic: Destination, name: str) -> str:
        """The broker queue holding subscription ``name`` of ``topic`` (what an operator looks
        for); ``SubscriptionFailed`` for a name that cannot be one segment of it."""

    @abc.abstractmethod
    def delete_headers(self, spec: SubscribeSpec) -> dict[str, str]:
        """Headers of the UNSUBSCRIBE that, following a SUBSCRIBE of ``spec``, deletes the
        subscription's queue; ``SubscriptionFailed`` where no STOMP frame can."""

    def topic_queue(self, request: SubscriptionRequest) -> str:
        """The queue of a topic subscription request; ``SubscriptionFailed`` for one without a
        name or not durable, which no dialect supports yet."""
        topic = request.destination
        if request.name is None:
            raise SubscriptionFailed(
                f"{topic}: a topic subscription on {self.broker} needs a subscription name "
                "(it names the subscription's queue)"
            )
        if not request.durable:
            raise SubscriptionFailed(
                f"{topic} (subscription {request.name!r}): non-durable topic subscriptions "
                f"are not supported on {self.broker} yet; set durable=true for this listener "
                "(a queue that keeps messages while detached)"
            )
        return self.subscription_queue(topic, request.name)


# One STOMP path segment: no wildcards ('*', '>'), no separators ('.', '/').
_SEGMENT = re.compile(r"^[A-Za-z0-9_\-]+$")
_VIRTUAL_TOPIC_PREFIX = "VirtualTopic."


def is_text(content_type: str | None) -> bool:
    """True for ``text/*`` and ``application/json`` content types (parameters ignored)."""
    if not content_type:
        return False
    base = content_type.split(";", 1)[0].strip().lower()
    return base.startswith("text/") or base == "application/json"


class ActiveMQDialect(Dialect):
    """ActiveMQ Classic 5.x: virtual topics for named shared subscriptions, client acks.

    Every subscription uses ``ack:client`` with ``activemq.prefetchSize``. ActiveMQ 5.17 degrades
    badly when transactions ack ``client-individual`` subscriptions (AMQ-7211-like: every COMMIT
    scans an ever-growing list), while ``client`` acks are cumulative: the container keeps one
    subscription per pool slot (prefetch ``max_messages_per_transaction``, 1 by default) and
    settles its deliveries in dispatch order, and the adapter refuses an ack that would also
    settle an earlier unsettled delivery (see ``mdb_stomp.unsettled``).
    """

    scheme = "stomp+activemq"
    broker = "ActiveMQ"
    protocol_headers = PROTOCOL_HEADERS | SCHEDULER_HEADERS
    probes_delay = True

    def send_path(self, destination: Destination) -> str:
        if destination.kind is Kind.QUEUE:
            return f"/queue/{destination.name}"
        return f"/topic/{_VIRTUAL_TOPIC_PREFIX}{destination.name}"

    def send_headers(self, message: OutgoingMessage, target: ReplyTo) -> dict[str, str]:
        if message.copy_of is not None:
            return self.copy(message.copy_of)
        # stomp.py sends non-persistent unless told; ActiveMQ makes a JMS BytesMessage unless
        # told the body is text, which a Java consumer of the same queue would then see as bytes.
        headers = {"persistent": "true"}
        if is_text(message.content_type):
            headers["amq-msg-type"] = "text"
        return headers

    def delayed(self, queue: Destination, delay_ms: int) -> tuple[str, dict[str, str]]:
        """The queue itself, with ``AMQ_SCHEDULED_DELAY``: the broker's scheduler holds the
        message (``schedulerSupport``, see ``mdb_stomp.scheduler``). Measured on 5.17.2, raw
        STOMP 1.2: a transacted SEND is scheduled at the COMMIT (its delay counts from there)
        and an ABORT discards it; the held message survived a kill -9 of the broker (it is
        in the scheduler's store under the data directory) and came out on time after the
        restart, with its headers and a ``scheduledJobId`` added, without the
        ``AMQ_SCHEDULED_DELAY``. A message carrying a ``scheduledJobId`` is never scheduled
        again (it was delivered at once): a copy does not inherit it (``protocol_headers``)."""
        return self.send_path(queue), {SCHEDULED_DELAY: str(delay_ms)}

    def copy(self, received: Mapping[str, str]) -> dict[str, str]:
        """The same JMS message as ``received`` (measured on 5.17.2, Java OpenWire producer,
        raw STOMP 1.2 consumer): ActiveMQ writes ``content-length`` on a MESSAGE frame of a
        BytesMessage only (a TextMessage has none), so a copy of a frame without one is sent
        as text (``amq-msg-type:text``). A TextMessage sent over STOMP comes back with both
        headers, ``amq-msg-type:text`` and ``content-length``, as properties: it is text too.
        ``priority`` and the absolute ``expires`` (the same
        expiry, the remaining time) are read from a SEND as JMSPriority and JMSExpiration;
        ``persistent:true`` is on persistent messages only, and a SEND without it is
        non-persistent. JMSType (``type``), JMSCorrelationID and the properties are the
        application's headers, kept by the core."""
        headers = super().copy(received)
        headers["persistent"] = "true" if received.get("persistent") == "true" else "false"
        if "content-length" not in received or received.get("amq-msg-type") == "text":
            headers["amq-msg-type"] = "text"
        return headers

    def unsupported(self, headers: Mapping[str, str], body: bytes) -> str | None:
        """Over STOMP ActiveMQ delivers a JMS MapMessage, ObjectMessage, StreamMessage or plain
        Message with an empty body and no ``content-length``, exactly as an empty TextMessage,
        and no header tells them apart (measured on 5.17.2; its ``transformation`` SUBSCRIBE
        header, which would turn a MapMessage into JSON, needs XStream and Jettison, which the
        Debian package lacks: the broker drops the connection, NoClassDefFoundError). Such a
        frame is taken for one whose content was lost, unless mdb sent it (``mdb_id``): mdb
        sends text and bytes only."""
        if body or "content-length" in headers or m.ID in headers:
            return None
        return ("an empty body without content-length: ActiveMQ delivers a JMS MapMessage, "
                "ObjectMessage, StreamMessage or Message so over STOMP, without its content "
                "(or an empty TextMessage, which it cannot be told apart from)")

    def dead_letters(self, headers: Mapping[str, str]) -> bool:
        """A NACK moves a persistent message to ``ActiveMQ.DLQ`` (the default dead-letter
        strategy; the user needs no right on it), and drops a non-persistent one unless the
        broker's strategy has ``processNonPersistent="true"`` (measured on 5.17.2). The
        reference config sets it, but mdb cannot know a broker's config: only a persistent
        message is NACKed."""
        return headers.get("persistent") == "true"

    def subscribe_spec(self, request: SubscriptionRequest) -> SubscribeSpec:
        headers = {"activemq.prefetchSize": str(request.prefetch)}
        if request.selector:
            # ActiveMQ parses it on SUBSCRIBE and answers an ERROR for an invalid one.
            headers["selector"] = request.selector
        destination = request.destination
        if destination.kind is Kind.QUEUE:
            return SubscribeSpec(f"/queue/{destination.name}", "client", headers, destination)

        queue = self.topic_queue(request)
        return SubscribeSpec(f"/queue/{queue}", "client", headers, Destination(Kind.QUEUE, queue))

    def subscription_queue(self, topic: Destination, name: str) -> str:
        return f"Consumer.{_segment(topic, name)}.{_VIRTUAL_TOPIC_PREFIX}{topic.name}"

    def delete_headers(self, spec: SubscribeSpec) -> dict[str, str]:
        # Measured on 5.17.2: no UNSUBSCRIBE header (persistent, durable,
        # activemq.subscriptionName), advisory message or command agent deletes a queue over
        # STOMP; only the broker's inactive-destination GC does (docs/activemq.md).
        raise SubscriptionFailed(
            f"ActiveMQ cannot delete queue {spec.requeue_destination.name} over STOMP: delete it "
            "with an ActiveMQ admin tool (JMX, web console), or let the broker remove it once "
            "it is empty and unused (gcInactiveDestinations, see docs/activemq.md)"
        )


def _segment(topic: Destination, name: str) -> str:
    """``name`` if it can be one path segment of a queue name, else ``SubscriptionFailed`` (it
    also keeps the queue names of different topics apart)."""
    if not _SEGMENT.match(name):
        raise SubscriptionFailed(
            f"{topic}: subscription name {name!r} may contain only letters, digits, '_' and '-' "
            "(it is one segment of a queue name)"
        )
    return name


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
    1.2), with raw stomp.py against a private node of ``tests.harness.rabbitmq``:

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
      deliveries closes its connection, and the broker redelivers them, flagged.
    * The ``selector`` header is ignored (a message not matching it was delivered), so a
      subscription with a selector is refused rather than silently given every message. (The
      container evaluates topic listeners' selectors itself and never asks for one.)
    * A SEND with ``persistent:false`` to a ``/queue/X`` nobody declared yet makes X
      exclusive; every SEND here is ``persistent:true``, copies too.
    * A SEND's ``priority`` and ``expiration`` (a TTL in ms, enforced: the message is dropped
      once it passed) are the AMQP properties, written back on every MESSAGE frame as given:
      ``expiration`` is the TTL the producer set, not the time left. ``expires`` means
      nothing here (a plain header). A copy (``copy``) sends ``priority`` again, and the core
      keeps ``expiration`` as one of the application's headers, so a copy's TTL starts again
      (RabbitMQ does not say how much was left).
    * A receipt asked on a transacted SEND is answered only at the COMMIT (the frames of a
      transaction run then): ``confirms_transacted_sends = False``. No header limit was met:
      a SEND with 2,000 headers, or one of 200 KB, was stored.
    * Heart-beats count in whole seconds, its own at least 1 s, so mdb's tolerance of its
      silence is 2.5 s; it drops a connection after 2 to 3 of mdb's intervals of silence, at
      least one interval after a cut. mdb's interval is therefore at least 4 s here
      (``mdb_stomp.heartbeats``).
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
    ``tests.harness.rabbitmq_cluster``, docs/rabbitmq.md#queue-types). A SUBSCRIBE, and a SEND
    to ``/queue/X``, *declare* their queue with the ``x-queue-type`` header as its type; with a
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
    confirms_transacted_sends = False
    heartbeat_unit_ms = 1000
    min_heartbeat_ms = 4000
    queue_types = frozenset({"classic", "quorum"})
    protocol_headers = PROTOCOL_HEADERS | DEAD_LETTER_HEADERS | {"x-queue-type",
                                                                 "x-delivery-count"}

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

    def send_path(self, destination: Destination) -> str:
        if destination.kind is Kind.QUEUE:
            return f"/queue/{destination.name}"
        return f"/topic/{destination.name}"

    def send_headers(self, message: OutgoingMessage, target: ReplyTo) -> dict[str, str]:
        headers = ({"persistent": "true"} if message.copy_of is None
                   else self.copy(message.copy_of))
        # A SEND to /queue/X declares X: with the queue's own type, or it is refused. A reply
        # address is not mdb's to declare.
        if isinstance(target, Destination) and target.kind is Kind.QUEUE:
            headers.update(self._declared())
        return headers

    def delayed(self, queue: Destination, delay_ms: int) -> tuple[str, dict[str, str]]:
        """A delay queue of ``queue`` for this delay, ``mdb.delay.<ms>.<queue>``: every
        message in it expires after ``delay_ms`` (``x-message-ttl``) and is dead-lettered
        through the default exchange to ``queue`` (``x-dead-letter-exchange:""``,
        ``x-dead-letter-routing-key``). The SEND declares it (durable) with these arguments;
        the name says them all, so two SENDs never declare it differently (which RabbitMQ
        refuses, closing the connection). A name too long for RabbitMQ (255 bytes) ends in a
        digest of the queue's instead. See docs/rabbitmq.md for what was measured."""
        if queue.kind is not Kind.QUEUE:
            raise EncodeError(f"{queue}: RabbitMQ holds a delayed message for a queue only")
        name = f"{DELAY_QUEUE_PREFIX}{delay_ms}.{queue.name}"
        if len(name.encode()) > MAX_QUEUE_NAME_BYTES:
            digest = hashlib.sha256(queue.name.encode()).hexdigest()
            name = f"{DELAY_QUEUE_PREFIX}{delay_ms}.{digest}"
        return f"/queue/{name}", {"x-message-ttl": str(delay_ms), "x-dead-letter-exchange": "",
                                  "x-dead-letter-routing-key": queue.name}

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
        return f"Consumer.{_segment(topic, name)}.{topic.name}"

    def delete_headers(self, spec: SubscribeSpec) -> dict[str, str]:
        # Measured on 3.10.8: durable:true with the x-queue-name deletes the queue and its
        # messages, even under other subscribers; without the x-queue-name nothing is deleted.
        # A plain UNSUBSCRIBE (StompSubscription.close) never carries these headers.
        return {"durable": "true", "x-queue-name": spec.headers["x-queue-name"]}


DIALECTS: dict[str, type[Dialect]] = {
    ActiveMQDialect.scheme: ActiveMQDialect,
    RabbitMQDialect.scheme: RabbitMQDialect,
}
