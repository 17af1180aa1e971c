"""One health snapshot for a server run as workers (``server_health``), made from each worker's
own: counts summed, a broker's and a database's state as the worst worker sees it.
"""

from __future__ import annotations

from collections.abc import Sequence

from mdb.observability.health import (
    RUNNING,
    STOPPING,
    BrokerHealth,
    ContainerIdentity,
    DatabaseHealth,
    Health,
    ListenerHealth,
    WorkerHealth,
)
from mdb.serving.process.workers import Worker

_STATE_ORDER = {"failed": 0, "down": 1, "up": 3}  # a broker's worst state across workers wins


def server_health(places: Sequence[Worker], answers: dict[int, Health | None],
                  stopping: bool, identity: ContainerIdentity | None = None) -> Health:
    """One snapshot for the server from its workers' (``answers`` by place index; None: no
    answer). Counts are summed over the workers that answered; a broker, and a database, is as
    up as its worst worker sees it."""
    workers = []
    for place in places:
        state = place.state
        if place.index in answers:
            answer = answers[place.index]
            state = ("no answer" if answer is None or not answer.live
                     else "ready" if answer.ready else "not ready")
        workers.append(WorkerHealth(place.index, place.pid, state, place.restarts))
    found = [h for h in answers.values() if h is not None]
    brokers: dict[str, BrokerHealth] = {}
    for broker in (b for h in found for b in h.brokers):
        seen = brokers.get(broker.name)
        if seen is None or _STATE_ORDER.get(broker.state, 2) < _STATE_ORDER.get(seen.state, 2):
            brokers[broker.name] = broker
    listeners: dict[str, ListenerHealth] = {}
    for lh in (lh for h in found for lh in h.listeners):
        total = listeners.get(lh.name, ListenerHealth(lh.name, 0, 0, 0, 0))
        listeners[lh.name] = ListenerHealth(
            lh.name, total.members + lh.members, total.subscribed + lh.subscribed,
            total.in_flight + lh.in_flight, total.processed + lh.processed,
            total.slots + lh.slots, total.stuck + lh.stuck, total.paused or lh.paused,
            total.redelivered + lh.redelivered,
            total.to_error_destination + lh.to_error_destination, lh.destination, lh.mode,
            # Percentiles do not add up: the slowest worker's, the figure to worry about.
            latency_p50=_slowest(total.latency_p50, lh.latency_p50),
            latency_p99=_slowest(total.latency_p99, lh.latency_p99),
            already_processed=total.already_processed + lh.already_processed)
    databases: dict[str, DatabaseHealth] = {}  # one database: as the worst worker sees it
    for database in sorted((d for h in found for d in h.databases),
                           key=lambda d: (d.state == "up", -d.outbox)):
        databases.setdefault(database.name, database)
    events: dict[str, int] = {}
    for kind, count in ((k, c) for h in found for k, c in h.events.items()):
        events[kind] = events.get(kind, 0) + count
    live = all(w.state != "no answer" for w in workers)
    ready = not stopping and all(w.state == "ready" for w in workers) and all(
        b.state == "up" for b in brokers.values()) and all(
        d.state == "up" for d in databases.values())
    return Health(live=live, ready=ready, brokers=tuple(brokers.values()),
                  listeners=tuple(listeners.values()), events=events, workers=tuple(workers),
                  databases=tuple(databases.values()), stage=STOPPING if stopping else RUNNING,
                  identity=identity or ContainerIdentity())


def _slowest(seen: float | None, other: float | None) -> float | None:
    return other if seen is None else seen if other is None else max(seen, other)
