"""The shared state of one named memory broker, and the hooks tests use on it.

Every connection to ``memory://NAME`` in a process shares the ``BrokerState`` registered under
NAME (``memory://`` is ``default``). Tests get it with ``broker_state(NAME)`` to look inside
(queues, depths, messages, connections), to wait for a condition, and to inject failures;
``reset(NAME)`` drops its connections and forgets it.

Topics work like ActiveMQ Classic virtual topics: a message sent to ``topic:X`` is copied to
every queue named ``Consumer.<name>.VirtualTopic.X`` that exists at that moment (see
``subscription_queue_name``), and is not kept anywhere when there is none. Such a queue is an
ordinary queue: sending to ``queue:Consumer.<name>.VirtualTopic.X`` feeds that subscription
only, and consumers of the queue share its messages.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

import anyio

from mdb.broker import Delivery
from mdb.destinations import Destination, Kind
from mdb.errors import BrokerError, ConfigurationError, SendOutcomeUnknown
from mdb_memory.queue import MemoryQueue, StoredMessage

if TYPE_CHECKING:
    from mdb_memory.connection import MemoryConnection

DEFAULT_NAME = "default"

_VIRTUAL_TOPIC_QUEUE = re.compile(r"^Consumer\.([^.]+)\.VirtualTopic\.(.+)$")
_message_ids = itertools.count(1)


def subscription_queue_name(topic: str, name: str) -> str:
    """The queue holding the messages of subscription ``name`` on ``topic:<topic>``."""
    return f"Consumer.{name}.VirtualTopic.{topic}"


@dataclass(frozen=True, slots=True)
class QueueStats:
    """A snapshot of one queue, like ActiveMQ's JMX counters."""

    depth: int  # ready messages, not yet pushed to a consumer
    in_flight: int  # pushed to a consumer and not settled
    consumers: int
    enqueued: int  # messages stored since the queue was created
    dequeued: int  # messages settled (acknowledged) since the queue was created
    durable: bool


