"""``Confirmed``: how a ``StompTransaction`` settles on a broker whose STOMP transactions are
neither atomic nor durable (``Dialect.atomic_transactions`` False: RabbitMQ), with the one
durable promise such a broker makes, the receipt of a SEND made outside any transaction.

RabbitMQ's plugin only batches a transaction's frames and replays them at the COMMIT; its
receipt proves neither that the SENDs were taken nor that they were stored (measured: lost by a
kill -9 of the node right after the receipt, and the ACK kept while the SEND was lost, or the
other way round, docs/rabbitmq.md). A SEND's receipt outside a transaction is a publisher
confirm: given once the message is stored (on a quorum queue, once a majority of the nodes has
it).

So nothing is written before the commit. A send is held (its frame made at once, so that a
message no frame can carry is refused then), an ack too. The commit writes every held SEND,
persistent and with a receipt, all of them before waiting for any (one round trip for the lot,
not one per send), and once every receipt came writes the ACKs, each with a receipt. An abort
forgets it all: nothing was written.

What is given up is atomicity, and this is where a lost ack comes from. A commit that fails
after some SENDs were confirmed leaves them sent and the deliveries unacked: the broker
redelivers them, flagged, and their processing sends again; a commit whose ACK was lost after
its receipt (a node killed at once) does the same. A repeat is never a loss, and the core makes
it recognisable (a handler's send made again carries the same ``mdb_id``, docs/concepts.md). A
commit that fails in its ACKs, once every SEND was confirmed, raises ``AcksUnconfirmed``
(``Transaction.commit``): its sends need not be made again, and the container acks the very
delivery that comes back instead of processing it again (docs/architecture.md, "Delivery
contract").
"""

from __future__ import annotations

import anyio

from mdb.errors import AcksUnconfirmed, BrokerError, TransactionRolledBack
from mdb.messages.message import ReplyTo
from mdb_stomp.protocol.frames import Command
from mdb_stomp.protocol.receipts import ReceiptErrors
from mdb_stomp.protocol.wire import Wire


class Confirmed:
    """Sends and acks held until ``commit``, which makes them as confirmed frames outside any
    STOMP transaction (module docstring); a ``mdb_stomp.transaction.Settlement``. Writes
    nothing; ``ConnectionLost`` when the wire is down."""

    def __init__(self, wire: Wire, transaction_id: str) -> None:
        wire.check_alive()
        self._wire = wire
        self._id = transaction_id
        self._sends: list[tuple[ReplyTo, bytes, dict[str, str]]] = []
        self._acks: list[str] = []

    def ack(self, ack_id: str) -> None:
        self._acks.append(ack_id)

    async def send(self, target: ReplyTo, body: bytes, headers: dict[str, str]) -> None:
        self._sends.append((target, body, headers))

    async def commit(self, acks: list[str]) -> None:
        """The held SENDs with receipts, then the ACKs with receipts. ``TransactionRolledBack``
        when any of them was refused, unanswered in time or cut off by the connection's loss:
        then the sends confirmed before stay sent and the deliveries count as unsettled;
        ``AcksUnconfirmed`` when it was an ACK, every SEND confirmed."""
        sent = False
        try:
            await self._confirmed(
                [("SEND", headers, body, f"send to {target}") for target, body, headers in
                 self._sends])
            sent = True
            await self._confirmed(
                [("ACK", {"id": ack_id}, b"", f"ack of {ack_id}") for ack_id in
                 [*self._acks, *acks]])
        except BrokerError as error:
            if sent:
                raise AcksUnconfirmed(
                    f"transaction {self._id} not settled: {error}; every send was confirmed, "
                    "its deliveries come back flagged unless an ack was applied") from None
            raise TransactionRolledBack(
                f"transaction {self._id} not settled: {error}; what it sent before stays "
                "sent, its deliveries come back flagged") from None

    def abort(self) -> None:
        """Nothing was written: nothing to abort."""

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
