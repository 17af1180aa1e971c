"""Connections, subscriptions and transactions of the memory broker (the seam's objects).

Behaviour follows ActiveMQ Classic where the seam leaves room:

* Prefetch counts a subscription's unsettled deliveries, except those acked in a transaction
  that is still open: like ActiveMQ, a transacted ack widens the prefetch window by one until
  the transaction ends. A commit settles the delivery; an abort (or a failed commit) leaves it
  unsettled with the subscriber, holding prefetch room again, and it is not redelivered on the
  live subscription — it can be acked again, and it goes back to its queue, flagged
  redelivered, when the subscription or the connection closes.
* A commit is atomic: if one of its acked deliveries is no longer unsettled on this connection
  (its subscription closed, it was settled elsewhere, it came from another connection) the
  whole commit is rolled back and raises ``TransactionRolledBack``.
* On a closed or lost connection ``subscribe``, ``begin``, ``ack`` and ``send`` raise
  ``ConnectionLost``; ``Transaction.ack`` and ``send`` on a finished or stale transaction do
  nothing (its ``commit`` raises ``TransactionRolledBack``); ``receive`` on a closed
  subscription raises ``ConnectionLost`` too, since no delivery will ever come.
* Every operation except the ``close``/``abort`` family and ``receive_nowait`` is a cancellation
  point before it acts: cancelled means not done. ``close`` and ``abort`` act first and cannot be
  cancelled; ``receive_nowait`` is not a coroutine.
"""

from __future__ import annotations

import itertools
import re
from collections import deque
from collections.abc import Mapping

import anyio
import anyio.lowlevel

from mdb.broker import (
    Connection,
    Delivery,
    Subscription,
    SubscriptionRequest,
    Transaction,
)
from mdb.destinations import Destination, Kind
from mdb.errors import ConnectionLost, SubscriptionFailed, TransactionRolledBack
from mdb.message import OutgoingMessage
from mdb.selector import Matcher, SelectorError, compile_selector
from mdb_memory.queue import MemoryQueue, StoredMessage
from mdb_memory.state import BrokerState, freeze_headers, subscription_queue_name

# A subscription name becomes one segment of ``Consumer.<name>.VirtualTopic.<topic>``.
_SEGMENT = re.compile(r"^[A-Za-z0-9_\-]+$")
_anonymous = itertools.count(1)
_checkpoint = anyio.lowlevel.checkpoint
_shielded_checkpoint = anyio.lowlevel.cancel_shielded_checkpoint


class _Token:
    """``Delivery.token``: one push of one message to one subscription."""

    __slots__ = ("held", "message", "subscription")

    def __init__(self, subscription: MemorySubscription, message: StoredMessage) -> None:
        self.subscription = subscription
        self.message = message
        self.held = 0  # open transactions that acked it


