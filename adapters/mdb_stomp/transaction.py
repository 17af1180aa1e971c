"""``StompTransaction``: ACKs and SENDs that carry a transaction id, settled by one COMMIT,
for a broker whose STOMP transactions are atomic and durable (``Dialect.atomic_transactions``:
ActiveMQ; RabbitMQ's are not, see ``mdb_stomp.confirmed``).

Each SEND waits for its receipt before the transaction writes anything more (see
``StompTransaction.send``); ACKs and BEGIN are written without one, held back to go out with
the frame that follows them (``mdb_stomp.reading``, "Held frames").

Cumulative acks. On a subscription whose ACK settles the earlier deliveries too (``ack:client``,
``mdb_stomp.unsettled``), a transaction may only ack a delivery once every earlier unsettled one
is acked in it as well; so only the last of them needs a frame, written just before the COMMIT:
a batch of 100 costs one ACK frame, not 100."""

from __future__ import annotations

import contextlib

from mdb.broker import Delivery, Transaction
from mdb.errors import ConnectionLost, TransactionRolledBack
from mdb.message import OutgoingMessage, ReplyTo
from mdb_stomp.dialect import Dialect
from mdb_stomp.frames import send_frame
from mdb_stomp.receipts import ReceiptErrors
from mdb_stomp.subscription import AckToken, ack_token
from mdb_stomp.unsettled import Unsettled
from mdb_stomp.wire import Wire


class StompTransaction(Transaction):
    """A STOMP transaction: ACKs and SENDs carry its id; COMMIT waits for a receipt. Made by
    ``StompConnection.begin``, which writes the BEGIN."""

    def __init__(self, wire: Wire, dialect: Dialect, transaction_id: str) -> None:
        self._wire = wire
        self._dialect = dialect
        self.id = transaction_id
        self._finished = False
        self._doomed: str | None = None
        self._claimed: set[Unsettled] = set()
        # The latest ack of each cumulative subscription, written by the commit.
        self._last_acks: dict[Unsettled, str] = {}

    async def ack(self, delivery: Delivery) -> None:
        """Transacted ACK (on a cumulative subscription, written by the commit: module
        docstring). A stale delivery raises ``ConnectionLost`` and dooms the
        transaction: its commit raises ``TransactionRolledBack``. ``BrokerError``, writing
        nothing, when the delivery is already settled or held by another transaction, or an
        earlier delivery of its subscription is neither settled nor acked in this transaction
        (see ``mdb_stomp.unsettled``)."""
        try:
            token = self._claim(delivery)
            unsettled = token.subscription.unsettled
            if unsettled.cumulative:
                self._last_acks[unsettled] = token.ack_id
            else:  # held: the commit or abort ends the transaction with a frame
                self._wire.write("ACK", {"id": token.ack_id, "transaction": self.id}, held=True)
        except ConnectionLost as error:
            self._doomed = self._doomed or str(error)
            raise

    def _claim(self, delivery: Delivery) -> AckToken:
        """The delivery's token, claimed by this transaction (``mdb_stomp.unsettled``); raises
        as ``ack`` says, writing nothing."""
        token = ack_token(delivery, self._wire)
        self._check_usable()
        token.subscription.unsettled.claim(token.ack_id, self)
        self._claimed.add(token.subscription.unsettled)
        return token

    async def send(self, destination: ReplyTo, message: OutgoingMessage) -> None:
        """Transacted SEND. ``EncodeError``, writing nothing, for a header holding a NUL byte
        (or a delay on a send to anything but a queue, ``frames.send_frame``).
        Otherwise any failure dooms the transaction (its commit raises
        ``TransactionRolledBack``): ``ConnectionLost`` when the connection is or went down,
        ``TransactionRolledBack`` when the broker refused the SEND (too many or too long
        headers on ActiveMQ, ...) or did not answer in time.

        The SEND waits for its receipt before the transaction writes anything more: after
        refusing a SEND, ActiveMQ goes on reading the frames written behind it before it
        closes the connection, so a pipelined ACK and COMMIT could settle the delivery
        without the refused send (measured: 1 run in 5 lost the message, docs/security.md).

        A copy that expires before it could be delivered, where the broker would drop it
        then, is not sent (``Dialect.outlived``): the commit settles its delivery all the
        same, as the broker's expiry would have."""
        headers = send_frame(destination, message, self._dialect)
        if headers is None:
            return
        headers["transaction"] = self.id
        try:
            self._check_usable()
            await self._wire.request(
                "SEND", headers, message.body,
                errors=ReceiptErrors(
                    f"transacted send to {destination}",
                    refused=TransactionRolledBack,
                    unconfirmed=TransactionRolledBack,
                    consequence="its transaction is rolled back",
                ),
            )
        except (ConnectionLost, TransactionRolledBack) as error:
            self._doomed = self._doomed or str(error)
            raise

    async def commit(self) -> None:
        """COMMIT and wait for its receipt; ``TransactionRolledBack`` if the broker refused
        it, no receipt came in time, the connection is or went down, or the transaction was
        doomed or already finished. Only a confirmed commit counts its acks as settled."""
        wire = self._wire
        if self._finished:
            raise TransactionRolledBack(f"transaction {self.id} was already finished")
        self._finished = True
        if self._doomed is not None:
            self._abort_quietly()
            self._end_claims(settled=False)
            raise TransactionRolledBack(f"transaction {self.id} rolled back: {self._doomed}")
        committed = False
        try:
            for ack_id in self._last_acks.values():
                wire.write("ACK", {"id": ack_id, "transaction": self.id}, held=True)
            await wire.request(
                "COMMIT",
                {"transaction": self.id},
                errors=ReceiptErrors(
                    f"transaction {self.id}",
                    refused=TransactionRolledBack,
                    unconfirmed=TransactionRolledBack,
                    lost=TransactionRolledBack,
                    consequence="none of it may be relied upon",
                ),
            )
            committed = True
        except ConnectionLost as lost:
            raise TransactionRolledBack(f"transaction {self.id} not committed: {lost}") from None
        finally:
            # Without a confirmed commit the acks count as not done: at worst a later ack is
            # refused (the caller then closes the subscription), never a delivery lost.
            self._end_claims(settled=committed)

    async def abort(self) -> None:
        """ABORT without a receipt; the sends are discarded, acked deliveries stay unsettled
        (ActiveMQ redelivers them only after the subscription or connection closes). Never
        raises."""
        if self._finished:
            return
        self._finished = True
        self._abort_quietly()
        self._end_claims(settled=False)

    def _end_claims(self, settled: bool) -> None:
        for unsettled in self._claimed:
            unsettled.end_claims(self, settled)
        self._claimed.clear()

    def _check_usable(self) -> None:
        if self._finished:
            raise TransactionRolledBack(f"transaction {self.id} was already finished")

    def _abort_quietly(self) -> None:
        if self._wire.is_open:
            with contextlib.suppress(ConnectionLost):
                self._wire.write("ABORT", {"transaction": self.id})
