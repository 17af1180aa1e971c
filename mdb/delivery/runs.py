"""How a listener's fresh delivery is run: its guarantee, chosen once, when its pool slots are
built (``mdb.container.slots``), so that the processor carries out what happened whichever it is
(docs/architecture.md, "Delivery contract"):

* ``Direct`` (``transacted=False``): the handler's sends go out as it makes them, and the
  delivery is acked once it returned (at least once, without atomic sends);
* ``Transacted`` (the default): the handler's sends join a broker transaction that acks the
  delivery; several deliveries may run in one (``batches``, ``mdb.delivery.batch``);
* exactly once (``exactly_once="NAME"``): the handler's database writes, its sends and the
  message commit in one database transaction (``mdb.exactly_once.run``), several messages in
  one where they may (``OwnTransaction``), each then settled by a plain ack.

A run is called with a decoded message and returns what happened to it and the transacted
sends to settle it with (None: a plain ack). A run that failed sent nothing in a transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Protocol, runtime_checkable

from mdb.delivery.batch import BatchFailure, Ready
from mdb.delivery.decision import SUCCEEDED, AlreadyProcessed, Raised, Reused, Succeeded
from mdb.delivery.handler_sends import DirectSends, TransactedSends
from mdb.delivery.invoker import Invoker
from mdb.messages.message import Message
from mdb.routing.producer import Producer
from mdb.seam.broker import Connection, Delivery

Ran = Succeeded | AlreadyProcessed | Reused | Raised
"""What a run made of a fresh delivery."""


class Run(Protocol):
    batches: ClassVar[bool]
    """Whether several deliveries may run in one transaction (``mdb.delivery.batch``)."""

    async def __call__(self, delivery: Delivery, message: Message, body: object,
                       connection: Connection) -> tuple[Ran, TransactedSends | None]:
        """Run the handler on ``message`` (``delivery`` as the handler sees it, its body
        decoded) from ``connection``: what happened, and the sends to settle it with."""
        ...


@runtime_checkable
class OwnTransaction(Protocol):
    """A run whose batches commit in a transaction of their own (a database's), not the
    broker's: each delivery of a batch is then settled by a plain ack."""

    async def in_one_transaction(self, run: Sequence[Ready]) -> Sequence[Ran] | BatchFailure:
        """Run the handler on each of ``run`` (two or more, in order) in one transaction:
        what became of each, once committed (to settle, in order); or, when the handler
        raised on one, where and why, nothing of the run kept (``mdb.delivery.batch``)."""
        ...


class Direct:
    """Sends made at once, the delivery acked after the handler returned."""

    batches: ClassVar[bool] = False

    def __init__(self, invoker: Invoker, producer: Producer, broker: str) -> None:
        self._invoker = invoker
        self._sends = DirectSends(producer, broker)

    async def __call__(self, delivery: Delivery, message: Message, body: object,
                       connection: Connection) -> tuple[Ran, TransactedSends | None]:
        try:
            await self._invoker.invoke(message, body, self._sends.send)
        except Exception as exc:  # user code: any failure is a failed delivery
            return Raised.of(exc), None
        return SUCCEEDED, None


class Transacted:
    """Sends and the ack in one broker transaction, on the delivery's ``broker``."""

    batches: ClassVar[bool] = True

    def __init__(self, invoker: Invoker, producer: Producer, broker: str, system: str) -> None:
        self._invoker = invoker
        self._producer = producer
        self._broker = broker
        self._system = system

    def sends(self, connection: Connection) -> TransactedSends:
        """The sends of one transaction on ``connection`` (a delivery's, or a batch's)."""
        return TransactedSends(connection, self._broker, self._system, self._producer)

    async def __call__(self, delivery: Delivery, message: Message, body: object,
                       connection: Connection) -> tuple[Ran, TransactedSends | None]:
        # Made here rather than through ``sends``: a call less per message.
        sends = TransactedSends(connection, self._broker, self._system, self._producer)
        try:
            await self._invoker.invoke(message, body, sends.send)
            error: Exception | None = await sends.flushed()
        except Exception as exc:  # user code: any failure is a failed delivery
            error = exc
        except BaseException:
            await sends.abort_shielded()
            raise
        if error is not None:
            await sends.abort()
            return Raised.of(error), None
        # Nothing sent in a transaction: settled by a plain ack, as ``sends.settle`` would.
        return SUCCEEDED, sends if sends.begun else None
