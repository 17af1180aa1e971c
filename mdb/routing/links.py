"""Broker links: connections to a named broker, opened from its settings and reconnected on
demand, and the broker's availability as the process sees it.

``adapter`` is the one place where a broker's settings become an adapter's ``Broker``; every
connection mdb opens (the container, the producer, the CLI, the Spark source and sink) goes
through a ``BrokerLink`` made by it. A broker serves a process over several links. Their
``BrokerStatus`` turns what the links see into one state per broker — up, down, or failed
(down for longer than ``reconnect_give_up_after``) — and emits an event on each change, not
once per connection.

A broker may have several addresses (``BrokerSettings.addresses``: a master and its standby,
the nodes of a cluster). A link connects in **rounds**, as Qpid's ``roundrobin`` failover (one
address is its ``singlebroker``): from the address the broker's status last saw active, each
address in turn, wrapping, ``1 + failover_retries`` times, ``failover_delay`` between two
attempts, ``failover_cycles`` times over the list. ``connect`` runs one round;
``connection`` runs rounds until one succeeds, waiting ``reconnect_delay`` (doubling, with
jitter) between them. The status keeps the active address, so the links of a broker converge
on one.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import anyio

from mdb.config.broker_settings import BrokerSettings
from mdb.errors import ConnectionFailed, CredentialsRefused
from mdb.listeners.events import BrokerEvent, EventKind, Events
from mdb.messages.topology import Member
from mdb.observability.redaction import redact_url
from mdb.seam.broker import Broker, Capabilities, Connection, ConnectionOptions, TlsOptions
from mdb.seam.registry import broker_for, system_of

log = logging.getLogger("mdb.links")

# How many subscribes may wait for their broker's answer on one connection at once. One after
# another, the 3,000 subscriptions of 1,000 listeners on three brokers waited for 3,000 round
# trips; all at once, a connection's last SUBSCRIBE waited behind a hundred others, which the
# broker answers one at a time, and missed its receipt's deadline on a busy machine.
SUBSCRIBES_IN_FLIGHT = 16

# How many members a broker's connection-lost and connection-restored lines name.
LISTED_MEMBERS = 10


def adapters(name: str, settings: BrokerSettings, client_id: str) -> tuple[Broker, ...]:
    """The adapter's ``Broker`` for each address of broker ``name`` with ``settings``,
    connecting to nothing yet. Raises ConfigurationError when no adapter serves an address, or
    the adapter refuses it."""
    return tuple(adapter(name, settings, client_id, url) for url in settings.addresses)


def adapter(name: str, settings: BrokerSettings, client_id: str,
            url: str | None = None) -> Broker:
    """The adapter's ``Broker`` for broker ``name`` with ``settings`` at address ``url``
    (default: its first), connecting to nothing yet: the one place where settings become
    ``ConnectionOptions``. Raises ConfigurationError when no adapter serves the URL, or the
    adapter refuses it."""
    tls = settings.tls
    return broker_for(ConnectionOptions(
        url=settings.addresses[0] if url is None else url,
        username=settings.username,
        password=settings.password.get_secret_value() if settings.password else None,
        broker=name,
        tls=None if tls is None else TlsOptions(
            ca_file=_path(tls.ca_file),
            cert_file=_path(tls.cert_file),
            key_file=_path(tls.key_file),
            min_version=tls.min_version,
        ),
        client_id=client_id,
        heartbeat_ms=settings.heartbeat_ms,
        connect_timeout=settings.connect_timeout,
        receipt_timeout=settings.receipt_timeout,
        adapter_options=settings.adapter_options(),
    ))


def _path(path: Path | None) -> str | None:
    return None if path is None else str(path)


def backed_off(delay: float, settings: BrokerSettings) -> float:
    """The wait after ``delay`` when the broker still does not answer: twice as long, at most
    ``reconnect_max_delay``."""
    return min(delay * 2, settings.reconnect_max_delay)


def round_order(count: int, start: int, settings: BrokerSettings) -> list[int]:
    """The addresses (indexes into ``settings.addresses``, ``count`` of them) one reconnect
    round tries, in order: from ``start``, wrapping, each ``1 + failover_retries`` times in a
    row, ``failover_cycles`` times over the list."""
    return [(start + step) % count
            for _ in range(settings.failover_cycles)
            for step in range(count)
            for _ in range(1 + settings.failover_retries)]


def round_failed(name: str, failures: Mapping[int, ConnectionFailed]) -> ConnectionFailed:
    """The error of a round in which every attempt failed (``failures``: the last failure at
    each address tried): a single address's own; else one naming each address's, a
    ``CredentialsRefused`` only when every address refused the login (one node may be
    misconfigured; a broker that refuses everywhere wants new credentials)."""
    if len(failures) == 1:
        return next(iter(failures.values()))
    every = list(failures.values())
    kind = (CredentialsRefused if all(isinstance(e, CredentialsRefused) for e in every)
            else ConnectionFailed)
    return kind(f"broker {name} answered on none of its {len(every)} addresses: "
                + "; ".join(map(str, every)))


class BrokerStatus:
    """One broker's availability. ``members`` names what goes with it (for member events).

    An outage is logged as one line when it starts (``connection-lost``, naming the members it
    makes unavailable) and one when it ends (``connection-restored``, with how long it lasted,
    how many connection attempts failed meanwhile and, for a broker with several addresses,
    the one it is now on), however many connections serve the broker; the member events of an
    outage are still emitted, counted and called back, but logged only at DEBUG, since the
    broker's line names them.
    """

    def __init__(self, name: str, settings: BrokerSettings, events: Events,
                 members: Callable[[], list[Member]] = list) -> None:
        self.name = name
        self.settings = settings
        self.state = "unknown"  # then "up", "down", "failed"
        self.since = time.time()
        self.failed_attempts = 0
        """Connection attempts that failed since the broker was last up."""
        self.outages = 0  # how many times it went down: a link tells its own loss from a known one
        self.connections = 0
        """Connections the broker's links opened: a link's failed round counts as an outage
        only if no other link connected while it ran (``round_failed``)."""
        self.active = 0
        """The index in ``settings.addresses`` of the address last connected to: where a
        link's reconnect round starts."""
        self._events = events
        self._members = members

    @property
    def address(self) -> str:
        """The address last connected to (the first before any), redacted: for events and
        the health endpoint."""
        return redact_url(self.settings.addresses[self.active])

    def up(self, address: int) -> None:
        """A link connected, to the address of index ``address``."""
        self.active = address
        self.connections += 1
        if self.state == "up":
            self.failed_attempts = 0  # attempts of a round that then succeeded
            return
        was, down_for, attempts = self.state, time.time() - self.since, self.failed_attempts
        self._set("up")
        self.failed_attempts = 0
        if was != "unknown":
            members = self._members()
            where = f", now on {self.address}" if len(self.settings.addresses) > 1 else ""
            self._emit(EventKind.CONNECTION_RESTORED, detail=(
                f"down for {down_for:.1f}s, {attempts} failed attempts{where}"
                + _listed("; members available again", members)))
            for member in members:
                self._emit(EventKind.MEMBER_AVAILABLE, member, quiet=True)

    def attempt_failed(self) -> None:
        """One connection attempt failed: counted. The broker is down only when a whole round
        failed (``down``): another of its addresses may answer."""
        self.failed_attempts += 1

    def round_failed(self, reason: str, connections_then: int) -> None:
        """A link's connection round that began when ``connections`` was ``connections_then``
        failed: the broker is down (``down``), unless another link connected meanwhile: then
        the round's failures were the end of the outage that connection ended, not a new one
        (a round that began while the broker was starting again)."""
        if self.connections == connections_then:
            self.down(reason)

    def down(self, reason: str) -> None:
        if self.state in ("down", "failed"):
            give_up = self.settings.reconnect_give_up_after
            if (self.state == "down" and give_up is not None
                    and time.time() - self.since >= give_up):
                self.state = "failed"
                self._emit(EventKind.BROKER_FAILED,
                           detail=f"unreachable for {give_up:g}s: {reason}; still retrying")
            return
        # Never up yet: at startup, whose own line says it (the container's warning, or the
        # command's error when no broker answers); logging it here too says it twice.
        never_up = self.state == "unknown"
        self._set("down")
        self.outages += 1
        members = self._members()
        self._emit(EventKind.CONNECTION_LOST,
                   detail=reason + _listed("; members unavailable", members), quiet=never_up)
        for member in members:
            self._emit(EventKind.MEMBER_UNAVAILABLE, member, quiet=True)

    def _set(self, state: str) -> None:
        self.state = state
        self.since = time.time()

    def _emit(self, kind: EventKind, member: Member | None = None, detail: str = "",
              quiet: bool = False) -> None:
        self._events.emit(BrokerEvent(kind, self.name, member, detail), quiet=quiet)


