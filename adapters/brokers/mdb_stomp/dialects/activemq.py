"""ActiveMQ Classic's dialect (``ActiveMQDialect``, URL scheme ``stomp+activemq``)::

    logical                    STOMP path                          requeue destination
    queue:X                    /queue/X                            queue:X
    topic:X  (send)            /topic/VirtualTopic.X               -
    topic:X  (subscribe, N)    /queue/Consumer.N.VirtualTopic.X    queue:Consumer.N.VirtualTopic.X

ActiveMQ's virtual-topic pattern ``Consumer.*.VirtualTopic.>`` takes the subscription name as ONE
path segment (a dotted name would silently never receive anything), which is why the seam's
subscription names never contain '.'; one that does is refused. ``Dialect.subscription_queue``
gives the queue name for operators' tools.
"""

from __future__ import annotations

from collections.abc import Mapping

from mdb.errors import ConfigurationError, SubscriptionFailed
from mdb.messages.destinations import Destination, Kind
from mdb.messages.headers import ID
from mdb.messages.message import OutgoingMessage, ReplyTo
from mdb.seam.broker import PAGE, Delivery, SubscriptionRequest
from mdb_stomp.dialects.dialect import (
    LOCK_PREFIX,
    PROTOCOL_HEADERS,
    Dialect,
    LockSpec,
    SubscribeSpec,
    queue_segment,
)

# ActiveMQ's scheduler: a message sent with one of these is held back (``delayed``); one
# delivered by the scheduler carries ``scheduledJobId``, which stops it being held again.
SCHEDULED_DELAY = "AMQ_SCHEDULED_DELAY"
SCHEDULER_HEADERS = frozenset(
    {SCHEDULED_DELAY, "AMQ_SCHEDULED_PERIOD", "AMQ_SCHEDULED_REPEAT", "AMQ_SCHEDULED_CRON",
     "scheduledJobId"}
)

_VIRTUAL_TOPIC_PREFIX = "VirtualTopic."
# The STOMP paths of the destinations mdb names and their kind (a virtual topic before a topic).
_ORIGINS = {"/queue/": Kind.QUEUE, f"/topic/{_VIRTUAL_TOPIC_PREFIX}": Kind.TOPIC,
            "/topic/": Kind.TOPIC}

