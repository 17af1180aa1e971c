"""What the ``mdb`` command prints: the plan of a container's subscriptions (``mdb run``,
``mdb subscriptions``), a container's health (``mdb status``) and its status line. Text from
values, except ``print_status``, which prints the status line as it changes."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import TextIO

import anyio

from mdb.config.settings import Settings
from mdb.observability.health import STARTING, STOPPING, Health, ListenerHealth
from mdb.observability.redaction import printable, redact_url
from mdb.observability.telemetry import Stats
from mdb.routing.brokers import connections_for
from mdb.routing.planning import Planned, slots_per_broker


def plan_table(settings: Settings, plans: Sequence[Planned]) -> str:
    """Listeners → members → subscriptions → brokers, as ``mdb run`` and ``mdb subscriptions``
    print it (``plans`` from ``planning.plan_listeners``): one row per subscription (every
    pool slot of the row attaches to it), with the broker's addresses (redacted, in the order
    a reconnect tries them) and the connections a container opens to it."""
    slots = slots_per_broker((spec, p) for spec, planned in plans for p in planned)
    rows = [("listener", "destination", "member", "subscription", "kind", "pool", "broker")]
    for spec, planned in plans:
        for p in planned:
            kind = ("shared" if p.shared else "own") + (
                ", durable" if p.request.name and p.request.durable else "")
            rows.append((spec.name, str(spec.destination), str(p.request.destination),
                         p.name, kind, str(spec.options.pool),
                         f"{p.broker} ({_addresses(settings, p.broker)}, "
                         f"{_connections(connections_for(slots[p.broker]))})"))
    return _table(rows)


def _connections(count: int) -> str:
    return f"{count} connection{'' if count == 1 else 's'}"


def _addresses(settings: Settings, broker: str) -> str:
    return " | ".join(map(redact_url, settings.brokers[broker].addresses))


# The status line's counters after the two it always shows: shown only once non-zero.
_RARE_COUNTERS = (
    ("redelivered", "redelivered"),
    ("to_error_destination", "moved to an error destination"),
    ("rolled_back", "not settled"),
    ("filtered", "not selected"),
    ("dead_lettered", "stuck, to the broker's dead-letter queue"),
    ("kept", "stuck, kept on its queue"),
    ("already_processed", "already processed (a copy not run again)"),
)


def status_line(stats: Iterable[Stats]) -> str:
    """The container's counters, summed over its listeners: ``mdb run``'s status line. It
    always says what was processed and is in flight; the other counters once non-zero."""
    every = list(stats)
    shown = [f"processed {sum(s.processed for s in every)}",
             f"in flight {sum(s.in_flight for s in every)}"]
    for field, label in _RARE_COUNTERS:
        count = sum(getattr(s, field) for s in every)
        if count:
            shown.append(f"{label} {count}")
    return ", ".join(shown)


def status_report(health: Health, url: str, now: float | None = None) -> str:
    """What ``mdb status`` prints: a headline and why, then brokers, listeners, the databases
    of exactly-once listeners (their outbox), the handlers stuck past their
    ``handler_timeout``, the workers (``mdb run --workers N``), event
    counts. Each value's control characters are escaped: a message id is a producer's, and
    the snapshot whatever the endpoint answered."""
    now = time.time() if now is None else now
    lines = [f"mdb at {url}: {'live' if health.live else 'NOT LIVE'}, "
             f"{'ready' if health.ready else 'NOT READY'}"]
    reasons = unready_reasons(health)
    if reasons and not health.ready:
        lines.append(f"  because {'; '.join(reasons)}")
    lines = [printable(line) for line in lines]
    brokers = [("broker", "state", "since", "address")] + [
        (b.name, b.state, f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(b.since))} "
                          f"({_ago(now - b.since)} ago)", b.address)
        for b in health.brokers]
    # As on the status line, the copies settled unrun once there are any: an exactly-once
    # listener's count, which tells a broker's redeliveries from work done twice.
    copies = any(lh.already_processed for lh in health.listeners)
    listeners = [("listener", "subscribed", "in flight", "processed",
                  *(("already processed",) if copies else ()), "handler p50/p99")] + [
        (lh.name, f"{lh.subscribed}/{lh.members}{', paused' if lh.paused else ''}",
         str(lh.in_flight), str(lh.processed),
         *((str(lh.already_processed),) if copies else ()), latency_text(lh))
        for lh in health.listeners]
    events = printable(", ".join(f"{kind} {count}"
                                 for kind, count in sorted(health.events.items())))
    parts = [_table(brokers), _table(listeners)]
    if health.databases:
        parts.append(_table([("database", "state", "since", "outbox", "oldest waits")] + [
            (d.name, d.state, f"{_ago(now - d.since)} ago", str(d.outbox),
             "-" if d.oldest is None else _ago(d.oldest))
            for d in health.databases]))
    stuck = [(lh.name, h.message_id, _ago(h.running_for)) for lh in health.listeners
             for h in lh.stuck]
    if stuck:
        parts.append(_table([("stuck handler", "message", "running for"), *stuck]))
    if health.workers:
        parts.append(_table([("worker", "pid", "state", "restarts")] + [
            (str(w.index), str(w.pid or "-"), w.state, str(w.restarts))
            for w in health.workers]))
    return "\n\n".join(["\n".join(lines), *parts, f"events: {events or 'none'}"])


_STAGES = {STARTING: "it is starting: connecting to its brokers, subscribing, starting the "
                     "application's resources",
           STOPPING: "it is stopping: the messages in flight finish, no new one is taken"}


def unready_reasons(health: Health) -> list[str]:
    """What keeps ``health`` from being ready, in words (``Health.unready``): starting or
    stopping, the brokers and databases not up, the listeners short of members or stuck, the
    workers not ready."""
    reasons = [_STAGES[health.stage]] if health.stage in _STAGES else []
    reasons += [f"broker {b.name} is {b.state}" for b in health.brokers if b.state != "up"]
    reasons += [f"database {d.name} is {d.state}" for d in health.databases if d.state != "up"]
    reasons += [f"listener {lh.name} has {lh.subscribed} of {lh.members} members subscribed"
                for lh in health.listeners if lh.subscribed < lh.members and not lh.paused]
    reasons += [f"listener {lh.name} has its one slot stuck in a handler past its "
                "handler_timeout" if lh.slots == 1 else
                f"listener {lh.name} has all {lh.slots} slots stuck in handlers past their "
                "handler_timeout" for lh in health.listeners if lh.all_stuck]
    reasons += [f"worker {w.index} is {w.state}" for w in health.workers if w.state != "ready"]
    return reasons


def _table(rows: Sequence[Sequence[str]]) -> str:
    rows = [[printable(cell) for cell in row] for row in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)
    return "\n".join(line.rstrip() for line in lines)


def latency_text(listener: ListenerHealth) -> str:
    """A listener's handler latency, p50/p99, in milliseconds; "-" before any message."""
    p50, p99 = listener.latency_p50, listener.latency_p99
    if p50 is None or p99 is None:
        return "-"
    return f"{p50 * 1000:.3g}/{p99 * 1000:.3g} ms"


def _ago(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"


async def print_status(line: Callable[[], str], interval: float, out: TextIO,
                       label: str = "mdb") -> None:
    """Every ``interval`` seconds print ``<label>: <line()>`` to ``out``: every time on a terminal,
    where it is watched; elsewhere (a log collector) only when the line changed, so an idle
    container's log does not grow by a line every few seconds."""
    last = None
    terminal = out.isatty()
    while True:
        await anyio.sleep(interval)
        now = line()
        if terminal or now != last:
            print(f"{label}: {now}", file=out, flush=True)
        last = now
