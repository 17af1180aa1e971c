"""One physical queue of the memory broker: FIFO storage and dispatch to its consumers.

A queue holds ready messages in a deque and pushes them to consumers that have room under
their prefetch, round robin: consumers with room wait in a ``ready`` deque; a consumer that
receives a message goes to its back while it still has room. Without selectors a dispatch is
O(1) per message. A consumer with a selector only receives matching messages and the others
stay in the queue for other consumers (ActiveMQ queue semantics); then a dispatch scans the
queue, but only when the set of ready consumers grew or messages were put back in front —
a new message at the tail is only matched itself.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Protocol

from mdb.messages.destinations import Destination, Kind
from mdb.messages.message import OutgoingMessage, ReplyAddress, ReplyTo


@dataclass(frozen=True, slots=True, eq=False)
class StoredMessage:
    """A message as the broker keeps it. Immutable; topic copies share one instance."""

    broker_message_id: str
    destination: Destination  # where it was sent: ``topic:X`` for a topic copy
    body: bytes
    headers: Mapping[str, str]
    reply_to: ReplyAddress | None = None
    correlation_id: str | None = None


def freeze_headers(headers: Mapping[str, str]) -> Mapping[str, str]:
    """A read-only copy of ``headers``, shared by every delivery of the message."""
    return MappingProxyType(dict(headers))


def frozen(message: OutgoingMessage) -> OutgoingMessage:
    """``message`` as sent: its headers a read-only copy, and its reply-to in this broker's
    form, a ``ReplyAddress`` spelling a logical destination (``queue:x``)."""
    reply_to = message.reply_to
    return replace(message, body=bytes(message.body), headers=freeze_headers(message.headers),
                   reply_to=None if reply_to is None else ReplyAddress(str(reply_to)))


def target_of(target: ReplyTo) -> Destination:
    """Where a send to ``target`` goes: a destination, or what a reply address spells."""
    return Destination.parse(target.address if isinstance(target, ReplyAddress) else target)


Entry = tuple[StoredMessage, bool]  # (message, redelivered)


class QueueConsumer(Protocol):
    """What a queue needs from a subscriber (``MemorySubscription``)."""

    @property
    def selective(self) -> bool:
        """True when it takes only the messages its selector matches."""

    def has_room(self) -> bool:
        """True while it may take one more message (under its prefetch)."""

    def matches(self, message: StoredMessage) -> bool:
        """True when it takes ``message``."""

    def push(self, message: StoredMessage, redelivered: bool) -> None:
        """Take ``message``."""


class MemoryQueue:
    __slots__ = (
        "_ready",
        "_ready_set",
        "_selective",
        "_stable",
        "consumers",
        "dequeued",
        "destination",
        "durable",
        "enqueued",
        "in_flight",
        "messages",
        "name",
    )

    def __init__(self, name: str, durable: bool) -> None:
        self.name = name
        self.destination = Destination(Kind.QUEUE, name)
        self.durable = durable  # kept while nobody is attached
        self.messages: deque[Entry] = deque()
        self.consumers: list[QueueConsumer] = []
        self.in_flight = 0  # pushed to a consumer and not settled
        self.enqueued = 0
        self.dequeued = 0
        self._ready: deque[QueueConsumer] = deque()  # consumers with room, in dispatch order
        self._ready_set: set[QueueConsumer] = set()  # the same, to ask "is it ready?" in O(1)
        self._selective = 0  # attached consumers with a selector
        self._stable = True  # no ready consumer matches any message in ``messages``

    # --- messages ----------------------------------------------------------------------------

    def put(self, message: StoredMessage) -> None:
        self.enqueued += 1
        self.messages.append((message, False))
        if not self._ready:
            return
        if self._selective == 0 or not self._stable:
            self.dispatch()
        else:
            self._offer_last()

    def put_back(self, messages: list[StoredMessage]) -> None:
        """Return unsettled messages to the front, in their order, flagged redelivered."""
        self.in_flight -= len(messages)
        self.messages.extendleft((m, True) for m in reversed(messages))
        self._stable = False
        self.dispatch()

    def settled(self) -> None:
        self.in_flight -= 1
        self.dequeued += 1

    # --- consumers ---------------------------------------------------------------------------

    def attach(self, consumer: QueueConsumer) -> None:
        self.consumers.append(consumer)
        if consumer.selective:
            self._selective += 1
        self.offer(consumer)

    def detach(self, consumer: QueueConsumer) -> None:
        self.consumers.remove(consumer)
        if consumer.selective:
            self._selective -= 1
        if consumer in self._ready_set:
            self._ready_set.discard(consumer)
            self._ready.remove(consumer)

    def offer(self, consumer: QueueConsumer) -> None:
        """``consumer`` may have gained room: let it take messages."""
        if consumer in self._ready_set or not consumer.has_room():
            return
        self._ready_set.add(consumer)
        self._ready.append(consumer)
        self._stable = False
        self.dispatch()

    def withdraw(self, consumer: QueueConsumer) -> None:
        """``consumer`` may have lost its room: stop dispatching to it."""
        if consumer in self._ready_set and not consumer.has_room():
            self._ready_set.discard(consumer)
            self._ready.remove(consumer)

    # --- dispatch ----------------------------------------------------------------------------

    def dispatch(self) -> None:
        messages, ready = self.messages, self._ready
        if not messages or not ready:
            self._stable = True
            return
        if self._selective:
            self._dispatch_selective()
            return
        while messages and ready:
            consumer = ready.popleft()
            message, redelivered = messages.popleft()
            self.in_flight += 1
            consumer.push(message, redelivered)
            if consumer.has_room():
                ready.append(consumer)
            else:
                self._ready_set.discard(consumer)
        self._stable = True

    def _give(self, index: int, entry: Entry) -> None:
        ready = self._ready
        consumer = ready[index]
        del ready[index]
        self.in_flight += 1
        consumer.push(entry[0], entry[1])
        if consumer.has_room():
            ready.append(consumer)
        else:
            self._ready_set.discard(consumer)

    def _match(self, message: StoredMessage) -> int:
        for index, consumer in enumerate(self._ready):
            if consumer.matches(message):
                return index
        return -1

    def _offer_last(self) -> None:
        entry = self.messages[-1]
        index = self._match(entry[0])
        if index >= 0:
            self.messages.pop()
            self._give(index, entry)

    def _dispatch_selective(self) -> None:
        messages, ready = self.messages, self._ready
        kept: deque[Entry] = deque()
        while messages and ready:
            entry = messages.popleft()
            index = self._match(entry[0])
            if index >= 0:
                self._give(index, entry)
            else:
                kept.append(entry)
        if kept:
            kept.extend(messages)
            self.messages = kept
        self._stable = True