def _listed(label: str, members: list[Member]) -> str:
    """``label`` and the first ``LISTED_MEMBERS`` of ``members``, then how many more: a broker
    holding a member of each of a thousand listeners is not one line of 30 KB."""
    if not members:
        return ""
    shown = ", ".join(map(str, members[:LISTED_MEMBERS]))
    more = len(members) - LISTED_MEMBERS
    return f"{label}: {shown}" + (f" and {more} more" if more > 0 else "")


class BrokerLink:
    """One connection to the broker of ``status``, opened on first use and again after it was
    lost, at one of the broker's addresses (see the module docstring). What it sees
    (connected, refused, lost) goes to ``status``. ConfigurationError at construction when no
    adapter serves an address of the broker."""

    def __init__(self, status: BrokerStatus, client_id: str) -> None:
        self.status = status
        self.name = status.name
        self.settings = status.settings
        self._brokers = adapters(self.name, self.settings, client_id)  # one per address
        self.system = system_of(self.settings.addresses[0])  # messaging.system, its spans'
        # What the broker can do before connecting (the same at every address: one adapter).
        self.capabilities: Capabilities = self._brokers[0].capabilities
        self._current: Connection | None = None
        self._outages_then = 0  # the status's outages when ``_current`` was opened
        self._lock = anyio.Lock()
        #: Held by each subscribe on this link while it waits for the broker's answer.
        self.subscribing = anyio.CapacityLimiter(SUBSCRIBES_IN_FLIGHT)

    @property
    def is_open(self) -> bool:
        return self._current is not None and self._current.is_open

    async def connect(self) -> Connection:
        """The open connection, connecting in one round if there is none; raises
        ConnectionFailed (``round_failed``)."""
        async with self._lock:
            if not self.is_open:
                await self._reported_round()
            assert self._current is not None
            return self._current

    async def connection(self) -> Connection:
        """The open connection, reconnecting in rounds, with backoff and jitter between them,
        until one succeeds (or the caller is cancelled). Callers that lost the connection at
        once share one attempt. A refused login (``CredentialsRefused``) is retried too:
        rotating a password is normal, and the broker status reports it (down, then failed)
        meanwhile."""
        async with self._lock:
            delay = self.settings.reconnect_delay
            if (not self.is_open and self._current is not None
                    and self._outages_then == self.status.outages):
                # A loss noticed after the broker went down and came back again since this
                # connection was opened belongs to that outage, already reported.
                self.status.down("connection lost")
            while not self.is_open:
                try:
                    await self._reported_round()
                except ConnectionFailed as exc:
                    # The outage is logged once by the status; each round only at DEBUG.
                    log.debug("broker %s: reconnect failed (%s); next round in %.1fs",
                              self.name, exc, delay)
                    await anyio.sleep(delay * random.uniform(0.8, 1.2))
                    delay = backed_off(delay, self.settings)
            assert self._current is not None
            return self._current

    async def _reported_round(self) -> None:
        """``_round``, a failed one told to the broker status (``round_failed``)."""
        connections_then = self.status.connections
        try:
            await self._round()
        except ConnectionFailed as exc:
            self.status.round_failed(str(exc), connections_then)
            raise

    async def _round(self) -> None:
        """One round over the broker's addresses (``round_order``), from the status's active
        one; the first connection opened ends it. Raises ``round_failed``'s error."""
        failures: dict[int, ConnectionFailed] = {}
        order = round_order(len(self._brokers), self.status.active, self.settings)
        for attempt, index in enumerate(order):
            if attempt:
                await anyio.sleep(self.settings.failover_delay)
            try:
                connection = await self._brokers[index].connect()
            except ConnectionFailed as exc:
                self.status.attempt_failed()
                failures[index] = exc  # the last failure of each address
                log.debug("broker %s: connecting to %s failed: %s", self.name,
                          redact_url(self.settings.addresses[index]), exc)
                continue
            self._opened(connection, index)
            return
        raise round_failed(self.name, failures)

    def _opened(self, connection: Connection, address: int) -> None:
        self._current = connection
        self._outages_then = self.status.outages
        self.status.up(address)

    async def close(self) -> None:
        """Close the connection, if open; the next ``connect``/``connection`` opens another."""
        if self._current is not None:
            with anyio.CancelScope(shield=True):
                await self._current.close()
            self._current = None
