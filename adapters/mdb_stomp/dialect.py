"""How logical destinations and subscriptions map onto one broker's STOMP paths and headers.

STOMP leaves destination names, subscription sharing, durability, prefetch and message types to
each broker. Everything broker-specific lives in a ``Dialect``; the connection code in
``mdb_stomp.connection`` only speaks plain STOMP 1.2 and asks the dialect what to put in frames.

ActiveMQ Classic (``ActiveMQDialect``, URL scheme ``stomp+activemq``)::

    logical                    STOMP path                          requeue destination
    queue:X                    /queue/X                            queue:X
    topic:X  (send)            /topic/VirtualTopic.X               -
    topic:X  (subscribe, N)    /queue/Consumer.N.VirtualTopic.X    queue:Consumer.N.VirtualTopic.X

ActiveMQ's virtual-topic pattern ``Consumer.*.VirtualTopic.>`` takes the subscription name as ONE
path segment (a dotted name would silently never receive anything), which is why the seam's
subscription names never contain '.'; one that does is refused. ``physical_subscription_queue``
gives the queue name for operators' tools.
"""

from __future__ import annotations

import abc
import re
from dataclasses import dataclass
from typing import ClassVar

from mdb.broker import SubscriptionRequest
from mdb.destinations import Destination, Kind
from mdb.errors import SubscriptionFailed
from mdb.message import OutgoingMessage


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
    """The broker-specific part of the STOMP adapter. Stateless; methods are pure."""

    #: URL scheme that selects this dialect.
    scheme: ClassVar[str]
    #: Value for the CONNECT frame's ``host`` header; None lets stomp.py send the host name.
    vhost: ClassVar[str | None] = None

    @abc.abstractmethod
    def send_path(self, destination: Destination) -> str:
        """The STOMP destination a message for ``destination`` is sent to."""

    @abc.abstractmethod
    def send_headers(self, message: OutgoingMessage) -> dict[str, str]:
        """Headers this broker needs on every SEND of ``message`` (added over the message's own)."""

    @abc.abstractmethod
    def subscribe_spec(self, request: SubscriptionRequest) -> SubscribeSpec:
        """How to subscribe for ``request``. Raises ``SubscriptionFailed`` for a request this
        broker cannot honour, saying what to set instead."""


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
    settles its deliveries in dispatch order, and the connection refuses an ack that would also
    settle an earlier unsettled delivery (see ``mdb_stomp.connection``).
    """

    scheme = "stomp+activemq"

    def send_path(self, destination: Destination) -> str:
        if destination.kind is Kind.QUEUE:
            return f"/queue/{destination.name}"
        return f"/topic/{_VIRTUAL_TOPIC_PREFIX}{destination.name}"

    def send_headers(self, message: OutgoingMessage) -> dict[str, str]:
        # stomp.py sends non-persistent unless told; ActiveMQ makes a JMS BytesMessage unless
        # told the body is text, which a Java consumer of the same queue would then see as bytes.
        headers = {"persistent": "true"}
        if is_text(message.content_type):
            headers["amq-msg-type"] = "text"
        return headers

    def subscribe_spec(self, request: SubscriptionRequest) -> SubscribeSpec:
        headers = {"activemq.prefetchSize": str(request.prefetch)}
        if request.selector:
            # ActiveMQ parses it on SUBSCRIBE and answers an ERROR for an invalid one.
            headers["selector"] = request.selector
        destination = request.destination
        if destination.kind is Kind.QUEUE:
            return SubscribeSpec(f"/queue/{destination.name}", "client", headers, destination)

        if request.name is None:
            raise SubscriptionFailed(
                f"{destination}: a topic subscription on ActiveMQ needs a subscription name "
                "(it becomes the virtual-topic consumer queue)"
            )
        if not request.durable:
            raise SubscriptionFailed(
                f"{destination} (subscription {request.name!r}): non-durable topic subscriptions "
                "are not supported by the ActiveMQ dialect yet; set durable=true for this "
                "listener (a virtual-topic consumer queue that keeps messages while detached)"
            )
        queue = physical_subscription_queue(destination, request.name)
        return SubscribeSpec(f"/queue/{queue}", "client", headers, Destination(Kind.QUEUE, queue))


def physical_subscription_queue(topic: Destination, name: str) -> str:
    """The ActiveMQ queue holding subscription ``name`` of ``topic``:
    ``Consumer.<name>.VirtualTopic.<topic>``. Raises ``SubscriptionFailed`` for a name that
    cannot be one path segment."""
    if not _SEGMENT.match(name):
        raise SubscriptionFailed(
            f"{topic}: subscription name {name!r} may contain only letters, digits, '_' and '-' "
            "on ActiveMQ (it is one segment of a queue name)"
        )
    return f"Consumer.{name}.{_VIRTUAL_TOPIC_PREFIX}{topic.name}"


DIALECTS: dict[str, type[Dialect]] = {ActiveMQDialect.scheme: ActiveMQDialect}
