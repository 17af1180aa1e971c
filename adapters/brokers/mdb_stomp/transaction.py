"""``StompTransaction``: the seam's transaction on one wire, with two ways to settle, one per
kind of broker (``Dialect.atomic_transactions``, the broker's
``Capabilities.atomic_transactions``):

* ``Atomic`` (ActiveMQ): a STOMP transaction. ACKs and SENDs carry its id and one COMMIT,
  confirmed by its receipt, settles them all. Each SEND waits for its receipt before the
  transaction writes anything more (``StompTransaction.send``); BEGIN and ACKs are written
  without one, held back to go out with the frame that follows them (``mdb_stomp.protocol.reading``,
  "Held frames").
* ``Confirmed`` (RabbitMQ, whose STOMP transactions are neither atomic nor durable): nothing is
  written before the commit, which makes the sends confirmed, then the acks
  (``mdb_stomp.dialects.confirmed``).

What both share is here, once: a delivery is claimed by one transaction at a time
(``mdb_stomp.subscriptions.unsettled``); a failure on the way dooms the transaction (its commit
raises ``TransactionRolledBack``); a transaction ends once, committed or aborted, and only a
confirmed commit counts its acks as settled.

Cumulative acks. On a subscription whose ACK settles the earlier deliveries too (``ack:client``,
``mdb_stomp.subscriptions.unsettled``), a transaction may only ack a delivery once every earlier
unsettled one is acked in it as well; so only the last of them needs a frame, written by the commit:
a batch of 100 costs one ACK frame, not 100.
"""

from __future__ import annotations

import contextlib
from typing import Protocol

from mdb.errors import ConnectionLost, TransactionRolledBack
from mdb.messages.message import OutgoingMessage, ReplyTo
from mdb.seam.broker import Delivery, Transaction
from mdb_stomp.dialects.confirmed import Confirmed
from mdb_stomp.dialects.dialect import Dialect
from mdb_stomp.protocol.frames import send_frame
from mdb_stomp.protocol.receipts import ReceiptErrors
from mdb_stomp.protocol.wire import Wire
from mdb_stomp.subscriptions.subscription import ack_token
from mdb_stomp.subscriptions.unsettled import Unsettled


class Settlement(Protocol):
    """How a ``StompTransaction`` reaches its broker: what it writes for an ack, a send, the
    commit and an abort. Made with the transaction."""

    def ack(self, ack_id: str) -> None:
        """The ack of ``ack_id`` (not of a cumulative subscription: those go to ``commit``).
        Raises ``ConnectionLost`` when it cannot be written."""

    async def send(self, target: ReplyTo, body: bytes, headers: dict[str, str]) -> None:
        """A SEND with ``headers`` to ``target``. Raises ``ConnectionLost`` or
        ``TransactionRolledBack`` (the transaction is then doomed)."""

    async def commit(self, acks: list[str]) -> None:
        """Settle what was acked and sent, with ``acks`` (the last ack of each cumulative
        subscription) besides; return once the broker confirmed. Raises
        ``TransactionRolledBack``."""

    def abort(self) -> None:
        """Discard what was sent. Never raises."""


