"""Sending to a logical destination: pick a member, skip brokers that are down.

``Producer`` is the standalone API (scripts, web requests, ``mdb send``); the container uses
one too, for the sends of handlers that go to another broker than the delivery's.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from types import TracebackType

import anyio

from mdb import codec, tracing
from mdb.destinations import Destination
from mdb.errors import ConnectionFailed, ConnectionLost
from mdb.events import Events
from mdb.links import BrokerLink, BrokerStatus
from mdb.message import ID, OutgoingMessage
from mdb.settings import Settings
from mdb.topology import Member, Topology


class Producer:
    """``async with Producer(settings) as p: await p.send("queue:orders", {...})``.

    Each send waits for the broker's receipt. A send to a distributed destination goes to one
    member (``Topology.candidates``: round robin, or by ``key``); when a member's broker cannot
    be reached the next member is tried, and that broker goes to the back of the line for a
    while (its reconnect delay, doubling up to its maximum). When no member can take the
    message the send waits for one to come back, up to the members' longest
    ``send_wait_for_reconnect``, then raises ``ConnectionFailed`` or ``ConnectionLost``: it
    surely was not sent. It raises ``SendOutcomeUnknown`` when no receipt came (the message may
    still arrive: it is not tried elsewhere, which could make a duplicate).

    ``statuses`` lets a container share its view of each broker (and its events).
    """

    def __init__(self, settings: Settings, *, topology: Topology | None = None,
                 client_id: str | None = None,
                 statuses: dict[str, BrokerStatus] | None = None) -> None:
        self._settings = settings
        self.topology = topology or settings.topology()
        self._client_id = client_id or f"{settings.app}.{settings.server}.producer"
        self._statuses = statuses if statuses is not None else {}
        self._links: dict[str, BrokerLink] = {}
        self._down: dict[str, tuple[float, float]] = {}  # broker → (until, last delay)
        self._retired: list[BrokerLink] = []

    def update(self, settings: Settings, topology: Topology) -> None:
        """Use a new topology from now on; links to brokers whose settings changed are
        replaced on their next use."""
        for name, link in list(self._links.items()):
            if settings.brokers.get(name) != link.settings:
                self._retired.append(self._links.pop(name))
        self._settings = settings
        self.topology = topology

    async def send(
        self, destination: str | Destination, body: object,
        headers: Mapping[str, str] | None = None, *, key: str | None = None,
    ) -> str:
        """Send ``body``; return its ``mdb_id``."""
        message = codec.outgoing(body, headers)
        await self.send_message(Destination.parse(destination), message, key=key)
        return message.headers[ID]

    def member_for(self, destination: Destination, *, key: str | None = None,
                   prefer: str | None = None) -> Member:
        """The member of ``destination`` a send tries first (``Topology.candidates``, whether
        its broker is up or not); without a ``key`` it takes a turn of the round robin."""
        return self.topology.candidates(destination, key=key, prefer=prefer)[0]

    async def send_message(self, destination: Destination, message: OutgoingMessage, *,
                           key: str | None = None, prefer: str | None = None) -> Member:
        """Send ``message`` to a member of ``destination`` (see the class docstring); return
        the member that confirmed it."""
        members = self.topology.members(destination)
        brokers = [self._settings.brokers[m.broker] for m in members]
        deadline = time.monotonic() + max(b.send_wait_for_reconnect for b in brokers)
        pause = min(b.reconnect_delay for b in brokers)
        while True:
            now = time.monotonic()
            down = {broker for broker, (until, _) in self._down.items() if until > now}
            failure: ConnectionFailed | ConnectionLost | None = None
            for member in self.topology.candidates(destination, key=key, prefer=prefer,
                                                   down=down):
                link = self._link(member.broker)
                try:
                    with tracing.sending(link.system, destination, message) as traced:
                        connection = await link.connect()
                        await connection.send(member.destination, traced)
                except (ConnectionFailed, ConnectionLost) as exc:
                    failure = exc
                    self._mark_down(member.broker)
                    continue
                self._down.pop(member.broker, None)
                return member
            assert failure is not None  # a destination has at least one member
            left = deadline - time.monotonic()
            if left <= 0:
                raise failure
            # Stop the world for this send, as a JMS producer does during a reconnect.
            await anyio.sleep(min(pause, left))
            pause = min(pause * 2, max(b.reconnect_max_delay for b in brokers))

    def _link(self, broker: str) -> BrokerLink:
        link = self._links.get(broker)
        if link is None:
            status = self._statuses.get(broker) or BrokerStatus(
                broker, self._settings.brokers[broker], Events())
            link = self._links[broker] = BrokerLink(status, self._client_id)
        return link

    def _mark_down(self, broker: str) -> None:
        settings = self._settings.brokers[broker]
        _, last = self._down.get(broker, (0.0, settings.reconnect_delay / 2))
        delay = min(last * 2, settings.reconnect_max_delay)
        self._down[broker] = (time.monotonic() + delay, delay)

    async def close(self) -> None:
        for link in [*self._links.values(), *self._retired]:
            await link.close()
        self._retired.clear()

    async def __aenter__(self) -> Producer:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()
