"""``Prefetched``: the deliveries of one subscription between the wire and ``receive``."""

from __future__ import annotations

import asyncio
from collections import deque

from mdb.errors import BrokerError
from mdb.seam.broker import Delivery


class Prefetched:
    """Deliveries pushed by the loop's frame handler, awaited by ``receive``; loop thread only."""

    def __init__(self) -> None:
        self._items: deque[Delivery] = deque()
        self._ready = asyncio.Event()
        self._failure: tuple[type[BrokerError], str] | None = None

    def put(self, delivery: Delivery) -> None:
        """Buffer ``delivery``; dropped once failed."""
        if self._failure is None:
            self._items.append(delivery)
            self._ready.set()

    def fail(self, error: type[BrokerError], message: str) -> None:
        """From now on ``get`` raises; buffered deliveries are dropped, not drained."""
        if self._failure is None:
            self._failure = (error, message)
            self._items.clear()
            self._ready.set()

    def get_nowait(self) -> Delivery | None:
        """A buffered delivery, or None (also once failed); never waits."""
        if self._failure is None and self._items:
            return self._items.popleft()
        return None

    async def get(self) -> Delivery:
        """The next delivery, waiting for it; raises the failure once failed."""
        while True:
            if self._failure is not None:
                error, message = self._failure
                raise error(message)
            if self._items:
                return self._items.popleft()
            # One event for every wait: clearing it takes no wake-up back from a receiver that
            # set() woke already (its waiter is resolved), and a new event would cost more.
            self._ready.clear()
            await self._ready.wait()
