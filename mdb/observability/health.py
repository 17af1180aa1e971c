"""A snapshot of a container's health: its brokers, databases, listeners and (under
``mdb run --workers N``) workers, taken on its event loop, in JSON and back. Served over HTTP
by ``mdb.serving.http.routes`` (``/health/live``, ``/health/ready``, ``/status``), read back by
``mdb.serving.http.client`` (``mdb status``), printed by ``mdb.container.report``."""

from __future__ import annotations

import importlib.metadata
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class BrokerHealth:
    """One broker as the container sees it."""

    name: str
    state: str
    """``"up"``, ``"down"`` (reconnecting) or ``"failed"`` (down past its give-up time); any
    other state (``"unknown"``: never connected yet) counts as not up."""
    since: float
    """``time.time()`` of the last change of ``state``."""
    address: str = ""
    """The address (redacted URL) the broker's connections are on, or were last on: one of
    its ``url`` list; "" from a container that did not say."""


@dataclass(frozen=True)
class DatabaseHealth:
    """A database of exactly-once listeners (docs/exactly-once.md)."""

    name: str
    state: str
    """``"up"``, or ``"down"``: the last statement could not reach it, or had no answer in
    ``timeout``."""
    since: float
    """``time.time()`` of the last change of ``state``."""
    outbox: int
    """Sends waiting in its outbox, as last counted (every third of ``outbox_lease``)."""
    oldest: float | None
    """Seconds the oldest of them has waited; None when none waits."""


@dataclass(frozen=True)
class StuckHandler:
    """A plain ``def`` handler running past its listener's ``handler_timeout``: its pool slot
    is stuck until it returns."""

    message_id: str
    running_for: float
    """Seconds it has run, when the snapshot was taken."""


@dataclass(frozen=True)
class MemberHealth:
    """One member of a listener's destination: where it is, and whether a consumer of this
    container is subscribed to it (its broker's state is in ``Health.brokers``)."""

    broker: str
    destination: str
    """The physical destination on ``broker``, ``queue:NAME`` or ``topic:NAME``."""
    subscribed: bool
    subscription: str = ""
    """The name of its durable subscription, which the broker keeps while no consumer is
    attached (a topic's, ``mdb.routing.planning.subscription_name``); "" for a queue, or from a
    container that did not say."""


@dataclass(frozen=True)
class ListenerHealth:
    """One listener: how many of its members have a subscribed consumer, and its work."""

    name: str
    members: int
    subscribed: int
    in_flight: int
    processed: int
    slots: int = 0
    """Its pool slots (``pool`` per member); 0 from a container that did not say."""
    stuck: tuple[StuckHandler, ...] = ()
    """Its handlers past their ``handler_timeout``, each holding a slot."""
    paused: bool = False
    """Paused (``Container.pause``): it takes no new delivery; not a reason to be unready.
    Under ``mdb run --workers N``: paused in at least one worker."""
    redelivered: int = 0
    """Deliveries it handled again after a failure (the ``redelivered`` outcome)."""
    to_error_destination: int = 0
    """Messages it moved to its error destination."""
    destination: str = ""
    """The listener's logical destination; "" from a container that did not say."""
    mode: str = ""
    """``queue`` (its consumers compete), or the distribution of a topic listener
    (``one-copy-per-app``, ``one-copy-per-server``)."""
    member_states: tuple[MemberHealth, ...] = ()
    """Each member of the destination (empty from a container that did not say, and from a
    supervisor of ``--workers N``, whose workers each have consumers of their own)."""
    latency_p50: float | None = None
    """Seconds its handler took at the median of its recent messages
    (``mdb.observability.telemetry.latency``); None before any, or from a container that did
    not say."""
    latency_p99: float | None = None
    """Seconds its handler took at the 99th percentile of its recent messages."""
    already_processed: int = 0
    """Copies of messages it had already processed (an exactly-once listener's), settled
    without running its handler."""

    @property
    def all_stuck(self) -> bool:
        """Every slot holds a stuck handler: the listener takes no message."""
        return 0 < self.slots <= len(self.stuck)


