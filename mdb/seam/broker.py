"""The broker seam: everything the container needs from a broker, and nothing more.

An adapter is a package that registers a ``Broker`` factory under a URL scheme in the
``mdb.brokers`` entry-point group (``memory``, ``stomp+activemq``, ...). The container calls
``Broker.connect()`` and then only uses ``Connection``, ``Subscription``, ``Transaction`` and
``TemporaryQueue`` (docs/architecture.md, "The broker seam", says why each member must be).

Rules every adapter keeps:

* Methods are coroutines, except ``Subscription.receive_nowait``, and never block the event
  loop for longer than a socket write.
* Only ``mdb.errors`` exceptions escape; the client library's own are translated here.
* A ``Delivery`` is settled at most once, by ``Transaction.ack`` followed by a successful
  ``commit`` or by ``Connection.ack``. A delivery that is never settled is redelivered by the
  broker, flagged ``redelivered``, when its subscription or connection closes.
* After the connection is lost or closed every object from it is stale: ``subscribe``,
  ``begin``, ``ack`` and ``send`` raise ``ConnectionLost``; ``receive`` raises
  ``ConnectionLost`` (also on a closed subscription, waking a task blocked in it);
  ``Transaction.ack``/``send`` do nothing (or raise ``ConnectionLost``) and ``commit``
  raises ``TransactionRolledBack``.
  Nothing done on a stale object reaches the broker. The container reconnects by calling
  ``Broker.connect()`` again.
* A delivery whose settlement failed (an aborted or rolled-back transaction) stays with its
  live subscription: it is redelivered only once that subscription is closed (an adapter
  whose broker redelivers it sooner says so in its own docstring; the container closes the
  subscription either way).
* A message within the adapter's ``Broker.header_limits`` is never refused for its headers.
* What one broker can do and another cannot is the adapter's ``Capabilities``, which the core
  asks; its protocol's limits and its broker's quirks stay in its docstrings.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import AsyncGenerator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from mdb.messages.destinations import Destination
from mdb.messages.message import OutgoingMessage, ReplyAddress, ReplyTo

# What a factory is made with and what it knows of headers are in a module of their own, and
# part of the seam: adapters and the core import them from here.
from mdb.seam.connection_options import ConnectionOptions as ConnectionOptions
from mdb.seam.connection_options import HeaderLimits as HeaderLimits
from mdb.seam.connection_options import TlsOptions as TlsOptions

PAGE = 100
"""The most deliveries a browse holds at once (``Connection.browse``)."""


@dataclass(frozen=True, slots=True)
class SubscriptionRequest:
    """A subscription the container wants on one broker.

    ``name`` identifies a topic subscription: every subscriber using the same name shares it
    (each message goes to one of them) and a durable one keeps messages while nobody is
    attached. ``name`` is None for a queue; names never contain ``.``. ``prefetch`` is the
    most unsettled deliveries the broker may push to this subscriber at once (a transacted ack
    frees a place only until its transaction ends).
    """

    destination: Destination
    name: str | None
    durable: bool
    selector: str | None
    prefetch: int


class ProblemKind(enum.Enum):
    """The kinds of ``Problem``; each value is the error type the container gives the message
    on the error destination."""

    DAMAGED = "mdb.DamagedFrame"
    """Received in a damaged or inconsistent form (e.g. a MESSAGE frame with a NUL byte in a
    header): the delivery's ``headers`` and ``body`` are what could be read of it, NUL bytes in
    headers replaced by U+FFFD."""
    UNSUPPORTED = "mdb.UnsupportedMessageKind"
    """A kind of message whose body the broker could not carry over the adapter's protocol
    (it arrives without its content; the adapter's docstrings say which kinds): handing it to
    a handler as an empty body would lose its content silently."""


@dataclass(frozen=True, slots=True)
class Problem:
    """Why the adapter cannot hand a delivery over as its sender sent it, ``text`` saying what
    was wrong. The container never hands such a delivery to a handler nor retries it: it
    moves it to the error destination at once."""

    kind: ProblemKind
    text: str


@dataclass(frozen=True, slots=True)
class Delivery:
    """One message as delivered by the broker.

    ``message_id`` is the message's own id as its broker keeps it: the same on every delivery
    of the message, and after a restart of the broker (a JMSMessageID); None where the broker
    keeps none for it (it names each delivery anew). Whether the broker or the producer chose
    it is ``Capabilities.assigned_ids``; the container knows a message that came without an
    ``mdb_id`` by it (``mdb.messages.identity``). ``broker_redelivered`` is the broker's
    redelivered flag; ``token`` is the adapter's own handle needed to settle it and means
    nothing to the container. ``headers`` are all the message's headers, the application's
    and the protocol's; ``protocol_headers`` names those the broker or the adapter's protocol
    put there for this delivery or its frame (a message id, an ack handle, a persistence flag,
    ...): the container leaves them off a copy it re-sends (for a redelivery or to an error
    destination) and hands the adapter the delivery's headers as ``OutgoingMessage.copy_of``
    instead, to keep what makes the copy the same message (a priority, an expiration, ...).
    Names not present may be listed; the same set may be shared by every delivery.

    ``reply_to`` is where the sender asked for a reply (``Transaction.send`` and
    ``Connection.send`` of the same broker accept it as a target) and ``correlation_id`` the
    sender's correlation id; None when the message has none. ``problem`` is set when the
    adapter cannot hand the message over as it was sent (``Problem``).
    """

    destination: Destination
    body: bytes
    headers: Mapping[str, str]
    message_id: str | None
    broker_redelivered: bool
    token: object
    protocol_headers: frozenset[str] = frozenset()
    reply_to: ReplyAddress | None = None
    correlation_id: str | None = None
    problem: Problem | None = None


def never(_: Any) -> bool:
    """The default of a capability that is a question about one delivery or subscription."""
    return False


def untold(_: Delivery) -> Destination | None:
    """The default of a capability that tells something of a delivery: nothing."""
    return None


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a broker can do where brokers differ, as its adapter declares it: the core asks
    this value, never a broker's name. Each default is the least the seam allows."""

    atomic_transactions: bool = True
    """A commit makes its acks and sends take effect together and durably, or none of them
    (else as ``Transaction.commit`` says)."""
    dead_letters: Callable[[Delivery], bool] = never
    """Whether ``Connection.dead_letter`` leaves the delivery's message on a dead-letter queue
    the broker surely keeps it on (rather than dropping it)."""
    dead_letter_origin: Callable[[Delivery], Destination | None] = untold
    """Where the broker says the delivery's message was before it moved it to a dead-letter
    queue (its own, or an expired message's): a destination of that broker, as the broker
    recorded it, which a producer may have written too; None when it says nothing."""
    closing_ends_connection: Callable[[Subscription], bool] = never
    """Whether closing the subscription now also closes its connection, and with it the work
    of the connection's other subscriptions (where the broker keeps unsettled deliveries with
    the connection, closing it is the only way to hand them back)."""
    closing_keeps_unsettled: bool = False
    """True when what a closed subscription held unsettled stays with its connection, to be
    redelivered only once the connection closes (``closing_ends_connection`` says when closing
    one closes its connection therefore); False when closing a subscription hands it back at
    once."""
    cannot_hold_delays: str | None = "its adapter cannot hold a message back"
    """None when the broker holds a message sent with ``OutgoingMessage.delay`` (to a queue)
    back at least that long: from the commit of its transaction (an abort discards it),
    persistent as any (it survives the sender, and a restart where the broker's documentation
    says so), then behind the messages already queued. Else why not, for a startup line: a
    delayed send may then go at once, and the container waits the delay out itself. The delay
    is on ``mdb.clock``'s time, which a broker's own time does not follow while a test drives
    it."""
    browsing: str | None = None
    """None when ``Connection.browse`` leaves every message of the queue where it was, as it
    was; else what browsing changes, in words for an operator (a broker with no browser over
    the adapter's protocol)."""
    assigned_ids: bool = False
    """True when ``Delivery.message_id`` is an id the broker gave the message as it took it,
    which its producer cannot choose; False when it is one the producer gave it
    (``mdb.messages.identity`` binds such an id to the message's content)."""


class Subscription(abc.ABC):
    @property
    @abc.abstractmethod
    def requeue_destination(self) -> Destination:
        """A queue whose messages reach this subscription and nothing else: the container
        re-sends a failed message here to redeliver it with a durable count."""

    @abc.abstractmethod
    async def receive(self) -> Delivery:
        """Wait for the next delivery. Raises ``ConnectionLost`` once the connection drops."""

    @abc.abstractmethod
    def receive_nowait(self) -> Delivery | None:
        """The next delivery if the broker has already pushed it to this subscriber, else
        None; never waits and never raises. It takes from the same stream as ``receive``, in
        dispatch order, and only sees what is already here (at most ``prefetch`` unsettled
        deliveries): the container calls it right after ``receive`` to gather a batch, never
        to poll. On a closed subscription or a lost connection it returns None (``receive``
        then raises ``ConnectionLost``)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Stop receiving. Unsettled deliveries go back to the broker for redelivery.
        A durable subscription keeps existing. Never raises."""


class TemporaryQueue(abc.ABC):
    """A queue that only its connection reads and that lives at most as long as it: where a
    requester waits for replies (a JMS ``TemporaryQueue``).

    A message sent with ``reply_to`` set to ``reply_to`` (on this connection) tells its
    receiver to answer here; the receiver sees its broker's name for it (the adapter's
    docstrings give its form). Deliveries from it are settled when they arrive: never ack
    them; a reply that comes after ``close`` is lost.
    """

    @property
    @abc.abstractmethod
    def reply_to(self) -> ReplyAddress:
        """The ``OutgoingMessage.reply_to`` that sends replies here."""

    @abc.abstractmethod
    async def receive(self) -> Delivery:
        """Wait for the next reply. Raises ``ConnectionLost`` once the connection drops or the
        queue was closed."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Delete the queue (with the replies not yet received). Never raises."""


class Transaction(abc.ABC):
    @abc.abstractmethod
    async def ack(self, delivery: Delivery) -> None:
        """Settle ``delivery`` when, and only if, this transaction commits."""

    @abc.abstractmethod
    async def send(self, destination: ReplyTo, message: OutgoingMessage) -> None:
        """Send ``message`` when, and only if, this transaction commits. ``destination`` may
        be the ``reply_to`` of a delivery from this broker."""

    @abc.abstractmethod
    async def commit(self) -> None:
        """Make the acks and sends take effect together; return once the broker confirmed.
        Raises ``TransactionRolledBack`` when the broker did not confirm (connection lost,
        refused, no receipt in time): then none of it may be relied upon.

        Without ``Capabilities.atomic_transactions`` the sends are made first, each confirmed
        as stored, then the acks: a failed commit may leave sends made and its deliveries
        unsettled (they come back, flagged), never a delivery acked without its sends. One
        that failed once every send was confirmed raises ``AcksUnconfirmed``: its deliveries
        come back, flagged, unless an ack was applied all the same, and their sends need not
        be made again.
        """

    @abc.abstractmethod
    async def abort(self) -> None:
        """Discard the sends; acked deliveries stay unsettled. Never raises."""


class Connection(abc.ABC):
    @abc.abstractmethod
    async def subscribe(self, request: SubscriptionRequest) -> Subscription:
        """Create (or attach to) the subscription and return once the broker confirmed it,
        so that no message sent afterwards is missed. Raises ``SubscriptionFailed``."""

    @abc.abstractmethod
    async def delete_subscription(self, topic: Destination, name: str) -> None:
        """Delete subscription ``name`` of ``topic`` with the messages it holds, for every
        subscriber of it (an abandoned or undeployed subscription). Deleting one that does not
        exist is not an error. Raises ``SubscriptionFailed`` where the broker cannot do it
        (saying what to do instead), ``ConnectionLost`` when the connection is down."""

    @abc.abstractmethod
    async def temporary_queue(self) -> TemporaryQueue:
        """Create a temporary queue for replies to this connection's sends; return once
        messages sent to it are kept. Raises ``SubscriptionFailed``, or ``ConnectionLost``
        when the connection is down."""

    @abc.abstractmethod
    async def begin(self) -> Transaction:
        """Start a transaction. Several may be open at once on one connection."""

    @abc.abstractmethod
    async def ack(self, delivery: Delivery) -> None:
        """Settle ``delivery`` outside any transaction."""

    @abc.abstractmethod
    async def dead_letter(self, delivery: Delivery) -> None:
        """Settle ``delivery`` by handing its message, as it is, to the broker's own dead-letter
        queue, outside any transaction; return once the broker confirmed. Only for a delivery
        ``Capabilities.dead_letters`` accepts: for another, ``BrokerError`` and nothing is
        done. Raises ``ConnectionLost`` as ``ack`` does (the broker redelivers the message),
        and ``BrokerError`` when the broker refused or did not confirm it: the message is then
        on the dead-letter queue or comes back, flagged redelivered."""

    @abc.abstractmethod
    async def send(self, destination: ReplyTo, message: OutgoingMessage) -> None:
        """Send outside any transaction; return once the broker confirmed it stored the message.
        ``destination`` may be the ``reply_to`` of a delivery from this broker. Raises
        ``SendOutcomeUnknown`` when no confirmation came, ``ConnectionLost`` when the message
        surely was not sent."""

    @abc.abstractmethod
    def browse(self, queue: Destination) -> AsyncGenerator[Delivery, None]:
        """The messages of ``queue`` in the order its consumers would get them, from the
        first to the last of those there when browsing began (one sent meanwhile may be
        seen), leaving them there (``Capabilities.browsing`` says what it changes where it
        cannot leave them untouched). A queue that does not exist is seen empty. Every
        message is one: whatever headers a producer gave it, none ends or shortens the
        browse. Its deliveries carry the message's headers, not those of the browse's own
        frames, and are not to be settled: settling one takes nothing off the queue. At most
        a page of them (``PAGE``) is held at once, whatever the size of the queue.
        Iterating raises ``ConnectionLost`` when the connection drops, ``SubscriptionFailed``
        when the broker refuses to browse; closing the iterator early (``aclose``) ends the
        browse, leaving nothing of it on the queue."""

    @abc.abstractmethod
    def take(self, queue: Destination) -> AsyncGenerator[Delivery, None]:
        """The messages of ``queue`` in their order, consumed, for as long as it has any for
        this take: it ends once none is left, never waiting for one that will not come (one
        that expired, or that another consumer took, since the caller saw it), though it may
        wait while another consumer holds one unsettled (it may come back). One sent to the
        queue meanwhile may come too: the caller stops where it means to. Each delivery is
        settled (``Transaction.ack`` and ``commit``, or ``Connection.ack``) before the next is
        asked for. Closing the iterator early (``aclose``) leaves the rest where they are and
        nothing of the take on the queue. Where the broker hands back a delivery in flight
        only so (``Capabilities.closing_ends_connection``), the take's end closes this
        connection. Raises ``ConnectionLost`` and ``SubscriptionFailed`` as ``subscribe`` and
        ``receive`` do."""

    @abc.abstractmethod
    async def lock(self, queue: Destination) -> None:
        """Hold ``queue``'s lock until this connection closes or is lost (its process killed
        included): meanwhile ``lock`` of the same queue on any other connection to the broker
        raises ``QueueLocked``. A lock, not a guard: it keeps out only those who ask for it
        (an operator's tools, ``mdb.commands.dlq.failed``), not the queue's consumers. Raises
        ``ConnectionLost`` when the connection is down, ``BrokerError`` when the broker
        refuses what the lock is made of (the adapter's docstring says what)."""

    @abc.abstractmethod
    async def capabilities(self) -> Capabilities:
        """``Broker.capabilities``, with the answers only a connection can give: the adapter
        may ask its broker the first time (a probe) and keep the answer for the connection; a
        probe that fails is an answer too (cannot). Never raises."""

    @property
    @abc.abstractmethod
    def is_open(self) -> bool:
        """False once the connection was closed or lost."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Close the connection. Open transactions are aborted by the broker. Never raises."""


class Broker(Protocol):
    """Factory registered under a URL scheme; constructed with the connection options. The
    scheme's last part names the broker's OpenTelemetry ``messaging.system``
    (``stomp+activemq``: ``activemq``; ``mdb.seam.registry.system_of``): an adapter registers
    under a scheme that ends with the messaging conventions' value where they have one."""

    header_limits: ClassVar[HeaderLimits]
    """The headers its broker surely takes in one message (``HeaderLimits``), known to the
    factory: the core reads those of every adapter its settings name before making any."""

    capabilities: Capabilities
    """What its broker can do, as far as it can tell before connecting
    (``Connection.capabilities`` may know more)."""

    def __init__(self, options: ConnectionOptions) -> None: ...

    async def connect(self) -> Connection:
        """Open a connection. Raises ``ConnectionFailed``."""
        ...
