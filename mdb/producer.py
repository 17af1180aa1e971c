"""Sending to a logical destination: pick a member, skip brokers that are down.

``Producer`` is the standalone API (scripts, web requests, ``mdb send``); the container uses
one too, for the sends of handlers that go to another broker than the delivery's.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from types import TracebackType

from mdb import codec
from mdb.destinations import Destination
from mdb.errors import ConnectionFailed, ConnectionLost
from mdb.links import BrokerLink
from mdb.message import ID, OutgoingMessage
from mdb.settings import Settings
from mdb.topology import Member, Topology


class Producer:
    """``async with Producer(settings) as p: await p.send("queue:orders", {...})``.

    Each send waits for the broker's receipt. A send to a distributed destination goes to one
    member (``Topology.candidates``: round robin, or by ``key``); when a member's broker cannot
    be reached the next member is tried, and that broker goes to the back of the line for a
    while (its reconnect delay, doubling up to its maximum). A send raises
    ``SendOutcomeUnknown`` when no receipt came (the message may still arrive: it is not tried
    elsewhere, which could make a duplicate) and ``ConnectionLost`` or ``ConnectionFailed``
    when no member could take it.
    """

    def __init__(self, settings: Settings, *, topology: Topology | None = None,
                 client_id: str | None = None) -> None:
        self._settings = settings
        self.topology = topology or settings.topology()
        self._client_id = client_id or f"{settings.app}.{settings.server}.producer"
        self._links: dict[str, BrokerLink] = {}
        self._down: dict[str, tuple[float, float]] = {}  # broker → (until, last delay)

    async def send(
        self, destination: str | Destination, body: object,
        headers: Mapping[str, str] | None = None, *, key: str | None = None,
    ) -> str:
        """Send ``body``; return its ``mdb_id``."""
        message = codec.outgoing(body, headers)
        await self.send_message(Destination.parse(destination), message, key=key)
        return message.headers[ID]

    async def send_message(self, destination: Destination, message: OutgoingMessage, *,
                           key: str | None = None, prefer: str | None = None) -> Member:
        """Send ``message`` to a member of ``destination`` (see the class docstring); return
        the member that confirmed it."""
        now = time.monotonic()
        down = {broker for broker, (until, _) in self._down.items() if until > now}
        failure: ConnectionFailed | ConnectionLost | None = None
        for member in self.topology.candidates(destination, key=key, prefer=prefer, down=down):
            try:
                connection = await self._link(member.broker).connect()
                await connection.send(member.destination, message)
            except (ConnectionFailed, ConnectionLost) as exc:
                failure = exc
                self._mark_down(member.broker)
                continue
            self._down.pop(member.broker, None)
            return member
        assert failure is not None  # a destination has at least one member
        raise failure

    def _link(self, broker: str) -> BrokerLink:
        link = self._links.get(broker)
        if link is None:
            link = self._links[broker] = BrokerLink(
                broker, self._settings.brokers[broker], self._client_id)
        return link

    def _mark_down(self, broker: str) -> None:
        settings = self._settings.brokers[broker]
        _, last = self._down.get(broker, (0.0, settings.reconnect_delay / 2))
        delay = min(last * 2, settings.reconnect_max_delay)
        self._down[broker] = (time.monotonic() + delay, delay)

    async def close(self) -> None:
        for link in self._links.values():
            await link.close()

    async def __aenter__(self) -> Producer:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()
