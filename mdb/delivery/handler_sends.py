"""A handler's sends, and acks that commit together with them."""

from __future__ import annotations

from collections.abc import Sequence

import anyio

from mdb.errors import BrokerError
from mdb.messages.destinations import Destination
from mdb.messages.message import OutgoingMessage, ReplyAddress, ReplyTo
from mdb.observability import telemetry
from mdb.observability.telemetry import Stats
from mdb.routing.producer import Producer
from mdb.seam.broker import Connection, Delivery, Transaction


class TransactedSends:
    """The sends of a transacted handler's run (one delivery or a batch), and its settlement.

    Those to a member on the delivery's broker go into a transaction begun by the first of
    them; a handler that sends nothing is settled by a plain ack (a transaction holding one ack
    is no more atomic, and it costs the broker two more commands and a commit). A member on
    another broker cannot join that transaction: those sends are held and made by ``flushed``,
    once the handler returned and before the commit, so a failed handler sends nothing and a
    committed ack always follows its sends (a commit that then fails means a redelivery, and
    those sends may be made twice).
    """

    def __init__(self, connection: Connection, broker: str, system: str,
                 producer: Producer) -> None:
        self._connection = connection
        self._broker = broker
        self._system = system
        self._producer = producer
        self._begun: Transaction | None = None
        self._held: list[tuple[Destination, OutgoingMessage, str | None]] = []

    async def send(self, target: ReplyTo, message: OutgoingMessage, key: str | None) -> None:
        """``Context.send`` and ``Context.reply`` of the handler (a
        ``mdb.listeners.context.SendFunction``); a reply address is on the delivery's broker."""
        if isinstance(target, ReplyAddress):
            await self._in_transaction(target, target, message)
            return
        member = self._producer.member_for(target, key=key, prefer=self._broker)
        if member.broker != self._broker:
            self._held.append((target, message, key))
            return
        await self._in_transaction(target, member.destination, message)

    async def _in_transaction(self, logical: ReplyTo, physical: ReplyTo,
                              message: OutgoingMessage) -> None:
        if self._begun is None:
            self._begun = await self._connection.begin()
        message = self._producer.brokers.seal.sealed(message)
        with telemetry.sending(self._system, logical, message) as traced:
            await self._begun.send(physical, traced)

    @property
    def begun(self) -> bool:
        """Whether a send began the transaction."""
        return self._begun is not None

    async def flushed(self) -> BrokerError | None:
        """Make the held sends of a handler that succeeded; return the error of one that was
        surely or maybe not sent (it fails the run, as if the handler had raised)."""
        held, self._held = self._held, []
        try:
            for destination, message, key in held:
                await self._producer.send_message(destination, message, key=key)
        except BrokerError as exc:
            return exc
        return None

    async def settle(self, deliveries: Sequence[Delivery], stats: Stats) -> None:
        """Ack ``deliveries`` in order: plainly if the handler sent nothing in the transaction,
        else in it, then commit. Each settled delivery counts in ``stats.processed``."""
        if self._begun is None:
            for delivery in deliveries:
                await self._connection.ack(delivery)
                stats.processed += 1
            return
        await commit(self._begun, deliveries)
        stats.processed += len(deliveries)

    async def abort(self) -> None:
        """Discard the sends: the held ones and the transaction's. Never raises."""
        self._held.clear()
        if self._begun is not None:
            await self._begun.abort()

    async def abort_shielded(self) -> None:
        """``abort`` even while being cancelled (the run is interrupted)."""
        with anyio.CancelScope(shield=True):
            await self.abort()


class DirectSends:
    """``Context.send`` of a non-transacted handler: each send is made at once, with a receipt,
    a member on the delivery's broker preferred (a reply goes to the delivery's broker)."""

    def __init__(self, producer: Producer, broker: str) -> None:
        self._producer = producer
        self._broker = broker

    async def send(self, target: ReplyTo, message: OutgoingMessage, key: str | None) -> None:
        if isinstance(target, ReplyAddress):
            await self._producer.send_reply(self._broker, target, message)
            return
        await self._producer.send_message(target, message, key=key, prefer=self._broker)


async def commit(
    tx: Transaction, deliveries: Sequence[Delivery],
    sends: Sequence[tuple[Destination, OutgoingMessage]] = (),
) -> None:
    """Send ``sends`` and ack ``deliveries`` (in dispatch order) in ``tx``, then commit; abort
    if interrupted before the commit."""
    try:
        for target, outgoing in sends:
            await tx.send(target, outgoing)
        for delivery in deliveries:
            await tx.ack(delivery)
    except BaseException:
        with anyio.CancelScope(shield=True):
            await tx.abort()
        raise
    await tx.commit()
