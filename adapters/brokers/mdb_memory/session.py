"""``Session``: what one memory connection shares with its subscriptions and transactions.

The connection, its subscriptions and its transactions hold the same session and talk through
its public methods: whether the connection is open, the broker's ``Exchange``, and what is
still open on it (shut, in that order, transactions first, when the connection ends).
"""

from __future__ import annotations

from typing import Protocol

from mdb.errors import ConnectionLost
from mdb_memory.exchange import Exchange


class Ending(Protocol):
    """A subscription, as its session ends it."""

    def end(self, *, lost: bool) -> None: ...


class Finishing(Protocol):
    """A transaction, as its session finishes it (``"stale"`` or ``"closed"``)."""

    def finish(self, status: str) -> None: ...


class Session:
    """One connection to a memory broker (the exchange's ``Link``). Loop thread only."""

    def __init__(self, exchange: Exchange) -> None:
        self.exchange = exchange
        self._open = True
        self._lost = False
        self._subscriptions: dict[Ending, None] = {}
        self._transactions: dict[Finishing, None] = {}

    @property
    def is_open(self) -> bool:
        return self._open

    @property
    def status(self) -> str:
        """``open``, ``lost`` or ``closed``."""
        return "open" if self._open else "lost" if self._lost else "closed"

    def check_open(self) -> None:
        """``ConnectionLost`` once the connection was closed or lost."""
        if not self._open:
            raise ConnectionLost(
                f"the connection to memory broker {self.exchange.name!r} was {self.status}"
            )

    def add_subscription(self, subscription: Ending) -> None:
        self._subscriptions[subscription] = None

    def remove_subscription(self, subscription: Ending) -> None:
        self._subscriptions.pop(subscription, None)

    def add_transaction(self, transaction: Finishing) -> None:
        self._transactions[transaction] = None

    def remove_transaction(self, transaction: Finishing) -> None:
        self._transactions.pop(transaction, None)

    def lose(self) -> None:
        """The connection dropped (``BrokerState.drop_connections``)."""
        if self._open:
            self.shut(lost=True)

    def shut(self, *, lost: bool) -> None:
        """End the connection: open transactions become stale (lost) or closed, subscriptions
        give their unsettled deliveries back, and the exchange forgets the connection."""
        self._open = False
        self._lost = lost
        for transaction in list(self._transactions):
            transaction.finish("stale" if lost else "closed")
        for subscription in list(self._subscriptions):
            subscription.end(lost=lost)
        self.exchange.detach(self)
