"""``MemoryTransaction``: acks and sends that take effect together at the commit (see
``mdb_memory.connection`` for how it follows ActiveMQ)."""

from __future__ import annotations

import anyio.lowlevel

from mdb.errors import AcksUnconfirmed, TransactionRolledBack
from mdb.messages.destinations import Destination
from mdb.messages.message import OutgoingMessage, ReplyTo
from mdb.seam.broker import Delivery, Transaction
from mdb_memory.queue import frozen, target_of
from mdb_memory.session import Session
from mdb_memory.subscription import Token


class MemoryTransaction(Transaction):
    def __init__(self, session: Session) -> None:
        self._session = session
        self._acks: dict[Token, None] = {}
        self._foreign = False  # acked a delivery of another connection
        self._sends: list[tuple[Destination, OutgoingMessage]] = []
        self._status = "open"  # then "committed", "rolled back", "aborted", "closed", "stale"

    def __repr__(self) -> str:
        return (f"<MemoryTransaction {self._status}: "
                f"{len(self._acks)} acks, {len(self._sends)} sends>")

    @property
    def status(self) -> str:
        return self._status

    async def ack(self, delivery: Delivery) -> None:
        await anyio.lowlevel.checkpoint()
        token = delivery.token
        if self._status != "open" or not isinstance(token, Token) or token in self._acks:
            return
        if token.subscription.session is not self._session:
            self._foreign = True
            return
        self._acks[token] = None
        token.subscription.hold(token)
        self._session.exchange.notify()

    async def send(self, destination: ReplyTo, message: OutgoingMessage) -> None:
        await anyio.lowlevel.checkpoint()
        if self._status != "open":
            return
        self._sends.append((target_of(destination), frozen(message)))

    async def commit(self) -> None:
        await anyio.lowlevel.checkpoint()
        exchange = self._session.exchange
        if self._status != "open":
            raise TransactionRolledBack(_finished_reason(self._status, exchange.name))
        failure = exchange.take_failure()
        if failure is not None and not failure[1]:
            self.finish("rolled back")
            raise TransactionRolledBack(
                f"commit on memory broker {exchange.name!r} failed (injected): nothing was applied"
            ) from failure[0]("injected by BrokerState.fail_sends")
        refused = next((d for d, _ in self._sends if d in exchange.forbidden), None)
        if refused is not None:
            self.finish("rolled back")
            raise TransactionRolledBack(
                f"commit on memory broker {exchange.name!r} rolled back: a send to {refused} was "
                "refused (injected)")
        broken = self._broken_ack()
        if broken is not None:
            self.finish("rolled back")
            raise TransactionRolledBack(
                f"commit on memory broker {exchange.name!r} rolled back: delivery {broken} is not "
                f"unsettled on this connection (settled already, its subscription closed, or "
                f"delivered on another connection)"
            )
        if exchange.acks_to_lose > 0:
            exchange.acks_to_lose -= 1
            sends = self._sends
            self.finish("rolled back")  # first: its acks hold prefetch room no more
            for destination, message in sends:
                exchange.publish(destination, message)
            exchange.notify()
            if not exchange.lost_acks_confirmed:
                raise TransactionRolledBack(
                    f"commit on memory broker {exchange.name!r}: its sends were applied, not "
                    "its acks, and reported unconfirmed (injected)")
            raise AcksUnconfirmed(
                f"commit on memory broker {exchange.name!r}: its sends were applied, not its "
                "acks (injected)")
        for token in self._acks:
            token.subscription.settle(token)
        for destination, message in self._sends:
            exchange.publish(destination, message)
        self.finish("committed")
        exchange.notify()
        if failure is not None:
            raise TransactionRolledBack(
                f"commit on memory broker {exchange.name!r}: outcome reported unknown (injected), "
                f"although it was applied"
            ) from failure[0]("injected by BrokerState.fail_sends")

    async def abort(self) -> None:
        if self._status == "open":
            self.finish("aborted")
            self._session.exchange.notify()
        await anyio.lowlevel.cancel_shielded_checkpoint()

    def finish(self, status: str) -> None:
        """End with ``status``: every ack not settled counts against prefetch again, the sends
        are dropped, and the session forgets the transaction."""
        self._status = status
        acks = self._acks
        self._acks = {}
        self._sends = []
        for token in acks:
            token.subscription.unhold(token)
        self._session.remove_transaction(self)

    def _broken_ack(self) -> str | None:
        if self._foreign:
            return "of another connection"
        for token in self._acks:
            if not token.subscription.is_unsettled(token):
                return token.message.broker_message_id
        return None


def _finished_reason(status: str, broker: str) -> str:
    reasons = {
        "stale": f"the connection to memory broker {broker!r} was lost: nothing was committed",
        "closed": f"the connection to memory broker {broker!r} was closed: nothing was committed",
        "aborted": "the transaction was aborted: nothing was committed",
        "rolled back": "the transaction was already rolled back: nothing was committed",
        "committed": "the transaction was already committed",
    }
    return reasons[status]