class MemorySubscription(Subscription):
    def __init__(self, connection: MemoryConnection, queue: MemoryQueue,
                 request: SubscriptionRequest, selector: Matcher | None) -> None:
        self._connection = connection
        self._queue = queue
        self._request = request
        self._prefetch = request.prefetch
        self._selector = selector
        self._unsettled: dict[_Token, None] = {}  # in push order
        self._held = 0  # unsettled deliveries acked in an open transaction
        self._buffer: deque[Delivery] = deque()  # pushed, not yet received
        self._wakeup: anyio.Event | None = None
        self._waiting = 0  # tasks waiting on _wakeup
        self._in_ready = False  # waiting in the queue's ready deque
        self._ended: str | None = None  # "closed" or "lost"

    def __repr__(self) -> str:
        return (f"<MemorySubscription {self._request.destination} via queue:{self._queue.name}"
                f"{' ' + self._ended if self._ended else ''}>")

    @property
    def requeue_destination(self) -> Destination:
        """The queue this subscription consumes: the queue itself for a queue subscription,
        ``queue:Consumer.<name>.VirtualTopic.<topic>`` for a topic subscription."""
        return self._queue.destination

    @property
    def request(self) -> SubscriptionRequest:
        return self._request

    @property
    def unsettled_count(self) -> int:
        """Deliveries pushed to this subscription and not settled (received or not)."""
        return len(self._unsettled)

    async def receive(self) -> Delivery:
        await _checkpoint()
        while True:
            if self._buffer:
                return self._buffer.popleft()
            if self._ended is not None:
                raise ConnectionLost(
                    f"subscription to {self._request.destination} on memory broker "
                    f"{self._connection._state.name!r}: "
                    + ("the connection was lost" if self._ended == "lost" else "it was closed")
                )
            await self._wait()

    def receive_nowait(self) -> Delivery | None:
        """A delivery already pushed to this subscription, or None. Not a cancellation point."""
        return self._buffer.popleft() if self._buffer else None

    async def close(self) -> None:
        if self._ended is None:
            self._end(lost=False)
            self._connection._state._notify()
        await _shielded_checkpoint()

    # --- called by the queue -------------------------------------------------------------------

    def _has_room(self) -> bool:
        return len(self._unsettled) - self._held < self._prefetch

    def _matches(self, message: StoredMessage) -> bool:
        selector = self._selector
        return selector is None or selector(message.headers)

    def _push(self, message: StoredMessage, redelivered: bool) -> None:
        token = _Token(self, message)
        self._unsettled[token] = None
        self._buffer.append(Delivery(message.destination, message.body, message.headers,
                                     message.broker_message_id, redelivered, token))
        self._wake()

    # --- called by the connection and transactions ---------------------------------------------

    async def _wait(self) -> None:
        wakeup = self._wakeup
        if wakeup is None:
            wakeup = self._wakeup = anyio.Event()
        self._waiting += 1
        try:
            await wakeup.wait()
        finally:
            self._waiting -= 1
            if self._waiting == 0 and self._wakeup is wakeup:
                self._wakeup = None  # cancelled: never keep an event nobody waits on

    def _wake(self) -> None:
        wakeup = self._wakeup
        if wakeup is not None:
            self._wakeup = None
            wakeup.set()

    def _settle(self, token: _Token) -> bool:
        if token not in self._unsettled:
            return False
        del self._unsettled[token]
        if token.held:
            self._held -= 1
        self._queue.settled()
        self._queue.offer(self)
        return True

    def _hold(self, token: _Token) -> None:
        """Acked in an open transaction: the delivery stops counting against prefetch."""
        token.held += 1
        if token.held == 1 and token in self._unsettled:
            self._held += 1
            self._queue.offer(self)

    def _unhold(self, token: _Token) -> None:
        """The transaction ended without settling it: it counts against prefetch again."""
        token.held -= 1
        if token.held == 0 and token in self._unsettled:
            self._held -= 1
            self._queue.withdraw(self)

    def _end(self, *, lost: bool) -> None:
        """Detach from the queue and give every unsettled delivery back, flagged."""
        if self._ended is not None:
            return
        self._ended = "lost" if lost else "closed"
        returned = [token.message for token in self._unsettled]
        self._unsettled.clear()
        self._held = 0
        self._buffer.clear()
        queue = self._queue
        queue.detach(self)
        if returned:
            queue.put_back(returned)
        self._connection._state._release(queue)
        self._connection._subscriptions.pop(self, None)
        self._wake()


class MemoryTransaction(Transaction):
    def __init__(self, connection: MemoryConnection) -> None:
        self._connection = connection
        self._acks: dict[_Token, None] = {}
        self._foreign = False  # acked a delivery of another connection
        self._sends: list[tuple[Destination, bytes, Mapping[str, str]]] = []
        self._status = "open"  # then "committed", "rolled back", "aborted", "closed", "stale"

    def __repr__(self) -> str:
        return (f"<MemoryTransaction {self._status}: "
                f"{len(self._acks)} acks, {len(self._sends)} sends>")

    @property
    def status(self) -> str:
        return self._status

    async def ack(self, delivery: Delivery) -> None:
        await _checkpoint()
        token = delivery.token
        if self._status != "open" or not isinstance(token, _Token) or token in self._acks:
            return
        if token.subscription._connection is not self._connection:
            self._foreign = True
            return
        self._acks[token] = None
        token.subscription._hold(token)
        self._connection._state._notify()

    async def send(self, destination: Destination, message: OutgoingMessage) -> None:
        await _checkpoint()
        if self._status != "open":
            return
        self._sends.append(
            (Destination.parse(destination), bytes(message.body), freeze_headers(message.headers))
        )

    async def commit(self) -> None:
        await _checkpoint()
        state = self._connection._state
        if self._status != "open":
            raise TransactionRolledBack(_finished_reason(self._status, state.name))
        failure = state._take_failure()
        if failure is not None and not failure[1]:
            self._finish("rolled back")
            raise TransactionRolledBack(
                f"commit on memory broker {state.name!r} failed (injected): nothing was applied"
            ) from failure[0]("injected by BrokerState.fail_sends")
        broken = self._broken_ack()
        if broken is not None:
            self._finish("rolled back")
            raise TransactionRolledBack(
                f"commit on memory broker {state.name!r} rolled back: delivery {broken} is not "
                f"unsettled on this connection (settled already, its subscription closed, or "
                f"delivered on another connection)"
            )
        for token in self._acks:
            token.subscription._settle(token)
        for destination, body, headers in self._sends:
            state._publish(destination, body, headers)
        self._finish("committed")
        state._notify()
        if failure is not None:
            raise TransactionRolledBack(
                f"commit on memory broker {state.name!r}: outcome reported unknown (injected), "
                f"although it was applied"
            ) from failure[0]("injected by BrokerState.fail_sends")

    async def abort(self) -> None:
        if self._status == "open":
            self._finish("aborted")
            self._connection._state._notify()
        await _shielded_checkpoint()

    def _broken_ack(self) -> str | None:
        if self._foreign:
            return "of another connection"
        for token in self._acks:
            if token not in token.subscription._unsettled:
                return token.message.broker_message_id
        return None

    def _finish(self, status: str) -> None:
        self._status = status
        acks = self._acks
        self._acks = {}
        self._sends = []
        for token in acks:
            token.subscription._unhold(token)
        self._connection._transactions.pop(self, None)


