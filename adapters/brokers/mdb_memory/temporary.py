"""``MemoryTemporaryQueue``: a queue for replies, read by one connection and deleted with it."""

from __future__ import annotations

import uuid

from mdb.messages.message import ReplyAddress
from mdb.seam.broker import Connection, Delivery, Subscription, TemporaryQueue
from mdb_memory.exchange import Exchange

PREFIX = "mdb-temp-"  # a temporary queue's name is this and a random part


def new_name() -> str:
    return f"{PREFIX}{uuid.uuid4().hex}"


class MemoryTemporaryQueue(TemporaryQueue):
    """One temporary queue, ``queue:mdb-temp-<random>`` (its reply address spells it, as every
    reply address of the memory broker spells a destination), read by a subscription of the
    connection that made it, which settles each delivery as it hands it out. Made by
    ``MemoryConnection.temporary_queue``; a lost connection leaves the queue empty behind."""

    def __init__(self, connection: Connection, subscription: Subscription, name: str,
                 exchange: Exchange) -> None:
        self._connection = connection
        self._subscription = subscription
        self._name = name
        self._exchange = exchange

    @property
    def reply_to(self) -> ReplyAddress:
        return ReplyAddress(f"queue:{self._name}")

    async def receive(self) -> Delivery:
        delivery = await self._subscription.receive()
        await self._connection.ack(delivery)
        return delivery

    async def close(self) -> None:
        await self._subscription.close()
        queue = self._exchange.find(self._name)
        if queue is not None:
            self._exchange.forget(queue)
            self._exchange.notify()
