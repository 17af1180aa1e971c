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

A message sent with a delay (``OutgoingMessage.delay``) is held by the broker, not by any
connection, until it is due (``held_count``): then it joins the back of its queue.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mdb.errors import BrokerError, ConfigurationError, SendOutcomeUnknown
from mdb.messages.destinations import Destination, Kind
from mdb.seam.broker import Delivery
from mdb_memory.exchange import DEAD_LETTER_QUEUE, Exchange, subscription_queue_name

DEFAULT_NAME = "default"

__all__ = [
    "DEAD_LETTER_QUEUE",
    "DEFAULT_NAME",
    "BrokerState",
    "QueueStats",
    "broker_state",
    "reset",
    "subscription_queue_name",
]


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
    """One named in-memory broker, as tests see it. Use it from the event loop's thread only.

    ``exchange`` is the engine its connections use (``mdb_memory.exchange``)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.exchange = Exchange(name)

    def __repr__(self) -> str:
        return (f"<BrokerState {self.name!r}: {len(self.exchange.queue_names())} queues, "
                f"{self.exchange.connection_count} connections>")

    # --- looking inside ------------------------------------------------------------------------

    @property
    def connection_count(self) -> int:
        """Open connections."""
        return self.exchange.connection_count

    def queue_names(self) -> list[str]:
        """Every existing queue, subscription queues included, sorted."""
        return self.exchange.queue_names()

    def subscription_names(self, topic: str) -> list[str]:
        """Names of the subscriptions (subscription queues) that exist on ``topic:<topic>``."""
        return self.exchange.subscription_names(topic)

    @property
    def held_count(self) -> int:
        """Messages sent with a delay (``OutgoingMessage.delay``) that are not due yet."""
        self.exchange.release_due()
        return self.exchange.held_count

    def stats(self, destination: Destination | str) -> QueueStats | None:
        """Counters of a queue, or None when it does not exist."""
        self.exchange.release_due()
        queue = self.exchange.find(_queue_name(destination))
        if queue is None:
            return None
        return QueueStats(len(queue.messages), queue.in_flight, len(queue.consumers),
                          queue.enqueued, queue.dequeued, queue.durable)

    def queue_depth(self, destination: Destination | str) -> int:
        """Ready messages of a queue (0 when it does not exist); unsettled ones not counted."""
        self.exchange.release_due()
        queue = self.exchange.find(_queue_name(destination))
        return 0 if queue is None else len(queue.messages)

    def browse(self, destination: Destination | str) -> list[Delivery]:
        """The ready messages of a queue in delivery order, as deliveries that cannot be
        settled (``token`` is None). Does not consume them."""
        self.exchange.release_due()
        queue = self.exchange.find(_queue_name(destination))
        if queue is None:
            return []
        return [Delivery(m.destination, m.body, m.headers, m.broker_message_id, redelivered, None,
                         reply_to=m.reply_to, correlation_id=m.correlation_id)
                for m, redelivered in queue.messages]

    def delete_queue(self, destination: Destination | str) -> bool:
        """Delete a queue and its messages (e.g. an abandoned durable subscription).
        Returns False when it does not exist or has consumers attached."""
        queue = self.exchange.find(_queue_name(destination))
        if queue is None or queue.consumers:
            return False
        self.exchange.forget(queue)
        self.exchange.notify()
        return True

    async def wait_until(self, predicate: Callable[[BrokerState], bool]) -> None:
        """Return once ``predicate(state)`` is true; it is checked after every change of the
        state (sends, commits, acks, subscriptions, connections). Wrap it in
        ``anyio.fail_after`` to bound the wait."""
        while not predicate(self):
            await self.exchange.wait_for_change()

    # --- injecting failures --------------------------------------------------------------------

    def drop_connections(self) -> int:
        """Lose every open connection, as a broker crash would: ``receive`` raises
        ``ConnectionLost``, open transactions are stale (their ``commit`` raises
        ``TransactionRolledBack``), unsettled deliveries go back to the front of their queues
        flagged redelivered, and nothing done later on the stale objects has any effect.
        Returns how many connections were dropped."""
        return self.exchange.drop_all()

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
        self.exchange.fail_next(count, error_type, stored)

    def lose_acks(self, count: int, *, confirmed: bool = True) -> None:
        """Make the next ``count`` commits apply their sends but not their acks, and raise
        ``AcksUnconfirmed``, as a broker without atomic transactions whose connection closed
        between its confirms and its acks (RabbitMQ, ``Transaction.commit``): the acked
        deliveries stay unsettled (0 cancels). ``confirmed=False``: they raise
        ``TransactionRolledBack`` instead, as when the close cut off the receipt of a send the
        broker stored all the same."""
        if count < 0:
            raise ValueError("count must be >= 0")
        self.exchange.acks_to_lose = count
        self.exchange.lost_acks_confirmed = confirmed

    def refuse_sends_to(self, destination: Destination | str, refuse: bool = True) -> None:
        """While refusing, a send to ``destination`` is refused as a broker's authorization
        would: ``Connection.send`` raises ``BrokerError`` and a commit holding such a send
        raises ``TransactionRolledBack``, applying nothing. ``queue:DLQ`` holds what
        ``Connection.dead_letter`` hands over (``DEAD_LETTER_QUEUE``)."""
        destination = Destination.parse(destination)
        if refuse:
            self.exchange.forbidden.add(destination)
        else:
            self.exchange.forbidden.discard(destination)

    def refuse_connections(self, refuse: bool = True) -> None:
        """While refusing, ``connect`` raises ``ConnectionFailed`` (open connections stay:
        combine with ``drop_connections`` to simulate an outage)."""
        self.exchange.refusing = refuse

    def hold_subscriptions(self, hold: bool = True) -> None:
        """While holding, ``subscribe`` waits before it acts, as for a broker's answer that has
        not come yet: how many wait at once (``subscriptions_held``, a change ``wait_until``
        sees) tells subscriptions asked together from ones asked one after another. Releasing
        lets them go on."""
        self.exchange.holding_subscriptions = hold
        self.exchange.notify()

    @property
    def subscriptions_held(self) -> int:
        """How many subscribes wait while the broker holds them (``hold_subscriptions``)."""
        return self.exchange.subscriptions_held

    @property
    def refusing_connections(self) -> bool:
        return self.exchange.refusing

    @property
    def refused_connections(self) -> int:
        """How many connection attempts were refused (a change ``wait_until`` sees)."""
        return self.exchange.refused


def _queue_name(destination: Destination | str) -> str:
    destination = Destination.parse(destination)
    if destination.kind is not Kind.QUEUE:
        raise ConfigurationError(
            f"{destination} is a topic: look at one of its subscription queues, "
            f"queue:{subscription_queue_name(destination.name, '<name>')}"
        )
    return destination.name


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
