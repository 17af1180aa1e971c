"""How logical destinations and subscriptions map onto one broker's STOMP paths and headers.

STOMP leaves destination names, subscription sharing, durability, prefetch and message types to
each broker. Everything broker-specific lives in a ``Dialect``; the rest of ``mdb_stomp``
(connection, subscription, transaction, wire) only speaks plain STOMP 1.2 and asks the dialect
what to put in frames. This module holds the base class and what every dialect shares; each
broker's dialect, with the facts measured on it, has its own module: ``mdb_stomp.dialects.activemq``
(``ActiveMQDialect``, URL scheme ``stomp+activemq``) and ``mdb_stomp.dialects.rabbitmq``
(``RabbitMQDialect``, URL scheme ``stomp+rabbitmq``). The headers a SEND may carry are one set
of limits for every dialect (``mdb_stomp.protocol.limits``), within what each broker was measured to
take.
"""

from __future__ import annotations

import abc
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from mdb.errors import SubscriptionFailed
from mdb.messages.copies import original_expiry, outlives_original
from mdb.messages.destinations import Destination
from mdb.messages.message import OutgoingMessage, ReplyAddress, ReplyTo
from mdb.seam.broker import Delivery, Problem, ProblemKind, SubscriptionRequest

# The headers of a STOMP MESSAGE frame that describe that delivery or frame rather than the
# sender's application (``Dialect.protocol_headers``), on every dialect: the broker's, and
# those the dialects put on a SEND.
PROTOCOL_HEADERS = frozenset(
    {"message-id", "destination", "subscription", "ack", "redelivered", "receipt", "transaction",
     "content-length", "timestamp", "expires", "priority", "persistent", "amq-msg-type"}
)

# The protocol headers of a MESSAGE frame that a copy's SEND carries over (see ``copy``).
_KEPT_ON_COPY = ("priority", "expires")


# The headers of a MESSAGE frame that name that one delivery rather than its message, on every
# dialect (``Dialect.delivery_headers``).
DELIVERY_HEADERS = frozenset({"subscription", "ack"})

# What the lock of a queue is called on a broker (``Dialect.lock``).
LOCK_PREFIX = "mdb.lock."


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


@dataclass(frozen=True, slots=True)
class LockSpec:
    """How a connection of its own holds the lock of a queue (``Connection.lock``): the
    headers its CONNECT adds, and the SUBSCRIBE it makes then, if any."""

    connect_headers: dict[str, str]
    subscribe: SubscribeSpec | None = None


