"""``ConfirmedTransaction``: the seam's transaction on a broker whose STOMP transactions are
neither atomic nor durable (``Dialect.atomic_transactions`` False: RabbitMQ), built on the one
durable promise such a broker makes, the receipt of a SEND made outside any transaction.

RabbitMQ's plugin only batches a transaction's frames and replays them at the COMMIT; its
receipt proves neither that the SENDs were taken nor that they were stored (measured: lost by a
kill -9 of the node right after the receipt, and the ACK kept while the SEND was lost, or the
other way round, docs/rabbitmq.md). A SEND's receipt outside a transaction is a publisher
confirm: given once the message is stored (on a quorum queue, once a majority of the nodes has
it).

So nothing is written before the commit. ``send`` holds the SEND (its frame made at once, so
that a message no frame can carry is refused then); ``ack`` claims the delivery. ``commit``
writes every held SEND, persistent and with a receipt, all of them before waiting for any
(one round trip for the lot, not one per send), and once every receipt came writes the ACKs,
each with a receipt. ``abort`` forgets it all: nothing was written.

What is given up is atomicity: a commit that fails after some SENDs were confirmed leaves them
sent and the deliveries unacked, so the broker redelivers them, flagged, and their processing
sends them again; a commit whose ACK was lost after its receipt (a node killed at once) does
the same. A repeat is never a loss, and the core makes it recognisable (a handler's send made
again carries the same ``mdb_id``, docs/concepts.md). A commit that fails once every SEND was
confirmed, in its ACKs, raises ``AcksUnconfirmed``: the core then acks the very delivery
that comes back instead of processing it again (``mdb.delivery.strikes``).
"""

from __future__ import annotations

import anyio

from mdb.broker import Delivery
from mdb.errors import AcksUnconfirmed, BrokerError, ConnectionLost, TransactionRolledBack
from mdb.message import OutgoingMessage, ReplyTo
from mdb_stomp.dialect import Dialect
from mdb_stomp.frames import Command, send_frame
from mdb_stomp.receipts import ReceiptErrors
from mdb_stomp.transaction import StompTransaction
from mdb_stomp.wire import Wire


class ConfirmedTransaction(StompTransaction):
    """Sends and acks held until ``commit``, which makes them as confirmed frames outside any
    STOMP transaction (module docstring). Made by ``StompConnection.begin``; no BEGIN."""

    def __init__(self, wire: Wire, dialect: Dialect, transaction_id: str) -> None:
        super().__init__(wire, dialect, transaction_id)
        self._sends: list[tuple[ReplyTo, bytes, dict[str, str]]] = []
        self._acks: list[str] = []

    async def ack(self, delivery: Delivery) -> None:
        """Claim ``delivery`` for the commit's ACK; raises as ``StompTransaction.ack``."""
        try:
            token = self._claim(delivery)
        except ConnectionLost as error:
            self._doomed = self._doomed or str(error)
            raise
        if token.subscription.unsettled.cumulative:
            self._last_acks[token.subscription.unsettled] = token.ack_id
        else:
            self._acks.append(token.ack_id)

    async def send(self, destination: ReplyTo, message: OutgoingMessage) -> None:
        """Hold a SEND for the commit. ``EncodeError``, holding nothing, for a header holding
        a NUL byte (or a delay on a send to anything but a queue, ``frames.send_frame``);
        ``TransactionRolledBack`` once the transaction is finished. A copy that expires before
        it could be delivered is not held (``Dialect.outlived``): the commit settles its
        delivery all the same, as the broker's expiry would have."""
        headers = send_frame(destination, message, self._dialect)
        self._check_usable()
        if headers is None:
            return
        self._sends.append((destination, message.body, headers))

    async def commit(self) -> None:
        """Write the held SENDs with receipts and wait for them all, then the ACKs with
        receipts, and wait for those. ``TransactionRolledBack`` if the transaction was doomed
        or already finished, or any of them was refused, unanswered in time or cut off by the
        connection's loss: then the sends confirmed before stay sent and the deliveries count
        as unsettled (the broker redelivers them, flagged); ``AcksUnconfirmed`` when it was
        an ACK, every SEND confirmed."""
        if self._finished:
            raise TransactionRolledBack(f"transaction {self.id} was already finished")
        self._finished = True
        sends, self._sends = self._sends, []
        acks = [*self._acks, *self._last_acks.values()]
        if self._doomed is not None:
            self._end_claims(settled=False)
            raise TransactionRolledBack(f"transaction {self.id} rolled back: {self._doomed}")
        sent = settled = False
        try:
            await self._confirmed(
                [("SEND", headers, body, f"send to {target}") for target, body, headers in sends])
            sent = True
            await self._confirmed(
                [("ACK", {"id": ack_id}, b"", f"ack of {ack_id}") for ack_id in acks])
            settled = True
        except BrokerError as error:
            if sent:
                raise AcksUnconfirmed(
                    f"transaction {self.id} not settled: {error}; every send was confirmed, "
                    "its deliveries come back flagged unless an ack was applied") from None
            raise TransactionRolledBack(
                f"transaction {self.id} not settled: {error}; what it sent before stays "
                "sent, its deliveries come back flagged") from None
        finally:
            self._end_claims(settled=settled)

    async def _confirmed(self, frames: list[tuple[Command, dict[str, str], bytes, str]]) -> None:
        """Write every frame with a receipt before waiting for any, then wait for them all;
        the first failure, once all are answered or failed."""
        failures: list[BrokerError] = []

        async def confirm(command: Command, headers: dict[str, str], body: bytes,
                          subject: str) -> None:
            try:
                await self._wire.request(command, headers, body, errors=ReceiptErrors(
                    subject, refused=BrokerError, unconfirmed=BrokerError, lost=BrokerError))
            except BrokerError as error:
                failures.append(error)

        if len(frames) == 1:  # the usual case, without a task's cost
            await confirm(*frames[0])
        else:
            async with anyio.create_task_group() as group:
                for frame in frames:
                    group.start_soon(confirm, *frame)
        if failures:
            raise failures[0]

    def _abort_quietly(self) -> None:
        """Nothing was written: nothing to abort."""
