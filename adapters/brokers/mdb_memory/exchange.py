"""``Exchange``: the engine of one named memory broker, which its connections talk to.

It keeps the queues and routes a sent message to them (topics work like ActiveMQ Classic
virtual topics, see ``mdb_memory.state``), holds back a message sent with a delay until it is
due (``OutgoingMessage.delay``), counts down the failures a test injected, knows the open
connections (as ``Link``s it can drop) and wakes whoever waits for a change. Loop thread
only. ``BrokerState`` is the face tests see; connections, subscriptions and transactions use
this object's public methods and nothing else of the broker.

A held message is released by whoever waits on the broker when it falls due (``wait``): the
broker has no task of its own, since it outlives event loops. So nothing is released while
nobody waits; what looks inside (``BrokerState``) releases what is due first. Its time is
``mdb.clock``'s, which a test may drive (``mdb.testing``).
"""

from __future__ import annotations

import heapq
import itertools
import re
from dataclasses import replace
from typing import Protocol

from mdb import clock
from mdb.errors import BrokerError, QueueLocked, SendOutcomeUnknown
from mdb.messages.destinations import Destination, Kind
from mdb.messages.message import OutgoingMessage, ReplyAddress
from mdb_memory.queue import MemoryQueue, StoredMessage
from mdb_memory.signals import Signal

Held = tuple[float, int, Destination, OutgoingMessage]  # (due, order sent, where, message)

_VIRTUAL_TOPIC_QUEUE = re.compile(r"^Consumer\.([^.]+)\.VirtualTopic\.(.+)$")
DEAD_LETTER_QUEUE = "DLQ"  # where ``Connection.dead_letter`` leaves messages, as ActiveMQ.DLQ
_message_ids = itertools.count(1)


def subscription_queue_name(topic: str, name: str) -> str:
    """The queue holding the messages of subscription ``name`` on ``topic:<topic>``."""
    return f"Consumer.{name}.VirtualTopic.{topic}"


class Link(Protocol):
    """An open connection, as the exchange knows it."""

    def lose(self) -> None:
        """The connection dropped, as in a broker crash."""