def _finished_reason(status: str, broker: str) -> str:
    reasons = {
        "stale": f"the connection to memory broker {broker!r} was lost: nothing was committed",
        "closed": f"the connection to memory broker {broker!r} was closed: nothing was committed",
        "aborted": "the transaction was aborted: nothing was committed",
        "rolled back": "the transaction was already rolled back: nothing was committed",
        "committed": "the transaction was already committed",
    }
    return reasons[status]


class MemoryConnection(Connection):
    def __init__(self, state: BrokerState) -> None:
        self._state = state
        self._open = True
        self._lost = False
        self._subscriptions: dict[MemorySubscription, None] = {}
        self._transactions: dict[MemoryTransaction, None] = {}

    def __repr__(self) -> str:
        status = "open" if self._open else "lost" if self._lost else "closed"
        return f"<MemoryConnection to {self._state.name!r} {status}>"

    @property
    def state(self) -> BrokerState:
        return self._state

    @property
    def is_open(self) -> bool:
        return self._open

    async def subscribe(self, request: SubscriptionRequest) -> MemorySubscription:
        await _checkpoint()
        self._check_open()
        destination = request.destination
        if request.prefetch < 1:
            raise SubscriptionFailed(
                f"subscription to {destination}: prefetch must be at least 1, "
                f"got {request.prefetch}"
            )
        selector: Matcher | None = None
        if request.selector is not None and request.selector.strip():
            try:
                selector = compile_selector(request.selector)
            except SelectorError as exc:
                raise SubscriptionFailed(
                    f"subscription to {destination}: selector {request.selector!r} "
                    f"is not valid: {exc}"
                ) from None
        state = self._state
        if destination.kind is Kind.QUEUE:
            queue = state._queue(destination.name)
        else:
            name = request.name
            if name is None:
                if request.durable:
                    raise SubscriptionFailed(
                        f"subscription to {destination}: a durable subscription needs a name"
                    )
                name = f"anonymous-{next(_anonymous)}"
            elif not _SEGMENT.match(name):
                raise SubscriptionFailed(
                    f"subscription {name!r} to {destination}: the name may contain only "
                    f"letters, digits, '_' and '-' (it becomes one segment of the queue "
                    f"{subscription_queue_name(destination.name, '<name>')})"
                )
            queue = state._queue(subscription_queue_name(destination.name, name),
                                 durable=request.durable)
        subscription = MemorySubscription(self, queue, request, selector)
        self._subscriptions[subscription] = None
        queue.attach(subscription)
        state._notify()
        return subscription

    async def delete_subscription(self, topic: Destination, name: str) -> None:
        await _checkpoint()
        self._check_open()
        queue = Destination(Kind.QUEUE, subscription_queue_name(topic.name, name))
        if self._state.stats(queue) is not None and not self._state.delete_queue(queue):
            raise SubscriptionFailed(
                f"subscription {name!r} of {topic}: not deleted while subscribers are attached; "
                "stop them first"
            )

    async def begin(self) -> MemoryTransaction:
        await _checkpoint()
        self._check_open()
        transaction = MemoryTransaction(self)
        self._transactions[transaction] = None
        return transaction

    async def ack(self, delivery: Delivery) -> None:
        await _checkpoint()
        self._check_open()
        token = delivery.token
        if (isinstance(token, _Token) and token.subscription._connection is self
                and token.subscription._settle(token)):
            self._state._notify()

    async def send(self, destination: Destination, message: OutgoingMessage) -> None:
        await _checkpoint()
        self._check_open()
        state = self._state
        destination = Destination.parse(destination)
        failure = state._take_failure()
        if failure is not None:
            error_type, stored = failure
            if stored:
                state._publish(destination, bytes(message.body), freeze_headers(message.headers))
                state._notify()
            raise error_type(
                f"send to {destination} on memory broker {state.name!r} failed (injected); "
                f"the message was {'stored' if stored else 'not stored'}"
            )
        state._publish(destination, bytes(message.body), freeze_headers(message.headers))
        state._notify()

    async def close(self) -> None:
        if self._open:
            self._shut(lost=False)
        await _shielded_checkpoint()

    def _lose(self) -> None:
        """The connection dropped (``BrokerState.drop_connections``)."""
        if self._open:
            self._shut(lost=True)

    def _shut(self, *, lost: bool) -> None:
        self._open = False
        self._lost = lost
        for transaction in list(self._transactions):
            transaction._finish("stale" if lost else "closed")
        for subscription in list(self._subscriptions):
            subscription._end(lost=lost)
        self._state._connections.pop(self, None)
        self._state._notify()

    def _check_open(self) -> None:
        if not self._open:
            raise ConnectionLost(
                f"the connection to memory broker {self._state.name!r} was "
                + ("lost" if self._lost else "closed")
            )
