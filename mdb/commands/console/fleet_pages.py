"""The overview page: the fleet (one row per container), its listeners (one row per container
running each, with its members, pool, handler latency, rates and pause state), its durable
subscriptions and its exactly-once databases. Every value is a container's answer and goes
through ``escape``."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from mdb.commands.console.charts import rate_chart
from mdb.commands.console.html import clock, escape
from mdb.commands.console.pages import Fragment
from mdb.commands.console.poller import Fleet, Seen
from mdb.container.report import latency_text
from mdb.observability.health import BrokerHealth, Health, ListenerHealth, MemberHealth

PAUSED = '<span class="paused">paused</span>'
Actions = Callable[[int, ListenerHealth], str]
"""The forms of a listener's row (pause or resume), given its container's index."""


def overview(fleet: Fleet, now: float, actions: Actions, subscriptions: str) -> Fragment:
    """The fleet, its listeners, its durable ``subscriptions`` (their table, made by
    ``subscription_pages``) and its databases, as ``fleet`` last read them."""
    answered = [(i, s, s.health) for i, s in enumerate(fleet.seen)
                if s.health is not None and not s.down]
    body = "\n".join((
        '<h2 id="fleet">Fleet</h2>', _fleet(fleet.seen),
        '<h2 id="listeners">Listeners</h2>', _listeners(fleet, answered, now, actions),
        '<h2 id="subscriptions">Durable subscriptions</h2>', subscriptions,
        '<h2 id="databases">Exactly-once databases</h2>', _databases(answered)))
    return Fragment("Overview", body)


def _table(head: Sequence[str], rows: Sequence[str], empty: str) -> str:
    if not rows:
        return f'<p class="note">{escape(empty)}</p>'
    heading = "".join(f"<th>{escape(h)}</th>" for h in head)
    return f"<table><tr>{heading}</tr>\n" + "\n".join(rows) + "</table>"


def _fleet(seen: Sequence[Seen]) -> str:
    rows = []
    for index, s in enumerate(seen):
        health = s.health
        if s.down or health is None:
            state = (f'<span class="down">down</span> <span class="why">{escape(s.error)}; '
                     f"since {escape(clock(s.down_since))}</span>" if s.down
                     else '<span class="note">not read yet</span>')
            rows.append(f'<tr class="container" id="container-{index}" data-state="'
                        f'{"down" if s.down else "unread"}">'
                        f"<td>{escape(s.url)}</td><td colspan=\"9\">{state}</td></tr>")
            continue
        ready = ('<span class="ready">ready</span>' if health.ready else
                 f'<span class="unready">not ready</span> <span class="why">'
                 f"{escape(why_not_ready(health))}</span>")
        who = health.identity
        cells = (who.app, who.server, who.host, who.pid or "", len(health.workers) or 1,
                 clock(who.started or None), who.version, health.stage)
        rows.append(f'<tr class="container" id="container-{index}" data-state="'
                    f'{"ready" if health.ready else "unready"}" data-read-at="{s.read_at}">'
                    f"<td>{escape(s.url)}</td>"
                    + "".join(f"<td>{escape(cell)}</td>" for cell in cells)
                    + f"<td>{ready}</td></tr>")
    return _table(("container", "app", "server", "host", "pid", "workers", "up since",
                   "mdb", "stage", "ready"), rows,
                  "No container: list them in [console] containers.")


def why_not_ready(health: Health) -> str:
    """``Health.unready`` in words."""
    reasons = health.unready()
    said = [word for key, word in (("starting", "starting"), ("stopping", "stopping"))
            if reasons[key]]
    for key, word in (("brokers_down", "brokers down"), ("databases_down", "databases down")):
        names = reasons[key]
        if isinstance(names, list) and names:
            said.append(f"{word}: {', '.join(map(str, names))}")
    short = [lh.name for lh in health.listeners if lh.subscribed < lh.members]
    if short:
        said.append(f"listeners short of members: {', '.join(short)}")
    stuck = [lh.name for lh in health.listeners if lh.all_stuck]
    if stuck:
        said.append(f"listeners stuck in handlers: {', '.join(stuck)}")
    return "; ".join(said) or "no reason given"


def _listeners(fleet: Fleet, answered: Sequence[tuple[int, Seen, Health]], now: float,
               actions: Actions) -> str:
    rows = []
    running = sorted((lh.name, i, s, h, lh) for i, s, h in answered for lh in h.listeners)
    for name, index, seen, health, lh in running:
        members = "".join(f"<li>{_member(m, health.brokers, lh.paused)}</li>"
                          for m in lh.member_states) \
            or f"<li>{lh.subscribed} of {lh.members} subscribed</li>"  # --workers N: summed
        rows.append(
            f'<tr class="listener" data-listener="{escape(name)}" data-container="{index}">'
            f"<td>{escape(name)}</td><td>{escape(seen.url)}</td>"
            f"<td>{escape(lh.destination)}</td><td>{escape(lh.mode)}</td>"
            f'<td><ul class="members">{members}</ul></td>'
            f'<td class="pool">{lh.in_flight}/{lh.slots}</td>'
            f'<td class="in-flight">{lh.in_flight}</td>'
            f'<td class="counts">{lh.processed} processed, {lh.redelivered} redelivered, '
            f"{lh.to_error_destination} to the error destination</td>"
            f'<td class="latency">{escape(latency_text(lh))}</td>'
            f"<td>{rate_chart(fleet.rates(seen.url, name), now)}</td>"
            f'<td class="paused-state" data-paused="{str(lh.paused).lower()}">'
            f"{PAUSED if lh.paused else 'running'}"
            f"{actions(index, lh)}</td></tr>")
    return _table(("listener", "container", "destination", "mode", "members",
                   "pool in use", "in flight", "since start", "handler p50/p99",
                   "rates, 15 minutes", "state"),
                  rows, "No listener: no container answered.")


def _member(member: MemberHealth, brokers: Sequence[BrokerHealth], paused: bool) -> str:
    broker = next((b for b in brokers if b.name == member.broker), None)
    if broker is None or broker.state not in ("up", "down", "failed"):
        state, word = "down", "not connected yet"
    elif broker.state == "down":
        state, word = "reconnecting", f"reconnecting since {clock(broker.since)}"
    elif broker.state == "failed":
        state, word = "failed", f"failed since {clock(broker.since)}"
    elif paused:  # on RabbitMQ its consumer stays subscribed, holding what it has unbegun
        state, word = "paused", "connected, paused"
    elif not member.subscribed:
        state, word = "down", "not subscribed"
    else:
        state, word = "up", "up"
    address = broker.address if broker is not None else ""
    return (f'<span class="member" data-broker="{escape(member.broker)}" '
            f'data-state="{state}">{escape(member.destination)} on {escape(member.broker)} '
            f'({escape(address)}): <span class="{state}">{escape(word)}</span></span>')


def _databases(answered: Sequence[tuple[int, Seen, Health]]) -> str:
    rows = [f'<tr class="database"><td>{escape(d.name)}</td><td>{escape(s.url)}</td>'
            f'<td><span class="{"up" if d.state == "up" else "down"}">{escape(d.state)}'
            f"</span> since {escape(clock(d.since))}</td><td>{d.outbox}</td>"
            f"<td>{'—' if d.oldest is None else f'{d.oldest:.1f} s'}</td></tr>"
            for _, s, h in answered for d in sorted(h.databases, key=lambda d: d.name)]
    return _table(("database", "container", "state", "outbox rows", "oldest waits"), rows,
                  "No exactly-once listener: no database.")
