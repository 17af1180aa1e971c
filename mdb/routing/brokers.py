"""The brokers of one process for one set of settings: the one object a container and its
producer (or a standalone producer, or the Spark sink) both hold to reach brokers.

``Brokers`` knows the settings and their topology, makes every ``BrokerLink`` (``link``), keeps
the status of each broker the container listens on (``watch`` at startup, ``prepare`` and
``apply`` on a topology change), the container's connections to each (``pools``), and sends
with member failover (``failover``): the next member when a broker cannot be reached, that
broker skipped for a while (``Skipped``), and a wait for one to come back.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from functools import partial

import anyio

from mdb.config.broker_settings import BrokerSettings
from mdb.config.settings import Settings
from mdb.errors import ConfigurationError, ConnectionFailed, ConnectionLost, CredentialsRefused
from mdb.listeners.events import Events
from mdb.messages.destinations import Destination
from mdb.messages.identity import Seal, room_for_the_proof
from mdb.messages.topology import Member
from mdb.routing.links import BrokerLink, BrokerStatus, backed_off
from mdb.seam.broker import HeaderLimits
from mdb.seam.registry import factory_for

# A broker serves each connection on one thread (ActiveMQ: one transport thread per
# connection), so the pool slots on one broker are spread over several connections: one per
# four slots, at most eight. Measured on ActiveMQ 5.17, pool=16: 1 connection 2,300 msg/s,
# 4 connections 3,000 msg/s, 16 connections 2,700 msg/s (docs/performance.md).
SLOTS_PER_CONNECTION = 4
MAX_CONNECTIONS = 8


def refuse_embedded(settings: Settings, destination: Destination, command: str,
                    instead: str) -> None:
    """ConfigurationError when ``destination`` lives on an embedded broker, which the process
    running ``command`` would make its own, empty: ``instead`` says what to do."""
    for member in settings.topology().members(destination):
        if settings.brokers[member.broker].embedded:
            raise ConfigurationError(
                f"{command}: broker {member.broker!r} is the embedded memory:// broker, which "
                f"lives inside the process that runs it (`mdb run`), so {instead}")


def connections_for(slots: int) -> int:
    """How many connections a container opens to a broker serving ``slots`` pool slots."""
    return min(-(-slots // SLOTS_PER_CONNECTION), MAX_CONNECTIONS)


class Skipped:
    """Brokers a sender skips for a while after a send to them failed: the broker's
    ``reconnect_delay`` the first time, doubling with each failure in a row up to
    ``reconnect_max_delay``; a success forgets it. Times are ``time.monotonic()`` values."""

    def __init__(self) -> None:
        self._until: dict[str, tuple[float, float]] = {}  # broker → (until, last delay)

    def failed(self, broker: str, settings: BrokerSettings, now: float) -> None:
        _, last = self._until.get(broker, (0.0, settings.reconnect_delay / 2))
        delay = backed_off(last, settings)
        self._until[broker] = (now + delay, delay)

    def succeeded(self, broker: str) -> None:
        self._until.pop(broker, None)

    def at(self, now: float) -> set[str]:
        """The brokers skipped at ``now``."""
        return {broker for broker, (until, _) in self._until.items() if until > now}


def narrowest(limits: Collection[HeaderLimits]) -> HeaderLimits:
    """Header limits that keep within each of ``limits`` (the one, when there is one)."""
    if len(limits) == 1:
        return next(iter(limits))
    return HeaderLimits(count=min(each.count for each in limits),
                        line=min(each.line for each in limits),
                        total=min(each.total for each in limits),
                        size=lambda name, value: max(each.size(name, value) for each in limits))


Attempt = Callable[[Member], Awaitable[None]]
"""Sends to one member; raises ConnectionFailed or ConnectionLost when it surely did not."""


class Brokers:
    """The brokers of ``settings``; ``events`` receives the availability events of the
    brokers it watches (see ``mdb.listeners.events``)."""

    def __init__(self, settings: Settings, events: Events | None = None) -> None:
        self.settings = settings
        self.seal = Seal.of(settings)
        """The secret every message of this process is proven with, and every message it
        receives checked with (``mdb.messages.identity``): a container whose exactly-once listeners'
        database holds one puts that one here at startup."""
        self.topology = settings.topology()
        self.events = events if events is not None else Events()
        self.pools: dict[str, list[BrokerLink]] = {}
        """The container's connections to each broker it listens on."""
        self._watched: dict[str, BrokerStatus] = {}
        self._skipped = Skipped()
        self._limits: tuple[Settings, HeaderLimits] | None = None  # for these settings

    @property
    def header_limits(self) -> HeaderLimits:
        """The headers every message this process sends keeps to: within the limits of every
        adapter its brokers' addresses name (``Broker.header_limits``), as a message may go to
        any broker (a member, a failover, an error destination), with room for its proof
        (``mdb.messages.identity``). ConfigurationError when no adapter serves an address."""
        if self._limits is None or self._limits[0] is not self.settings:
            found = {factory_for(address).header_limits
                     for broker in self.settings.brokers.values() for address in broker.addresses}
            self._limits = (self.settings, room_for_the_proof(narrowest(found)))
        return self._limits[1]

    def watch(self, name: str, members: Callable[[], list[Member]] = list) -> BrokerStatus:
        """Report broker ``name``'s availability from now on: events, ``watched``; ``members``
        names the members that go with it."""
        status = self._watched[name] = BrokerStatus(name, self.settings.brokers[name],
                                                   self.events, members)
        return status

    def status(self, name: str) -> BrokerStatus:
        """The watched status of broker ``name``, else a new one whose events are only
        logged."""
        return self._watched.get(name) or BrokerStatus(name, self.settings.brokers[name],
                                                       Events())

    def link(self, name: str, client_id: str) -> BrokerLink:
        """A new link to broker ``name``, not connected yet (ConfigurationError: no adapter
        serves its URL)."""
        return BrokerLink(self.status(name), client_id)

    def watched(self) -> list[BrokerStatus]:
        """The statuses of the watched brokers (the brokers of the health endpoint)."""
        return list(self._watched.values())

    def broker_states(self) -> list[tuple[str, str, bool]]:
        """Each watched broker the container is connected to: its name, ``messaging.system``
        and whether it is up (for ``telemetry.watch_brokers``)."""
        return [(name, self.pools[name][0].system, status.state == "up")
                for name, status in self._watched.items() if name in self.pools]

    # -- the container's connections -----------------------------------------------------------

    def moved(self, settings: Settings) -> set[str]:
        """The brokers whose settings differ in ``settings``, or that it leaves out."""
        return {name for name, broker in self.settings.brokers.items()
                if settings.brokers.get(name) != broker}

    def prepare(self, settings: Settings, slots: Mapping[str, int], client_id: str,
                members: Callable[[str], list[Member]]) -> dict[str, list[BrokerLink]]:
        """New connections (``connections_for``) for the brokers in ``slots`` (pool slots per
        broker) that have none, or whose settings differ in ``settings``, each broker with a
        fresh status; ``apply`` puts them in use. Raises ConfigurationError for a URL no
        adapter serves, changing nothing."""
        pools: dict[str, list[BrokerLink]] = {}
        moved = self.moved(settings)
        for name, count in slots.items():
            if name in self.pools and name not in moved:
                continue
            status = BrokerStatus(name, settings.brokers[name], self.events,
                                  partial(members, name))
            pools[name] = [BrokerLink(status, client_id) for _ in range(connections_for(count))]
        return pools

    def apply(self, settings: Settings, pools: Mapping[str, list[BrokerLink]],
              ) -> list[BrokerLink]:
        """Use ``settings`` (their brokers and topology) and the ``pools`` from ``prepare``;
        return the connections of brokers whose settings changed or that left, for the caller
        to close once nothing uses them."""
        moved = self.moved(settings)
        retired = [link for name in moved for link in self.pools.pop(name, [])]
        for name in set(self._watched) - set(settings.brokers):
            del self._watched[name]
        for name, links in pools.items():
            self._watched[name] = links[0].status
            self.pools.setdefault(name, []).extend(links)
        self.settings = settings
        self.topology = settings.topology()
        return retired

    async def close(self) -> None:
        """Close the container's connections."""
        for links in self.pools.values():
            for link in links:
                await link.close()

    # -- sending ---------------------------------------------------------------------------------

    async def failover(self, destination: Destination, attempt: Attempt, *,
                       key: str | None = None, prefer: str | None = None) -> Member:
        """Call ``attempt`` on a member of ``destination`` (``Topology.candidates``: round robin,
        or by ``key``; ``prefer``'s first) until one succeeds; return it. A member whose
        attempt failed is followed by the next, and its broker is skipped for a while
        (``Skipped``). When none succeeds, wait for one to come back (pauses from the
        members' shortest ``reconnect_delay``, doubling), up to their longest
        ``send_wait_for_reconnect``; then raise the last failure."""
        members = self.topology.members(destination)
        brokers = [self.settings.brokers[m.broker] for m in members]
        deadline = time.monotonic() + max(b.send_wait_for_reconnect for b in brokers)
        pause = min(b.reconnect_delay for b in brokers)
        while True:
            failure: ConnectionFailed | ConnectionLost | None = None
            for member in self.topology.candidates(destination, key=key, prefer=prefer,
                                                   down=self._skipped.at(time.monotonic())):
                try:
                    await attempt(member)
                except (ConnectionFailed, ConnectionLost) as exc:
                    failure = exc
                    self._skipped.failed(member.broker, self.settings.brokers[member.broker],
                                         time.monotonic())
                    continue
                self._skipped.succeeded(member.broker)
                return member
            assert failure is not None  # a destination has at least one member
            left = deadline - time.monotonic()
            if left <= 0 or isinstance(failure, CredentialsRefused):
                raise failure  # a refused login is not a broker coming back
            # Stop the world for this send, as a JMS producer does during a reconnect.
            await anyio.sleep(min(pause, left))
            pause = min(pause * 2, max(b.reconnect_max_delay for b in brokers))
