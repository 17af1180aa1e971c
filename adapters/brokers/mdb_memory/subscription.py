"""``MemorySubscription``: one consumer of one memory queue, and the tokens of its deliveries.

Prefetch counts the subscription's unsettled deliveries, except those acked in a transaction
that is still open (see ``mdb_memory.connection``).
"""

from __future__ import annotations

from collections import deque

import anyio.lowlevel

from mdb.errors import ConnectionLost
from mdb.messages.destinations import Destination
from mdb.messages.selector import Matcher
from mdb.seam.broker import Delivery, Subscription, SubscriptionRequest
from mdb_memory.queue import MemoryQueue, StoredMessage
from mdb_memory.session import Session
from mdb_memory.signals import Signal


class Token:
    """``Delivery.token``: one push of one message to one subscription."""

    __slots__ = ("held", "message", "subscription")

    def __init__(self, subscription: MemorySubscription, message: StoredMessage) -> None:
        self.subscription = subscription
        self.message = message
        self.held = 0  # open transactions that acked it


class MemorySubscription(Subscription):
    def __init__(self, session: Session, queue: MemoryQueue,
                 request: SubscriptionRequest, selector: Matcher | None) -> None:
        self.session = session
        self._queue = queue
        self._request = request
        self._prefetch = request.prefetch
        self._selector = selector
        self._unsettled: dict[Token, None] = {}  # in push order
        self._held = 0  # unsettled deliveries acked in an open transaction
        self._buffer: deque[Delivery] = deque()  # pushed, not yet received
        self._arrived = Signal()
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
        await anyio.lowlevel.checkpoint()
        while True:
            if self._buffer:
                return self._buffer.popleft()
            if self._ended is not None:
                raise ConnectionLost(
                    f"subscription to {self._request.destination} on memory broker "
                    f"{self.session.exchange.name!r}: "
                    + ("the connection was lost" if self._ended == "lost" else "it was closed")
                )
            await self.session.exchange.wait(self._arrived)

    def receive_nowait(self) -> Delivery | None:
        """A delivery already pushed to this subscription, or None. Not a cancellation point."""
        return self._buffer.popleft() if self._buffer else None

    async def close(self) -> None:
        if self._ended is None:
            self.end(lost=False)
            self.session.exchange.notify()
        await anyio.lowlevel.cancel_shielded_checkpoint()

    # --- the queue's consumer ------------------------------------------------------------------

    @property
    def selective(self) -> bool:
        return self._selector is not None

    def has_room(self) -> bool:
        return len(self._unsettled) - self._held < self._prefetch

    def matches(self, message: StoredMessage) -> bool:
        selector = self._selector
        return selector is None or selector(message.headers)

    def push(self, message: StoredMessage, redelivered: bool) -> None:
        token = Token(self, message)
        self._unsettled[token] = None
        self._buffer.append(Delivery(message.destination, message.body, message.headers,
                                     message.broker_message_id, redelivered, token,
                                     reply_to=message.reply_to,
                                     correlation_id=message.correlation_id))
        self._arrived.notify()

    # --- used by the connection and transactions -----------------------------------------------

    def is_unsettled(self, token: Token) -> bool:
        """True while ``token``'s delivery is unsettled here."""
        return token in self._unsettled

    def settle(self, token: Token) -> bool:
        """Settle ``token``'s delivery; False when it was not unsettled here."""
        if token not in self._unsettled:
            return False
        del self._unsettled[token]
        if token.held:
            self._held -= 1
        self._queue.settled()
        self._queue.offer(self)
        return True

    def hold(self, token: Token) -> None:
        """Acked in an open transaction: the delivery stops counting against prefetch."""
        token.held += 1
        if token.held == 1 and token in self._unsettled:
            self._held += 1
            self._queue.offer(self)

    def unhold(self, token: Token) -> None:
        """The transaction ended without settling it: it counts against prefetch again."""
        token.held -= 1
        if token.held == 0 and token in self._unsettled:
            self._held -= 1
            self._queue.withdraw(self)

    def end(self, *, lost: bool) -> None:
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
        self.session.exchange.release(queue)
        self.session.remove_subscription(self)
        self._arrived.notify()
