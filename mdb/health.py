"""A snapshot of a container's health: its brokers, databases, listeners and (under
``mdb run --workers N``) workers, taken on its event loop, in JSON and back. Served over HTTP
by ``mdb.http.routes`` (``/health/live``, ``/health/ready``, ``/status``), read back by
``mdb.http.client`` (``mdb status``), printed by ``mdb.report``."""

from __future__ import annotations

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


@dataclass(frozen=True)
class Health:
    """A snapshot of the container, taken on its event loop (or of a server of several worker
    processes, taken by their supervisor: then ``workers`` lists them)."""

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

    def unready(self) -> dict[str, object]:
        """Why the container is not ready: the brokers and databases not up, the listeners
        short of members, the listeners whose every slot is stuck in a handler past its
        ``handler_timeout``."""
        return {
            "brokers_down": [b.name for b in self.brokers if b.state != "up"],
            "databases_down": [d.name for d in self.databases if d.state != "up"],
            "listeners_short": [
                {"name": lh.name, "subscribed": lh.subscribed, "members": lh.members}
                for lh in self.listeners if lh.subscribed < lh.members
            ],
            "listeners_stuck": [
                {"name": lh.name, "stuck": len(lh.stuck), "slots": lh.slots}
                for lh in self.listeners if lh.all_stuck
            ],
        }

    def to_json(self) -> dict[str, object]:
        return {
            "live": self.live,
            "ready": self.ready,
            "brokers": [
                {"name": b.name, "state": b.state, "since": b.since, "address": b.address}
                for b in self.brokers],
            "listeners": [
                {"name": lh.name, "members": lh.members, "subscribed": lh.subscribed,
                 "in_flight": lh.in_flight, "processed": lh.processed, "slots": lh.slots,
                 "stuck": [{"message_id": h.message_id, "running_for": h.running_for}
                           for h in lh.stuck]}
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
                                         for h in lh.get("stuck", ())))
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
                                   None if d["oldest"] is None
                                   else float(_typed(d["oldest"], int | float)))
                    for d in data.get("databases", ())
                ),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not an mdb health snapshot: {exc!r}") from None


def _typed(value: Any, kind: Any) -> Any:
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise TypeError(f"{value!r} is not {kind}")
    return value