class StompTransaction(Transaction):
    """A transaction on ``wire`` settled the way ``dialect``'s broker allows (module
    docstring). Made by ``StompConnection.begin``; ``ConnectionLost`` when the wire is down."""

    def __init__(self, wire: Wire, dialect: Dialect, transaction_id: str) -> None:
        self._wire = wire
        self._dialect = dialect
        self.id = transaction_id
        self._way: Settlement = (Atomic(wire, transaction_id) if dialect.atomic_transactions
                                 else Confirmed(wire, transaction_id))
        self._finished = False
        self._doomed: str | None = None
        self._claimed: set[Unsettled] = set()
        # The latest ack of each cumulative subscription, written by the commit.
        self._last_acks: dict[Unsettled, str] = {}

    async def ack(self, delivery: Delivery) -> None:
        """Ack ``delivery`` in this transaction (on a cumulative subscription, by the commit:
        module docstring). A stale delivery raises ``ConnectionLost`` and dooms the
        transaction. ``BrokerError``, writing nothing, when the delivery is already settled or
        held by another transaction, or an earlier delivery of its subscription is neither
        settled nor acked in this transaction (see ``mdb_stomp.subscriptions.unsettled``)."""
        try:
            token = ack_token(delivery, self._wire)
            self._check_usable()
            unsettled = token.subscription.unsettled
            unsettled.claim(token.ack_id, self)
            self._claimed.add(unsettled)
            if unsettled.cumulative:
                self._last_acks[unsettled] = token.ack_id
            else:
                self._way.ack(token.ack_id)
        except ConnectionLost as error:
            self._doomed = self._doomed or str(error)
            raise

    async def send(self, destination: ReplyTo, message: OutgoingMessage) -> None:
        """Send ``message`` in this transaction. ``EncodeError``, sending nothing, for a header
        holding a NUL byte (or a delay on a send to anything but a queue,
        ``frames.send_frame``); ``TransactionRolledBack`` once the transaction is finished.
        Any other failure dooms the transaction: ``ConnectionLost`` when the connection is or
        went down, ``TransactionRolledBack`` when the broker refused the SEND (too many or too
        long headers on ActiveMQ, ...) or did not answer in time.

        A copy that expires before it could be delivered, where the broker would drop it
        then, is not sent (``Dialect.outlived``): the commit settles its delivery all the
        same, as the broker's expiry would have."""
        headers = send_frame(destination, message, self._dialect)
        self._check_usable()
        if headers is None:
            return
        try:
            await self._way.send(destination, message.body, headers)
        except (ConnectionLost, TransactionRolledBack) as error:
            self._doomed = self._doomed or str(error)
            raise

    async def commit(self) -> None:
        """Settle, the way of this broker (module docstring); ``TransactionRolledBack`` if the
        broker refused it, did not confirm it in time, the connection is or went down, or the
        transaction was doomed or already finished. Only a confirmed commit counts its acks as
        settled: at worst a later ack is then refused (the caller closes the subscription),
        never a delivery lost."""
        if self._finished:
            raise TransactionRolledBack(f"transaction {self.id} was already finished")
        self._finished = True
        settled = False
        try:
            if self._doomed is not None:
                self._way.abort()
                raise TransactionRolledBack(f"transaction {self.id} rolled back: {self._doomed}")
            await self._way.commit(list(self._last_acks.values()))
            settled = True
        finally:
            for unsettled in self._claimed:
                unsettled.end_claims(self, settled)
            self._claimed.clear()

    async def abort(self) -> None:
        """Discard the sends; acked deliveries stay unsettled (ActiveMQ redelivers them only
        after the subscription or connection closes). Never raises."""
        if self._finished:
            return
        self._finished = True
        self._way.abort()
        for unsettled in self._claimed:
            unsettled.end_claims(self, settled=False)
        self._claimed.clear()

    def _check_usable(self) -> None:
        if self._finished:
            raise TransactionRolledBack(f"transaction {self.id} was already finished")


class Atomic:
    """A STOMP transaction, for a broker whose transactions are atomic and durable and which
    runs each frame of one as it reads it (ActiveMQ). Writes the BEGIN, held."""

    def __init__(self, wire: Wire, transaction_id: str) -> None:
        self._wire = wire
        self._id = transaction_id
        wire.write("BEGIN", {"transaction": transaction_id}, held=True)

    def ack(self, ack_id: str) -> None:
        # Held: the commit or abort ends the transaction with a frame.
        self._wire.write("ACK", {"id": ack_id, "transaction": self._id}, held=True)

    async def send(self, target: ReplyTo, body: bytes, headers: dict[str, str]) -> None:
        """The SEND waits for its receipt before the transaction writes anything more: after
        refusing a SEND, ActiveMQ goes on reading the frames written behind it before it
        closes the connection, so a pipelined ACK and COMMIT could settle the delivery
        without the refused send (measured: 1 run in 5 lost the message, docs/security.md)."""
        headers["transaction"] = self._id
        await self._wire.request("SEND", headers, body, errors=ReceiptErrors(
            f"transacted send to {target}", refused=TransactionRolledBack,
            unconfirmed=TransactionRolledBack, consequence="its transaction is rolled back"))

    async def commit(self, acks: list[str]) -> None:
        try:
            for ack_id in acks:
                self.ack(ack_id)
            await self._wire.request("COMMIT", {"transaction": self._id}, errors=ReceiptErrors(
                f"transaction {self._id}", refused=TransactionRolledBack,
                unconfirmed=TransactionRolledBack, lost=TransactionRolledBack,
                consequence="none of it may be relied upon"))
        except ConnectionLost as lost:
            raise TransactionRolledBack(f"transaction {self._id} not committed: {lost}") from None

    def abort(self) -> None:
        if self._wire.is_open:
            with contextlib.suppress(ConnectionLost):
                self._wire.write("ABORT", {"transaction": self._id})