class Dialect(abc.ABC):
    """The broker-specific part of the STOMP adapter. Stateless once made; methods are pure
    (but for the clock RabbitMQ's copies read, ``RabbitMQDialect.expiry``).

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
    #: subscription holding any also closes its connection (``StompSubscription.close``,
    #: ``Capabilities.closing_ends_connection``).
    unsubscribe_releases_unacked: ClassVar[bool] = True
    #: True when a ``/temp-queue/`` is created by subscribing to it (ActiveMQ); False when the
    #: broker creates it and subscribes the connection at the first SEND naming it in
    #: ``reply-to`` (RabbitMQ). See ``mdb_stomp.temporary``.
    subscribes_temporary_queues: ClassVar[bool] = True
    #: True when whether the broker holds a delayed send back depends on its configuration,
    #: which a probe finds out (``mdb_stomp.dialects.scheduler``); False when it always does
    #: (``Capabilities.cannot_hold_delays``).
    probes_delay: ClassVar[bool] = False
    #: True when the broker's STOMP transactions are atomic and durable, and it runs each
    #: frame of one as it reads it (ActiveMQ); False when they only batch frames, replayed at
    #: the COMMIT with no promise (RabbitMQ). ``Capabilities.atomic_transactions``; how each
    #: settles: ``mdb_stomp.transaction``.
    atomic_transactions: ClassVar[bool] = True
    #: The unit the broker counts heart-beat intervals in, and the shortest interval mdb may
    #: promise it so that mdb notices a silent link before the broker does (``heartbeats``).
    heartbeat_unit_ms: ClassVar[int] = 1
    min_heartbeat_ms: ClassVar[int] = 0
    #: What a browse changes on this broker (``Capabilities.browsing``): None for nothing.
    browsing: ClassVar[str | None] = None
    #: True when ``message_id`` is an id the broker gives every message as it takes it, which
    #: a producer cannot choose (``Capabilities.assigned_ids``); False when it is the
    #: producer's.
    assigns_message_ids: ClassVar[bool] = False
    #: The values ``queue_type`` may take on this broker.
    queue_types: ClassVar[frozenset[str]] = frozenset()
    #: The headers of a MESSAGE frame that describe that delivery or frame, or instruct the
    #: broker, rather than carry the sender's application (``Delivery.protocol_headers``):
    #: never copied.
    protocol_headers: ClassVar[frozenset[str]] = PROTOCOL_HEADERS
    #: The headers of a MESSAGE frame that name that one delivery (its subscription, its ack
    #: handle, ...) rather than its message: a browse shows the message without them.
    delivery_headers: ClassVar[frozenset[str]] = DELIVERY_HEADERS

    def __init__(self, queue_type: str | None = None, name: str = "<name>") -> None:
        self.queue_type = queue_type
        self.name = name

    def explain(self, error: str) -> str:
        """The text of an ERROR frame, with what to do about it where the dialect knows."""
        return error

    def orphans_delivery(self, error: str) -> bool:
        """Whether an ERROR frame naming neither a receipt nor a subscription, by its
        ``message`` header ``error``, says that the broker dispatched a delivery to a
        subscription already closed and keeps it, unacknowledged, with the connection until
        the connection closes (``Wire.on_error`` then closes it)."""
        return False

    def lost_race(self, error: str) -> bool:
        """Whether an ERROR frame ``error`` (its ``message`` header and the first line of its
        body), which made a SUBSCRIBE fail, says only that another connection declared the
        queue that SUBSCRIBE declares at the same moment: nothing was refused, and the
        subscription is made again on a new connection (``Wire.confirm``)."""
        return False

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
    def delayed(self, queue: Destination, delay_ms: int,
                headers: Mapping[str, str]) -> tuple[str, dict[str, str]]:
        """Where to SEND a message for ``queue`` that the broker holds back ``delay_ms``
        milliseconds first, and the headers that make it so (``OutgoingMessage.delay``), to
        add over ``headers``, those of the SEND otherwise."""

    def outlived(self, message: OutgoingMessage, headers: Mapping[str, str],
                 delay_ms: int) -> bool:
        """True for a copy (``message.copy_of``), to be sent with ``headers`` and held back
        ``delay_ms`` (0 for none), that expires before it could be delivered, where the broker
        would drop it then: it is not sent, and its delivery is settled with the rest of the
        transaction. False by default: the broker expires a copy itself."""
        return False

    def copy(self, message: OutgoingMessage, received: Mapping[str, str]) -> dict[str, str]:
        """The protocol headers of a SEND of ``message``, a copy of the message received with
        the headers ``received`` (``OutgoingMessage.copy_of``). By default the same
        ``priority`` and ``expires`` (an absolute time, in ms), but the expiry of an error copy
        or a replay, kept as information only (``mdb.messages.copies.outlives_original``); every
        copy is persistent."""
        headers = {name: received[name] for name in _KEPT_ON_COPY if name in received}
        if outlives_original(message.headers):
            expires = headers.pop("expires", "")
            headers.update(original_expiry(int(expires) if expires.isdigit() else None))
        headers["persistent"] = "true"
        return headers

    def problem(self, headers: Mapping[str, str], body: bytes,
                damage: str | None) -> Problem | None:
        """What keeps the MESSAGE frame with ``headers`` and ``body`` from being handed over as
        it was sent (``Delivery.problem``): the ``damage`` the wire found in it, else a
        content this broker could not carry (``unsupported``); None for a whole message."""
        if damage is not None:
            return Problem(ProblemKind.DAMAGED, damage)
        why = self.unsupported(headers, body)
        return None if why is None else Problem(ProblemKind.UNSUPPORTED, why)

    def unsupported(self, headers: Mapping[str, str], body: bytes) -> str | None:
        """Why a MESSAGE frame with ``headers`` and ``body`` holds a message whose content this
        broker could not carry over STOMP (``ProblemKind.UNSUPPORTED``); None for one it
        carried."""
        return None

    def message_id(self, headers: Mapping[str, str]) -> str | None:
        """The id the broker keeps for the message of the MESSAGE frame with ``headers``, the
        same on each of its deliveries (``Delivery.message_id``); None where it keeps none.
        None by default."""
        return None

    def dead_letters(self, delivery: Delivery) -> bool:
        """True when a NACK of ``delivery`` leaves its message on a dead-letter queue the
        broker surely keeps it on (``Capabilities.dead_letters``). False by default: where a
        NACK may drop the message, mdb never sends one."""
        return False

    def dead_letter_origin(self, delivery: Delivery) -> Destination | None:
        """Where the broker says ``delivery``'s message was before it dead-lettered it
        (``Capabilities.dead_letter_origin``). None by default: the broker says nothing."""
        return None

    def browse_headers(self) -> dict[str, str] | None:
        """The SUBSCRIBE headers of a queue browser (``mdb_stomp.queues.browser``); None where the
        broker has none over STOMP, and a browse reads the messages and hands them back
        (``mdb_stomp.queues.read_through``)."""
        return None

    def browse_end(self, headers: Mapping[str, str]) -> bool:
        """Whether the MESSAGE frame with ``headers`` on a queue browser is the broker's own
        end of the browse, told apart from every message by what a producer cannot give one."""
        return False

    @abc.abstractmethod
    def lock(self, queue: Destination) -> LockSpec:
        """How a connection holds the lock of ``queue`` (``mdb_stomp.queues.lock``): something of
        the broker's that one connection at a time may have, named after the queue."""

    def locked_out(self, error: str) -> bool:
        """Whether ``error``, the broker's refusal of what ``lock`` asks, says another
        connection holds it."""
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


def queue_segment(topic: Destination, name: str) -> str:
    """``name`` if it can be one path segment of a queue name, else ``SubscriptionFailed`` (it
    also keeps the queue names of different topics apart)."""
    if not _SEGMENT.match(name):
        raise SubscriptionFailed(
            f"{topic}: subscription name {name!r} may contain only letters, digits, '_' and '-' "
            "(it is one segment of a queue name)"
        )
    return name
