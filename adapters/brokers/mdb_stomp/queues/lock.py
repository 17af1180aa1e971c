"""``held``: the lock of a queue (``StompConnection.lock``), held by a connection of its own.

What one connection at a time may have is the dialect's (``Dialect.lock``): on ActiveMQ a JMS
client ID, which its CONNECT carries; on RabbitMQ an exclusive queue, which it declares by
subscribing. The lock lasts as long as that connection, so a process killed lets it go with its
sockets. Nothing is read from it: it asks the broker for no heart-beats, so a busy process never
finds it silent (a broker that goes away closes its socket; mdb's heart-beats keep it with the
broker). Tied to the connection it locks for: when the lock's connection is lost, that one is
lost too, and nothing more is done under a lock no longer held.
"""

from __future__ import annotations

from mdb.errors import BrokerError, ConnectionFailed, QueueLocked
from mdb.messages.destinations import Destination
from mdb_stomp.dialects.dialect import Dialect
from mdb_stomp.protocol.receipts import ReceiptErrors, Unanswered
from mdb_stomp.protocol.wire import OpenWire, Wire

_LOCK = "lock"  # the lock's subscription id on its connection; never a number the wire counts


class _Tie:
    """The lock's connection, as a subscriber of its own wire: its loss loses ``holder``."""

    settled_on_arrival = True  # nothing comes: nobody sends to a lock

    def __init__(self, holder: Wire) -> None:
        self._holder = holder

    def deliver(self, headers: dict[str, str], body: bytes | str | None,
                damage: str | None = None) -> None:
        pass

    def connection_lost(self, why: str) -> None:
        self._holder.lose(f"the connection holding its lock was lost ({why})")

    def cancelled(self, why: str) -> None:
        self._holder.lose(f"the broker ended the subscription holding its lock ({why})")


async def held(open_wire: OpenWire, dialect: Dialect, queue: Destination,
               holder: Wire) -> Wire:
    """A connection holding the lock of ``queue``, tied to ``holder``; ``QueueLocked`` when
    another connection holds it, ``BrokerError`` when the broker refuses it otherwise."""
    spec = dialect.lock(queue)
    locked = QueueLocked(f"{holder.address}: {queue} is locked by another connection")
    try:
        wire = await open_wire(spec.connect_headers, hears_broker=False)
    except ConnectionFailed as failed:
        if dialect.locked_out(str(failed)):
            raise locked from None
        raise
    subscribe = spec.subscribe
    try:
        if subscribe is not None:
            await wire.confirm("SUBSCRIBE", {**subscribe.headers, "destination": subscribe.path,
                                             "id": _LOCK, "ack": subscribe.ack_mode})
    except Unanswered as unanswered:
        await wire.close()
        if unanswered.why == "refused" and dialect.locked_out(unanswered.detail):
            raise locked from None
        raise ReceiptErrors(f"the lock of {queue}", refused=BrokerError,
                            unconfirmed=BrokerError).error(unanswered) from None
    except BaseException:
        await wire.close()
        raise
    wire.attach(_LOCK, _Tie(holder))
    return wire