# What ActiveMQ writes on every MESSAGE frame of a message, never on a browser's end frame.
_STAMPED = frozenset({"expires", "priority", "timestamp"})


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
    settle an earlier unsettled delivery (see ``mdb_stomp.subscriptions.unsettled``).

    A SEND of 1,000 header lines or more, or with one of 10,240 bytes or more, is refused by
    dropping the connection (5.17, raw STOMP 1.2), after the broker went on reading the frames
    behind it: the adapter's ``header_limits`` keep well inside that
    (``mdb_stomp.protocol.limits``), and a transacted SEND is confirmed before anything is acked
    behind it (docs/security.md, "Hostile input: frames").
    """

    scheme = "stomp+activemq"
    broker = "ActiveMQ"
    protocol_headers = PROTOCOL_HEADERS | SCHEDULER_HEADERS
    probes_delay = True
    assigns_message_ids = True  # over STOMP: a SEND's own message-id is ignored (message_id)
    browsing = ("each message browsed is flagged redelivered on its next delivery (a browse "
                "after it included); it stays where it was, with its id; a browse sees at most "
                "the queue's maxBrowsePageSize messages, 400 unless the broker's config raises "
                "it (measured on 5.17.2)")

    def send_path(self, destination: Destination) -> str:
        if destination.kind is Kind.QUEUE:
            return f"/queue/{destination.name}"
        return f"/topic/{_VIRTUAL_TOPIC_PREFIX}{destination.name}"

    def send_headers(self, message: OutgoingMessage, target: ReplyTo) -> dict[str, str]:
        if message.copy_of is not None:
            return self.copy(message, message.copy_of)
        # stomp.py sends non-persistent unless told; ActiveMQ makes a JMS BytesMessage unless
        # told the body is text, which a Java consumer of the same queue would then see as bytes.
        headers = {"persistent": "true"}
        if is_text(message.content_type):
            headers["amq-msg-type"] = "text"
        return headers

    def delayed(self, queue: Destination, delay_ms: int,
                headers: Mapping[str, str]) -> tuple[str, dict[str, str]]:
        """The queue itself, with ``AMQ_SCHEDULED_DELAY``: the broker's scheduler holds the
        message (``schedulerSupport``, see ``mdb_stomp.dialects.scheduler``). Measured on 5.17.2,
        raw STOMP 1.2: a transacted SEND is scheduled at the COMMIT (its delay counts from there)
        and an ABORT discards it; the held message survived a kill -9 of the broker (it is
        in the scheduler's store under the data directory) and came out on time after the
        restart, with its headers and a ``scheduledJobId`` added, without the
        ``AMQ_SCHEDULED_DELAY``. A message carrying a ``scheduledJobId`` is never scheduled
        again (it was delivered at once): a copy does not inherit it (``protocol_headers``).

        Expiry. When it releases a message, the scheduler (5.17.2's ``SchedulerBroker``)
        restarts its time to live: where JMSTimestamp and JMSExpiration are both above 0 and
        ``expiration - timestamp`` is too, the expiration becomes that plus the time of the
        release. A copy sent with the original's ``expires`` (the broker stamps a SEND's
        JMSTimestamp when it has no ``timestamp`` header) came out with its expiry slipped by
        the delay. So a SEND with an expiry carries ``timestamp:0`` (JMS's "no timestamp"): its
        absolute expiry is released unchanged, and a copy whose expiry passed meanwhile is
        expired by the broker as it arrives (into ``ActiveMQ.DLQ``, as without the
        scheduler: see docs/activemq.md#redelivery-delays). It is sent all the same: how the
        broker settles an expired message is its configuration's business, not mdb's."""
        held = {SCHEDULED_DELAY: str(delay_ms)}
        if headers.get("expires", "0") != "0":
            held["timestamp"] = "0"
        return self.send_path(queue), held

    def copy(self, message: OutgoingMessage, received: Mapping[str, str]) -> dict[str, str]:
        """The same JMS message as ``received`` (measured on 5.17.2, Java OpenWire producer,
        raw STOMP 1.2 consumer): ActiveMQ writes ``content-length`` on a MESSAGE frame of a
        BytesMessage only (a TextMessage has none), so a copy of a frame without one is sent
        as text (``amq-msg-type:text``). A TextMessage sent over STOMP comes back with both
        headers, ``amq-msg-type:text`` and ``content-length``, as properties: it is text too.
        ``priority`` and the absolute ``expires`` (the same
        expiry, the remaining time; an error copy has none, JMSExpiration 0) are read from a
        SEND as JMSPriority and JMSExpiration;
        ``persistent:true`` is on persistent messages only, and a SEND without it is
        non-persistent. JMSType (``type``), JMSCorrelationID and the properties are the
        application's headers, kept by the core."""
        headers = super().copy(message, received)
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
        if body or "content-length" in headers or ID in headers:
            return None
        return ("an empty body without content-length: ActiveMQ delivers a JMS MapMessage, "
                "ObjectMessage, StreamMessage or Message so over STOMP, without its content "
                "(or an empty TextMessage, which it cannot be told apart from)")

    def message_id(self, headers: Mapping[str, str]) -> str | None:
        """The JMSMessageID, in ``message-id``: the broker gives every message one when it is
        sent (a STOMP SEND's own ``message-id`` is ignored, measured on 5.17.2) and keeps it
        with the message in its store, on every redelivery and after a restart."""
        return headers.get("message-id") or None

    def dead_letters(self, delivery: Delivery) -> bool:
        """A NACK moves a persistent message to ``ActiveMQ.DLQ`` (the default dead-letter
        strategy; the user needs no right on it), and drops a non-persistent one unless the
        broker's strategy has ``processNonPersistent="true"`` (measured on 5.17.2). The
        reference config sets it, but mdb cannot know a broker's config: only a persistent
        message is NACKed."""
        return delivery.headers.get("persistent") == "true"

    def dead_letter_origin(self, delivery: Delivery) -> Destination | None:
        """The JMS originalDestination, ``original-destination``: where a message was when
        the broker moved it to ``ActiveMQ.DLQ`` (a NACK, an expiry), as a STOMP path
        (``/queue/X``, ``/topic/VirtualTopic.X``). A producer's SEND may set it too, and the
        broker keeps it then, on the first delivery and into ``ActiveMQ.DLQ`` (measured on
        5.17.2): it says where, not who. None where it is absent or names no destination mdb
        can name."""
        path = delivery.headers.get("original-destination", "")
        prefix = next((p for p in _ORIGINS if path.startswith(p)), None)
        if prefix is None:
            return None
        try:
            return Destination.parse(f"{_ORIGINS[prefix]}:{path.removeprefix(prefix)}")
        except ConfigurationError:
            return None

    def browse_headers(self) -> dict[str, str]:
        """A queue browser: ``browser:true`` (copies of the queue's messages, then a MESSAGE
        with ``browser:end``; each message stays where it was, flagged redelivered on its next
        delivery: ``browsing``, measured on 5.17.2), a page at a time. With ``ack:client`` its
        copies carry an ``ack`` header and the broker sends at most the prefetch of them
        unacked; an ACK of one settles nothing (the queue keeps it) and lets the next ones
        come (measured on 5.17.2: 5 of 30 at prefetch 5, 5 more after an ACK, all 30 still
        there after)."""
        return {"browser": "true", "activemq.prefetchSize": str(PAGE)}

    def browse_end(self, headers: Mapping[str, str]) -> bool:
        """The broker's end frame: ``browser:end`` and nothing of what it writes on every
        message, a producer's properties aside (measured on 5.17.2: the end frame is
        ``browser``, ``destination``, ``message-id:0`` and ``subscription``; a message sent
        with ``browser:end``, ``message-id:0`` and ``timestamp:5`` comes with its own
        ``message-id`` and ``expires``, ``priority`` and ``timestamp`` headers, which a
        property can change but never remove)."""
        return headers.get("browser") == "end" and not _STAMPED & headers.keys()

    def lock(self, queue: Destination) -> LockSpec:
        """A JMS client ID, ``mdb.lock.<queue>``: ActiveMQ refuses a second connection with
        the same one ("InvalidClientIDException: ... already connected", measured on
        5.17.2) until the first is gone."""
        return LockSpec({"client-id": f"{LOCK_PREFIX}{queue.name}"})

    def locked_out(self, error: str) -> bool:
        return "InvalidClientIDException" in error or "already connected" in error

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
        return f"Consumer.{queue_segment(topic, name)}.{_VIRTUAL_TOPIC_PREFIX}{topic.name}"

    def delete_headers(self, spec: SubscribeSpec) -> dict[str, str]:
        # Measured on 5.17.2: no UNSUBSCRIBE header (persistent, durable,
        # activemq.subscriptionName), advisory message or command agent deletes a queue over
        # STOMP; only the broker's inactive-destination GC does (docs/activemq.md).
        raise SubscriptionFailed(
            f"ActiveMQ cannot delete queue {spec.requeue_destination.name} over STOMP: delete it "
            "with an ActiveMQ admin tool (JMX, web console), or let the broker remove it once "
            "it is empty and unused (gcInactiveDestinations, see docs/activemq.md)"
        )
