"""``MemoryConnection``, the seam's connection of the memory broker; with its subscriptions
(``mdb_memory.subscription``) and transactions (``mdb_memory.transaction``) it shares one
``Session`` (``mdb_memory.session``), and through it the broker's ``Exchange``.

Behaviour follows ActiveMQ Classic where the seam leaves room:

* Prefetch counts a subscription's unsettled deliveries, except those acked in a transaction
  that is still open: like ActiveMQ, a transacted ack widens the prefetch window by one until
  the transaction ends. A commit settles the delivery; an abort (or a failed commit) leaves it
  unsettled with the subscriber, holding prefetch room again, and it is not redelivered on the
  live subscription — it can be acked again, and it goes back to its queue, flagged
  redelivered, when the subscription or the connection closes.
* A commit is atomic: if one of its acked deliveries is no longer unsettled on this connection
  (its subscription closed, it was settled elsewhere, it came from another connection) the
  whole commit is rolled back and raises ``TransactionRolledBack``. (A test may make a commit
  apply its sends and not its acks, as RabbitMQ's may: ``BrokerState.lose_acks``.)
* On a closed or lost connection ``subscribe``, ``begin``, ``ack`` and ``send`` raise
  ``ConnectionLost``; ``Transaction.ack`` and ``send`` on a finished or stale transaction do
  nothing (its ``commit`` raises ``TransactionRolledBack``); ``receive`` on a closed
  subscription raises ``ConnectionLost`` too, since no delivery will ever come.
* A message sent with a delay (``OutgoingMessage.delay``) is held by the broker until it is
  due, then joins the back of its queue; a transacted one from the commit on.
* Every operation except the ``close``/``abort`` family and ``receive_nowait`` is a cancellation
  point before it acts: cancelled means not done. ``close`` and ``abort`` act first and cannot be
  cancelled; ``receive_nowait`` is not a coroutine.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import AsyncGenerator

import anyio.lowlevel

from mdb.errors import BrokerError, SubscriptionFailed
from mdb.messages.destinations import Destination, Kind
from mdb.messages.message import OutgoingMessage, ReplyTo
from mdb.messages.selector import Matcher, SelectorError, compile_selector
from mdb.seam.broker import Capabilities, Connection, Delivery, SubscriptionRequest
from mdb_memory.exchange import subscription_queue_name
from mdb_memory.queue import MemoryQueue, StoredMessage, frozen, target_of
from mdb_memory.session import Session
from mdb_memory.state import BrokerState
from mdb_memory.subscription import MemorySubscription, Token
from mdb_memory.temporary import MemoryTemporaryQueue, new_name
from mdb_memory.transaction import MemoryTransaction

# A subscription name becomes one segment of ``Consumer.<name>.VirtualTopic.<topic>``.
_SEGMENT = re.compile(r"^[A-Za-z0-9_\-]+$")
_anonymous = itertools.count(1)
_checkpoint = anyio.lowlevel.checkpoint
_shielded_checkpoint = anyio.lowlevel.cancel_shielded_checkpoint


class MemoryConnection(Connection):
    """A connection to a memory broker that can do what ``capabilities`` says; made by
    ``MemoryBroker.connect``."""

    def __init__(self, state: BrokerState, capabilities: Capabilities) -> None:
        self._state = state
        self._capabilities = capabilities
        self._session = Session(state.exchange)

    def __repr__(self) -> str:
        return f"<MemoryConnection to {self._state.name!r} {self._session.status}>"

    @property
    def state(self) -> BrokerState:
        return self._state

    @property
    def session(self) -> Session:
        """What this connection shares with its subscriptions and transactions (the
        exchange's ``Link``)."""
        return self._session

    @property
    def is_open(self) -> bool:
        return self._session.is_open

    async def subscribe(self, request: SubscriptionRequest) -> MemorySubscription:
        await _checkpoint()
        self._session.check_open()
        await self._held_back()
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
        exchange = self._session.exchange
        if destination.kind is Kind.QUEUE:
            queue = exchange.queue(destination.name)
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
            queue = exchange.queue(subscription_queue_name(destination.name, name),
                                   durable=request.durable)
        subscription = MemorySubscription(self._session, queue, request, selector)
        self._session.add_subscription(subscription)
        queue.attach(subscription)
        exchange.notify()
        return subscription

    async def _held_back(self) -> None:
        """Wait while the broker holds subscribes back, as for an answer not come yet
        (``BrokerState.hold_subscriptions``); a connection lost meanwhile subscribes nothing."""
        exchange = self._session.exchange
        if not exchange.holding_subscriptions:
            return
        exchange.subscriptions_held += 1
        exchange.notify()
        try:
            while exchange.holding_subscriptions:
                await exchange.wait_for_change()
        finally:
            exchange.subscriptions_held -= 1
        self._session.check_open()

    async def delete_subscription(self, topic: Destination, name: str) -> None:
        await _checkpoint()
        self._session.check_open()
        queue = Destination(Kind.QUEUE, subscription_queue_name(topic.name, name))
        if self._state.stats(queue) is not None and not self._state.delete_queue(queue):
            raise SubscriptionFailed(
                f"subscription {name!r} of {topic}: not deleted while subscribers are attached; "
                "stop them first"
            )

    async def temporary_queue(self) -> MemoryTemporaryQueue:
        name = new_name()
        subscription = await self.subscribe(SubscriptionRequest(
            Destination(Kind.QUEUE, name), None, durable=False, selector=None, prefetch=100))
        return MemoryTemporaryQueue(self, subscription, name, self._session.exchange)

    async def begin(self) -> MemoryTransaction:
        await _checkpoint()
        self._session.check_open()
        transaction = MemoryTransaction(self._session)
        self._session.add_transaction(transaction)
        return transaction

    async def ack(self, delivery: Delivery) -> None:
        await _checkpoint()
        self._session.check_open()
        token = delivery.token
        if (isinstance(token, Token) and token.subscription.session is self._session
                and token.subscription.settle(token)):
            self._session.exchange.notify()

    async def dead_letter(self, delivery: Delivery) -> None:
        """Settle ``delivery`` and keep its message, as it is, on ``queue:DLQ`` (whatever
        the message: ``MemoryBroker.capabilities``)."""
        await _checkpoint()
        self._session.check_open()
        token = delivery.token
        if not isinstance(token, Token) or token.subscription.session is not self._session \
                or not token.subscription.settle(token):
            raise BrokerError(f"memory broker {self._state.name!r}: delivery "
                              f"{delivery.message_id} is not unsettled on this connection")
        self._session.exchange.dead_letter(token.message)
        self._session.exchange.notify()

    async def send(self, destination: ReplyTo, message: OutgoingMessage) -> None:
        await _checkpoint()
        self._session.check_open()
        exchange = self._session.exchange
        target = target_of(destination)
        exchange.check_allowed(target)
        failure = exchange.take_failure()
        if failure is not None:
            error_type, stored = failure
            if stored:
                exchange.publish(target, frozen(message))
                exchange.notify()
            raise error_type(
                f"send to {target} on memory broker {exchange.name!r} failed (injected); "
                f"the message was {'stored' if stored else 'not stored'}"
            )
        exchange.publish(target, frozen(message))
        exchange.notify()

    async def browse(self, queue: Destination) -> AsyncGenerator[Delivery, None]:
        """The ready messages of ``queue`` as they were when browsing began (those in flight
        with a subscriber not among them), changing nothing (``BrokerState.browse``)."""
        await _checkpoint()
        self._session.check_open()
        for delivery in self._state.browse(queue):
            yield delivery
            await _checkpoint()
            self._session.check_open()

    async def take(self, queue: Destination) -> AsyncGenerator[Delivery, None]:
        """Through a subscription of prefetch 1, up to the message last in ``queue`` when
        taking began, or until that one is neither there nor with this take (another
        consumer took it)."""
        await _checkpoint()
        self._session.check_open()
        stored = self._session.exchange.queue(queue.name)
        if not stored.messages:
            return
        last = stored.messages[-1][0]
        subscription = await self.subscribe(SubscriptionRequest(
            queue, None, durable=True, selector=None, prefetch=1))
        try:
            while (delivery := await self._next(subscription, stored, last)) is not None:
                yield delivery
                if isinstance(delivery.token, Token) and delivery.token.message is last:
                    return
        finally:
            await subscription.close()

    async def _next(self, subscription: MemorySubscription, queue: MemoryQueue,
                    last: StoredMessage) -> Delivery | None:
        """The take's next delivery; None once ``last`` left ``queue`` for someone else."""
        while (delivery := subscription.receive_nowait()) is None:
            if all(message is not last for message, _ in queue.messages):
                return None
            await self._session.exchange.wait_for_change()
            self._session.check_open()
        return delivery

    async def lock(self, queue: Destination) -> None:
        """Held by the broker's exchange for this connection (``Exchange.lock``)."""
        await _checkpoint()
        self._session.check_open()
        self._session.exchange.lock(queue.name, self._session)

    async def capabilities(self) -> Capabilities:
        """``MemoryBroker.capabilities``: a connection learns nothing more."""
        await _checkpoint()
        return self._capabilities

    async def close(self) -> None:
        if self._session.is_open:
            self._session.shut(lost=False)
        await _shielded_checkpoint()
