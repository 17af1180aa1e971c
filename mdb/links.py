"""A broker link: the container's one connection to a named broker, reconnected on demand."""

from __future__ import annotations

import logging
import random

import anyio

from mdb.broker import Broker, Connection, ConnectionOptions, broker_for
from mdb.errors import ConnectionFailed
from mdb.settings import BrokerSettings

log = logging.getLogger("mdb.links")


class BrokerLink:
    def __init__(self, name: str, settings: BrokerSettings, client_id: str) -> None:
        self.name = name
        self.settings = settings
        self._broker: Broker = broker_for(ConnectionOptions(
            url=settings.url,
            username=settings.username,
            password=settings.password.get_secret_value() if settings.password else None,
            client_id=client_id,
            heartbeat_ms=settings.heartbeat_ms,
            connect_timeout=settings.connect_timeout,
            receipt_timeout=settings.receipt_timeout,
        ))
        self._current: Connection | None = None
        self._lock = anyio.Lock()

    @property
    def is_open(self) -> bool:
        return self._current is not None and self._current.is_open

    async def connect(self) -> Connection:
        """Connect once; raises ConnectionFailed. Used at startup, where failing is fatal."""
        async with self._lock:
            if not self.is_open:
                self._current = await self._broker.connect()
            assert self._current is not None
            return self._current

    async def connection(self) -> Connection:
        """The open connection, reconnecting with backoff and jitter until it succeeds (or the
        caller is cancelled). Callers that lost the connection at once share one attempt."""
        async with self._lock:
            delay = self.settings.reconnect_delay
            while not self.is_open:
                try:
                    self._current = await self._broker.connect()
                    log.warning("broker %s: connection restored", self.name)
                except ConnectionFailed as exc:
                    log.warning("broker %s: reconnect failed (%s); next try in %.1fs",
                                self.name, exc, delay)
                    await anyio.sleep(delay * random.uniform(0.8, 1.2))
                    delay = min(delay * 2, self.settings.reconnect_max_delay)
            assert self._current is not None
            return self._current

    async def close(self) -> None:
        if self._current is not None:
            with anyio.CancelScope(shield=True):
                await self._current.close()
            self._current = None

