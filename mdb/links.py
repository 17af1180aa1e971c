"""Broker links: connections to a named broker, opened from its settings and reconnected on
demand, and the broker's availability as the process sees it.

``adapter`` is the one place where a broker's settings become an adapter's ``Broker``; every
connection mdb opens (the container, the producer, the CLI, the Spark source and sink) goes
through a ``BrokerLink`` made by it. A broker serves a process over several links. Their
``BrokerStatus`` turns what the links see into one state per broker — up, down, or failed
(down for longer than ``reconnect_give_up_after``) — and emits an event on each change, not
once per connection.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from pathlib import Path

import anyio

from mdb.broker import Broker, Connection, ConnectionOptions, TlsOptions, broker_for
from mdb.broker_settings import BrokerSettings
from mdb.errors import ConnectionFailed
from mdb.events import BrokerEvent, EventKind, Events
from mdb.topology import Member

log = logging.getLogger("mdb.links")


def adapter(name: str, settings: BrokerSettings, client_id: str) -> Broker:
    """The adapter's ``Broker`` for broker ``name`` with ``settings``, connecting to nothing
    yet: the one place where settings become ``ConnectionOptions``. Raises ConfigurationError
    when no adapter serves the URL, or the adapter refuses it."""
    tls = settings.tls
    return broker_for(ConnectionOptions(
        url=settings.url,
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
    ))


def _path(path: Path | None) -> str | None:
    return None if path is None else str(path)


def backed_off(delay: float, settings: BrokerSettings) -> float:
    """The wait after ``delay`` when the broker still does not answer: twice as long, at most
    ``reconnect_max_delay``."""
    return min(delay * 2, settings.reconnect_max_delay)


class BrokerStatus:
    """One broker's availability. ``members`` names what goes with it (for member events).

    An outage is logged as one line when it starts (``connection-lost``, naming the members it
    makes unavailable) and one when it ends (``connection-restored``, with how long it lasted
    and how many connection attempts failed meanwhile), however many connections serve the
    broker; the member events of an outage are still emitted, counted and called back, but
    logged only at DEBUG, since the broker's line names them.
    """

    def __init__(self, name: str, settings: BrokerSettings, events: Events,
                 members: Callable[[], list[Member]] = list) -> None:
        self.name = name
        self.settings = settings
        self.state = "unknown"  # then "up", "down", "failed"
        self.since = time.time()
        self.failed_attempts = 0
        self.outages = 0  # how many times it went down: a link tells its own loss from a known one
        """Connection attempts that failed since the broker was last up."""
        self._events = events
        self._members = members

    def up(self) -> None:
        if self.state == "up":
            return
        was, down_for, attempts = self.state, time.time() - self.since, self.failed_attempts
        self._set("up")
        self.failed_attempts = 0
        if was != "unknown":
            members = self._members()
            self._emit(EventKind.CONNECTION_RESTORED, detail=(
                f"down for {down_for:.1f}s, {attempts} failed attempts"
                + _listed("; members available again", members)))
            for member in members:
                self._emit(EventKind.MEMBER_AVAILABLE, member, quiet=True)

    def attempt_failed(self, reason: str) -> None:
        """A connection attempt failed: counted, and the broker is down (see ``down``)."""
        self.failed_attempts += 1
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
        self._set("down")
        self.outages += 1
        members = self._members()
        self._emit(EventKind.CONNECTION_LOST,
                   detail=reason + _listed("; members unavailable", members))
        for member in members:
            self._emit(EventKind.MEMBER_UNAVAILABLE, member, quiet=True)

    def _set(self, state: str) -> None:
        self.state = state
        self.since = time.time()

    def _emit(self, kind: EventKind, member: Member | None = None, detail: str = "",
              quiet: bool = False) -> None:
        self._events.emit(BrokerEvent(kind, self.name, member, detail), quiet=quiet)


def _listed(label: str, members: list[Member]) -> str:
    return f"{label}: {', '.join(map(str, members))}" if members else ""


class BrokerLink:
    """One connection to the broker of ``status``, opened on first use and again after it was
    lost. What it sees (connected, refused, lost) goes to ``status``. ConfigurationError at
    construction when no adapter serves the broker's URL."""

    def __init__(self, status: BrokerStatus, client_id: str) -> None:
        self.status = status
        self.name = status.name
        self.settings = status.settings
        self._broker = adapter(self.name, self.settings, client_id)
        self.system = self._broker.system  # messaging.system on its spans
        self._current: Connection | None = None
        self._outages_then = 0  # the status's outages when ``_current`` was opened
        self._lock = anyio.Lock()

    @property
    def is_open(self) -> bool:
        return self._current is not None and self._current.is_open

    async def connect(self) -> Connection:
        """The open connection, connecting once if there is none; raises ConnectionFailed."""
        async with self._lock:
            if not self.is_open:
                try:
                    self._opened(await self._broker.connect())
                except ConnectionFailed as exc:
                    self.status.attempt_failed(str(exc))
                    raise
            assert self._current is not None
            return self._current

    async def connection(self) -> Connection:
        """The open connection, reconnecting with backoff and jitter until it succeeds (or the
        caller is cancelled). Callers that lost the connection at once share one attempt.
        A refused login (``CredentialsRefused``) is retried too: rotating a password is
        normal, and the broker status reports it (down, then failed) meanwhile."""
        async with self._lock:
            delay = self.settings.reconnect_delay
            if (not self.is_open and self._current is not None
                    and self._outages_then == self.status.outages):
                # A loss noticed after the broker went down and came back again since this
                # connection was opened belongs to that outage, already reported.
                self.status.down("connection lost")
            while not self.is_open:
                try:
                    self._opened(await self._broker.connect())
                except ConnectionFailed as exc:
                    self.status.attempt_failed(str(exc))
                    # The outage is logged once by the status; each attempt only at DEBUG.
                    log.debug("broker %s: reconnect failed (%s); next try in %.1fs",
                              self.name, exc, delay)
                    await anyio.sleep(delay * random.uniform(0.8, 1.2))
                    delay = backed_off(delay, self.settings)
            assert self._current is not None
            return self._current

    def _opened(self, connection: Connection) -> None:
        self._current = connection
        self._outages_then = self.status.outages
        self.status.up()

    async def close(self) -> None:
        """Close the connection, if open; the next ``connect``/``connection`` opens another."""
        if self._current is not None:
            with anyio.CancelScope(shield=True):
                await self._current.close()
            self._current = None