@dataclass(frozen=True)
class WorkerHealth:
    """One worker process of ``mdb run --workers N``, as its supervisor sees it."""

    index: int
    """1 to N: the worker's place, kept by the process that replaces it."""
    pid: int
    """The process now in that place; 0 while none runs."""
    state: str
    """``"starting"``, ``"ready"``, ``"not ready"``, ``"no answer"`` (its health endpoint did
    not answer), ``"restarting"`` (waiting to be started again), ``"failed"`` (given up: not
    started again until SIGHUP), ``"stopping"`` or ``"stopped"``."""
    restarts: int
    """How many times the supervisor started this place again after its process ended."""


STARTING, RUNNING, STOPPING = "starting", "running", "stopping"
SCHEMA = 1
"""The version of the shape of ``Health.to_json``, its ``schema``: raised when a field changes
meaning or goes; a field added leaves it (readers ignore the fields they do not know)."""


@dataclass(frozen=True)
class ContainerIdentity:
    """Which container a snapshot is of, for a reader of several (``mdb console``)."""

    app: str = ""
    server: str = ""
    host: str = ""
    """The host name of the machine it runs on."""
    pid: int = 0
    """Its process (under ``mdb run --workers N``, the supervisor's)."""
    version: str = ""
    """mdb's version."""
    started: float = 0.0
    """``time.time()`` when it started; 0 from a container that did not say."""

    @classmethod
    def here(cls, app: str, server: str) -> ContainerIdentity:
        """This process, started now."""
        return cls(app, server, socket.gethostname(), os.getpid(),
                   importlib.metadata.version("mdb"), time.time())