class Exchange:
    """Queues, routing, injected failures, open connections and change notification of one
    named memory broker."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._queues: dict[str, MemoryQueue] = {}
        self._topics: dict[str, dict[str, MemoryQueue]] = {}  # topic -> subscription -> queue
        self._links: dict[Link, None] = {}
        self._locks: dict[str, Link] = {}  # queue name -> the connection holding its lock
        self._held: list[Held] = []  # a heap: the next message due first
        self._held_order = itertools.count()
        self._waiting: dict[Signal, int] = {}  # what tasks in ``wait`` wait on, and how many
        self._failures_left = 0
        self._failure_type: type[BrokerError] = SendOutcomeUnknown
        self._failure_stored = False
        self._changed = Signal()
        #: While True, new connections are refused (``BrokerState.refuse_connections``).
        self.refusing = False
        #: How many connections were refused so far.
        self.refused = 0
        #: Destinations sends to which are refused (``BrokerState.refuse_sends_to``).
        self.forbidden: set[Destination] = set()
        #: How many more commits apply their sends but not their acks
        #: (``BrokerState.lose_acks``).
        self.acks_to_lose = 0
        #: Whether such a commit says its sends were confirmed (``AcksUnconfirmed``).
        self.lost_acks_confirmed = True
        #: While True, a subscribe waits before it acts (``BrokerState.hold_subscriptions``).
        self.holding_subscriptions = False
        #: How many subscribes wait meanwhile.
        self.subscriptions_held = 0

    # --- queues --------------------------------------------------------------------------------

    def queue(self, name: str, durable: bool = True) -> MemoryQueue:
        """The queue ``name``, created when missing (as ActiveMQ does on first use)."""
        queue = self._queues.get(name)
        if queue is None:
            queue = self._queues[name] = MemoryQueue(name, durable)
            virtual = _VIRTUAL_TOPIC_QUEUE.match(name)
            if virtual is not None:
                subscription, topic = virtual.groups()
                self._topics.setdefault(topic, {})[subscription] = queue
        elif durable:
            queue.durable = True
        return queue

    def find(self, name: str) -> MemoryQueue | None:
        """The queue ``name`` if it exists."""
        return self._queues.get(name)

    def queue_names(self) -> list[str]:
        """Every existing queue, sorted."""
        return sorted(self._queues)

    def subscription_names(self, topic: str) -> list[str]:
        """The subscriptions (subscription queues) of ``topic:<topic>``, sorted."""
        return sorted(self._topics.get(topic, {}))

    def release(self, queue: MemoryQueue) -> None:
        """A consumer left ``queue``: a non-durable queue goes away with its last consumer."""
        if not queue.consumers and not queue.durable:
            self.forget(queue)

    def forget(self, queue: MemoryQueue) -> None:
        """Delete ``queue`` and its messages (nothing if it is no longer the queue of its name)."""
        if self._queues.get(queue.name) is not queue:
            return
        del self._queues[queue.name]
        virtual = _VIRTUAL_TOPIC_QUEUE.match(queue.name)
        if virtual is not None:
            subscription, topic = virtual.groups()
            subscriptions = self._topics.get(topic, {})
            subscriptions.pop(subscription, None)
            if not subscriptions:
                self._topics.pop(topic, None)

    def publish(self, destination: Destination, sent: OutgoingMessage) -> None:
        """Store a message (``queue.frozen``): in the queue, or a copy in every subscription
        queue of the topic; one with a ``delay`` only once that many seconds passed."""
        if sent.delay > 0:
            due = clock.current().now() + sent.delay
            sooner = not self._held or due < self._held[0][0]
            heapq.heappush(self._held, (due, next(self._held_order), destination,
                                        replace(sent, delay=0.0)))
            if sooner:  # whoever waits must wake by then now: let each wait again
                for signal in list(self._waiting):
                    signal.notify()
            return
        reply_to = sent.reply_to
        message = StoredMessage(
            f"ID:memory-{next(_message_ids)}", destination, sent.body, sent.headers,
            reply_to if isinstance(reply_to, ReplyAddress) else None, sent.correlation_id)
        if destination.kind is Kind.TOPIC:
            for queue in self._topics.get(destination.name, {}).values():
                queue.put(message)
        else:
            self.queue(destination.name).put(message)

    @property
    def held_count(self) -> int:
        """Messages sent with a delay and not yet due."""
        return len(self._held)

    def release_due(self) -> None:
        """Store the held messages that are due, in the order they fell due."""
        now = clock.current().now()
        released = False
        while self._held and self._held[0][0] <= now:
            _, _, destination, sent = heapq.heappop(self._held)
            self.publish(destination, sent)
            released = True
        if released:
            self.notify()

    def dead_letter(self, message: StoredMessage) -> None:
        """Keep ``message`` as it is on the dead-letter queue."""
        self.queue(DEAD_LETTER_QUEUE).put(message)

    # --- injected failures ---------------------------------------------------------------------

    def check_allowed(self, destination: Destination) -> None:
        """``BrokerError`` for a send to a destination the broker refuses (as its authorization
        would), before anything is stored."""
        if destination in self.forbidden:
            raise BrokerError(f"memory broker {self.name!r} refused a send to {destination} "
                              "(injected, as a broker's authorization would)")

    def fail_next(self, count: int, error_type: type[BrokerError], stored: bool) -> None:
        """The next ``count`` sends and commits fail (see ``BrokerState.fail_sends``)."""
        self._failures_left = count
        self._failure_type = error_type
        self._failure_stored = stored

    def take_failure(self) -> tuple[type[BrokerError], bool] | None:
        """For a send or commit: the injected failure it must report (its type, and whether it
        takes effect anyway), or None."""
        if self._failures_left <= 0:
            return None
        self._failures_left -= 1
        return self._failure_type, self._failure_stored

    # --- connections ---------------------------------------------------------------------------

    @property
    def connection_count(self) -> int:
        return len(self._links)

    def attach(self, link: Link) -> None:
        """A connection opened."""
        self._links[link] = None
        self.notify()

    def detach(self, link: Link) -> None:
        """A connection closed or was lost: the locks it held are free."""
        self._links.pop(link, None)
        for name in [name for name, holder in self._locks.items() if holder is link]:
            del self._locks[name]
        self.notify()

    def lock(self, name: str, link: Link) -> None:
        """``link`` holds the lock of queue ``name`` (``Connection.lock``); ``QueueLocked``
        when another connection does."""
        holder = self._locks.setdefault(name, link)
        if holder is not link:
            raise QueueLocked(f"memory broker {self.name!r}: queue:{name} is locked by another "
                              "connection")

    def drop_all(self) -> int:
        """Lose every open connection; how many there were."""
        dropped = list(self._links)
        for link in dropped:
            link.lose()
        self.notify()
        return len(dropped)

    # --- changes -------------------------------------------------------------------------------

    def notify(self) -> None:
        """Something changed: wake ``wait_for_change``."""
        self._changed.notify()

    async def wait_for_change(self) -> None:
        """Return at the next change."""
        await self.wait(self._changed)

    async def wait(self, signal: Signal) -> None:
        """Return at the next ``signal``, or once the next held message fell due (released
        then, which may be what ``signal`` waited for). A message held meanwhile that falls
        due sooner notifies ``signal``: the caller checks what it waits for, and waits again."""
        self._waiting[signal] = self._waiting.get(signal, 0) + 1
        try:
            if not self._held:
                await signal.wait()
                return
            time = clock.current()
            with time.deadline(self._held[0][0] - time.now()):
                await signal.wait()
        finally:
            left = self._waiting.pop(signal) - 1
            if left:
                self._waiting[signal] = left
        self.release_due()