class BrokerState:
    """One named in-memory broker. Use it from the event loop's thread only."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._queues: dict[str, MemoryQueue] = {}
        self._topics: dict[str, dict[str, MemoryQueue]] = {}  # topic -> subscription -> queue
        self._connections: dict[MemoryConnection, None] = {}
        self._refusing = False
        self._failures_left = 0
        self._failure_type: type[BrokerError] = SendOutcomeUnknown
        self._failure_stored = False
        self._changed: anyio.Event | None = None
        self._waiting = 0  # tasks in wait_until

    def __repr__(self) -> str:
        return (f"<BrokerState {self.name!r}: {len(self._queues)} queues, "
                f"{len(self._connections)} connections>")

    # --- looking inside ------------------------------------------------------------------------

    @property
    def connection_count(self) -> int:
        """Open connections."""
        return len(self._connections)

    def queue_names(self) -> list[str]:
        """Every existing queue, subscription queues included, sorted."""
        return sorted(self._queues)

    def subscription_names(self, topic: str) -> list[str]:
        """Names of the subscriptions (subscription queues) that exist on ``topic:<topic>``."""
        return sorted(self._topics.get(topic, {}))

    def stats(self, destination: Destination | str) -> QueueStats | None:
        """Counters of a queue, or None when it does not exist."""
        queue = self._queues.get(self._queue_name(destination))
        if queue is None:
            return None
        return QueueStats(len(queue.messages), queue.in_flight, len(queue.consumers),
                          queue.enqueued, queue.dequeued, queue.durable)

    def queue_depth(self, destination: Destination | str) -> int:
        """Ready messages of a queue (0 when it does not exist); unsettled ones not counted."""
        queue = self._queues.get(self._queue_name(destination))
        return 0 if queue is None else len(queue.messages)

    def browse(self, destination: Destination | str) -> list[Delivery]:
        """The ready messages of a queue in delivery order, as deliveries that cannot be
        settled (``token`` is None). Does not consume them."""
        queue = self._queues.get(self._queue_name(destination))
        if queue is None:
            return []
        return [Delivery(m.destination, m.body, m.headers, m.broker_message_id, redelivered, None)
                for m, redelivered in queue.messages]

    def delete_queue(self, destination: Destination | str) -> bool:
        """Delete a queue and its messages (e.g. an abandoned durable subscription).
        Returns False when it does not exist or has consumers attached."""
        queue = self._queues.get(self._queue_name(destination))
        if queue is None or queue.consumers:
            return False
        self._forget(queue)
        self._notify()
        return True

    async def wait_until(self, predicate: Callable[[BrokerState], bool]) -> None:
        """Return once ``predicate(state)`` is true; it is checked after every change of the
        state (sends, commits, acks, subscriptions, connections). Wrap it in
        ``anyio.fail_after`` to bound the wait."""
        while not predicate(self):
            changed = self._changed
            if changed is None:
                changed = self._changed = anyio.Event()
            self._waiting += 1
            try:
                await changed.wait()
            finally:
                self._waiting -= 1
                if self._waiting == 0 and self._changed is changed:
                    self._changed = None  # cancelled: an event stays bound to its loop

    # --- injecting failures --------------------------------------------------------------------

    def drop_connections(self) -> int:
        """Lose every open connection, as a broker crash would: ``receive`` raises
        ``ConnectionLost``, open transactions are stale (their ``commit`` raises
        ``TransactionRolledBack``), unsettled deliveries go back to the front of their queues
        flagged redelivered, and nothing done later on the stale objects has any effect.
        Returns how many connections were dropped."""
        dropped = list(self._connections)
        for connection in dropped:
            connection._lose()
        self._notify()
        return len(dropped)

    def fail_sends(self, count: int, error_type: type[BrokerError] = SendOutcomeUnknown,
                   *, stored: bool = False) -> None:
        """Make the next ``count`` sends and commits fail (0 cancels).

        A ``Connection.send`` raises ``error_type`` (e.g. ``SendOutcomeUnknown`` or
        ``ConnectionLost``); a ``Transaction.commit`` raises ``TransactionRolledBack`` (its
        contract) chained from ``error_type``. With ``stored=False`` nothing takes effect: the
        message is not stored, a commit's sends are discarded and its acked deliveries stay
        unsettled. With ``stored=True`` the send or commit does take effect and still raises —
        an in-doubt outcome, like a receipt lost while the broker stored the message.
        """
        if count < 0:
            raise ValueError("count must be >= 0")
        if not (isinstance(error_type, type) and issubclass(error_type, BrokerError)):
            raise TypeError("error_type must be a subclass of mdb.errors.BrokerError")
        self._failures_left = count
        self._failure_type = error_type
        self._failure_stored = stored

    def refuse_connections(self, refuse: bool = True) -> None:
        """While refusing, ``connect`` raises ``ConnectionFailed`` (open connections stay:
        combine with ``drop_connections`` to simulate an outage)."""
        self._refusing = refuse

    @property
    def refusing_connections(self) -> bool:
        return self._refusing

    # --- used by the connection ----------------------------------------------------------------

    def _notify(self) -> None:
        changed = self._changed
        if changed is not None:
            self._changed = None
            changed.set()

    def _take_failure(self) -> tuple[type[BrokerError], bool] | None:
        if self._failures_left <= 0:
            return None
        self._failures_left -= 1
        return self._failure_type, self._failure_stored

    def _queue(self, name: str, durable: bool = True) -> MemoryQueue:
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

    def _release(self, queue: MemoryQueue) -> None:
        """A consumer left ``queue``: a non-durable queue goes away with its last consumer."""
        if not queue.consumers and not queue.durable:
            self._forget(queue)

    def _forget(self, queue: MemoryQueue) -> None:
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

    def _publish(self, destination: Destination, body: bytes, headers: Mapping[str, str]) -> None:
        message = StoredMessage(f"ID:memory-{next(_message_ids)}", destination, body, headers)
        if destination.kind is Kind.TOPIC:
            for queue in self._topics.get(destination.name, {}).values():
                queue.put(message)
        else:
            self._queue(destination.name).put(message)

    def _queue_name(self, destination: Destination | str) -> str:
        destination = Destination.parse(destination)
        if destination.kind is not Kind.QUEUE:
            raise ConfigurationError(
                f"{destination} is a topic: look at one of its subscription queues, "
                f"queue:{subscription_queue_name(destination.name, '<name>')}"
            )
        return destination.name


def freeze_headers(headers: Mapping[str, str]) -> Mapping[str, str]:
    """A read-only copy of ``headers``, shared by every delivery of the message."""
    return MappingProxyType(dict(headers))


# --- the registry --------------------------------------------------------------------------

_states: dict[str, BrokerState] = {}


def broker_state(name: str = DEFAULT_NAME) -> BrokerState:
    """The state of ``memory://<name>``, created when missing."""
    state = _states.get(name)
    if state is None:
        state = _states[name] = BrokerState(name)
    return state


def reset(name: str | None = None) -> None:
    """Forget the broker ``name`` (every broker when None), dropping its connections first.
    The next ``connect`` or ``broker_state`` gets a fresh, empty broker."""
    names = list(_states) if name is None else [name]
    for each in names:
        state = _states.pop(each, None)
        if state is not None:
            state.drop_connections()