@dataclass(frozen=True)
class Health:
    """A snapshot of the container, taken on its event loop (or of a server of several worker
    processes, taken by their supervisor: then ``workers`` lists them). Not ready has a
    reason, always (``unready``)."""

    live: bool
    ready: bool
    brokers: tuple[BrokerHealth, ...] = ()
    listeners: tuple[ListenerHealth, ...] = ()
    events: dict[str, int] = field(default_factory=dict)
    """How many availability events of each kind (``EventKind`` value) were emitted."""
    workers: tuple[WorkerHealth, ...] = ()
    """The worker processes (``mdb run --workers N``); empty for a single process."""
    databases: tuple[DatabaseHealth, ...] = ()
    """The databases of exactly-once listeners."""
    stage: str = RUNNING
    """``STARTING`` (connecting, subscribing, starting the application's resources),
    ``RUNNING``, or ``STOPPING`` (a graceful stop: the messages in flight finish, no new one
    is taken); only a running one may be ready."""
    identity: ContainerIdentity = ContainerIdentity()
    """Which container this is."""

    def unready(self) -> dict[str, object]:
        """Why the container is not ready, every value false (empty) when it is: starting or
        stopping, the brokers and databases not up, the listeners short of members (a paused
        one is not), the
        listeners whose every slot is stuck in a handler past its ``handler_timeout``."""
        return {
            "starting": self.stage == STARTING,
            "stopping": self.stage == STOPPING,
            "brokers_down": [b.name for b in self.brokers if b.state != "up"],
            "databases_down": [d.name for d in self.databases if d.state != "up"],
            "listeners_short": [
                {"name": lh.name, "subscribed": lh.subscribed, "members": lh.members}
                for lh in self.listeners if lh.subscribed < lh.members and not lh.paused
            ],
            "listeners_stuck": [
                {"name": lh.name, "stuck": len(lh.stuck), "slots": lh.slots}
                for lh in self.listeners if lh.all_stuck
            ],
        }

    def to_json(self) -> dict[str, object]:
        return {
            "schema": SCHEMA,
            "app": self.identity.app, "server": self.identity.server,
            "host": self.identity.host, "pid": self.identity.pid,
            "version": self.identity.version, "started": self.identity.started,
            "live": self.live,
            "ready": self.ready,
            "stage": self.stage,
            "brokers": [
                {"name": b.name, "state": b.state, "since": b.since, "address": b.address}
                for b in self.brokers],
            "listeners": [
                {"name": lh.name, "members": lh.members, "subscribed": lh.subscribed,
                 "in_flight": lh.in_flight, "processed": lh.processed, "slots": lh.slots,
                 "stuck": [{"message_id": h.message_id, "running_for": h.running_for}
                           for h in lh.stuck],
                 "paused": lh.paused, "redelivered": lh.redelivered,
                 "to_error_destination": lh.to_error_destination,
                 "already_processed": lh.already_processed,
                 "destination": lh.destination, "mode": lh.mode,
                 "member_states": [{"broker": m.broker, "destination": m.destination,
                                    "subscribed": m.subscribed,
                                    "subscription": m.subscription}
                                   for m in lh.member_states],
                 "latency_p50": lh.latency_p50, "latency_p99": lh.latency_p99}
                for lh in self.listeners
            ],
            "events": dict(self.events),
            "databases": [
                {"name": d.name, "state": d.state, "since": d.since, "outbox": d.outbox,
                 "oldest": d.oldest} for d in self.databases],
            **({"workers": [{"index": w.index, "pid": w.pid, "state": w.state,
                             "restarts": w.restarts} for w in self.workers]}
               if self.workers else {}),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Health:
        """Rebuild what :meth:`to_json` wrote; ValueError when ``data`` is not that shape."""
        try:
            return cls(
                live=_typed(data["live"], bool),
                ready=_typed(data["ready"], bool),
                brokers=tuple(
                    BrokerHealth(_typed(b["name"], str), _typed(b["state"], str),
                                 float(_typed(b["since"], int | float)),
                                 _typed(b.get("address", ""), str))
                    for b in data["brokers"]
                ),
                listeners=tuple(
                    ListenerHealth(_typed(lh["name"], str), _typed(lh["members"], int),
                                   _typed(lh["subscribed"], int), _typed(lh["in_flight"], int),
                                   _typed(lh["processed"], int), _typed(lh.get("slots", 0), int),
                                   tuple(StuckHandler(_typed(h["message_id"], str),
                                                      float(_typed(h["running_for"], int | float)))
                                         for h in lh.get("stuck", ())),
                                   _typed(lh.get("paused", False), bool),
                                   _typed(lh.get("redelivered", 0), int),
                                   _typed(lh.get("to_error_destination", 0), int),
                                   _typed(lh.get("destination", ""), str),
                                   _typed(lh.get("mode", ""), str),
                                   tuple(MemberHealth(_typed(m["broker"], str),
                                                      _typed(m["destination"], str),
                                                      _typed(m["subscribed"], bool),
                                                      _typed(m.get("subscription", ""), str))
                                         for m in lh.get("member_states", ())),
                                   _seconds(lh.get("latency_p50")),
                                   _seconds(lh.get("latency_p99")),
                                   _typed(lh.get("already_processed", 0), int))
                    for lh in data["listeners"]
                ),
                events={_typed(k, str): _typed(v, int) for k, v in data["events"].items()},
                workers=tuple(
                    WorkerHealth(_typed(w["index"], int), _typed(w["pid"], int),
                                 _typed(w["state"], str), _typed(w["restarts"], int))
                    for w in data.get("workers", ())
                ),
                databases=tuple(
                    DatabaseHealth(_typed(d["name"], str), _typed(d["state"], str),
                                   float(_typed(d["since"], int | float)),
                                   _typed(d["outbox"], int),
                                   _seconds(d["oldest"]))
                    for d in data.get("databases", ())
                ),
                stage=_typed(data.get("stage", RUNNING), str),
                identity=ContainerIdentity(
                    _typed(data.get("app", ""), str), _typed(data.get("server", ""), str),
                    _typed(data.get("host", ""), str), _typed(data.get("pid", 0), int),
                    _typed(data.get("version", ""), str),
                    float(_typed(data.get("started", 0.0), int | float))),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not an mdb health snapshot: {exc!r}") from None


def _seconds(value: Any) -> float | None:
    return None if value is None else float(_typed(value, int | float))


def _typed(value: Any, kind: Any) -> Any:
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise TypeError(f"{value!r} is not {kind}")
    return value
