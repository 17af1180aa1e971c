"""The durable subscriptions of the fleet (docs/console.md, "Abandoned subscriptions"): each
one a container reported on a member of a topic, held by the containers that answer and report
it, or **abandoned** when only containers that no longer answer did; and the cleanup of an
abandoned one, through the implementation ``mdb subscriptions --delete`` runs
(``mdb.commands.subscriptions``).

Over STOMP no broker lists its durable subscriptions, so what is shown is derived from what the
containers reported since the console started: a subscription whose every container stopped
before that is not known here. Every value is a container's answer and goes through
``escape``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from http import HTTPStatus

from mdb.commands.console.html import escape
from mdb.commands.console.pages import Fragment
from mdb.commands.console.poller import Seen
from mdb.errors import BrokerError, ConfigurationError

Delete = Callable[[str, str, str], Awaitable[None]]
"""Delete a durable subscription: (its broker, its topic member, its name); ``BrokerError``
where the broker refuses, ``ConfigurationError`` for a broker the console's settings lack."""


@dataclass(frozen=True)
class DurableSubscription:
    """One durable subscription on one member of a topic, as the fleet reported it."""

    broker: str
    destination: str
    """The member, ``topic:NAME`` on ``broker``."""
    name: str
    listener: str
    holders: tuple[str, ...]
    """The containers answering now whose listener has it: it is theirs."""
    reporters: tuple[str, ...]
    """Every container that reported it, answering or not."""

    @property
    def key(self) -> tuple[str, str, str]:
        return self.broker, self.destination, self.name

    @property
    def abandoned(self) -> bool:
        """No running container holds it: the broker keeps its messages for nobody."""
        return not self.holders


def durable_subscriptions(seen: Sequence[Seen]) -> list[DurableSubscription]:
    """The durable subscriptions in every container's last answer, a container that does not
    answer any more included (its last answer is the only word of what it left behind)."""
    found: dict[tuple[str, str, str], tuple[str, list[str], list[str]]] = {}
    for s in seen:
        for lh in s.health.listeners if s.health is not None else ():
            for member in lh.member_states:
                if not member.subscription:
                    continue
                _, holders, reporters = found.setdefault(
                    (member.broker, member.destination, member.subscription), (lh.name, [], []))
                reporters.append(s.url)
                if not s.down:
                    holders.append(s.url)
    return [DurableSubscription(*key, listener, tuple(holders), tuple(reporters))
            for key, (listener, holders, reporters) in sorted(found.items())]


class Subscriptions:
    """The fleet's durable subscriptions less those the console deleted (which the last answer
    of a stopped container still names), and their cleanup through ``delete``."""

    def __init__(self, delete: Delete) -> None:
        self._delete = delete
        self._deleted: set[tuple[str, str, str]] = set()

    def of(self, seen: Sequence[Seen]) -> list[DurableSubscription]:
        every = durable_subscriptions(seen)
        # One held again was made anew by its container: it is shown, and may be deleted again.
        self._deleted -= {s.key for s in every if not s.abandoned}
        return [s for s in every if s.key not in self._deleted]

    async def clean_up(self, seen: Sequence[Seen], broker: str, destination: str,
                       name: str) -> Fragment:
        """Delete the subscription if it is abandoned; the page saying what became of it."""
        what = f"subscription {name} of {destination} on {broker}"
        known = next((s for s in self.of(seen) if s.key == (broker, destination, name)), None)
        if known is None:
            return Fragment("Not found", f"<p>No abandoned {escape(what)} is known.</p>",
                            HTTPStatus.NOT_FOUND)
        if not known.abandoned:
            return Fragment("Not abandoned", f'<p class="error">{escape(what)} is held by '
                            f"{escape(', '.join(known.holders))}: not deleted.</p>",
                            HTTPStatus.CONFLICT)
        try:
            await self._delete(broker, destination, name)
        except (BrokerError, ConfigurationError) as exc:
            return Fragment("Not deleted", f'<p class="error">{escape(what)}: {escape(exc)}</p>',
                            HTTPStatus.BAD_GATEWAY)
        self._deleted.add(known.key)
        return Fragment("Deleted", f"<p>Deleted {escape(what)}, with the messages it held. "
                        '<a href="/#subscriptions">Back to the fleet</a></p>')


def subscriptions_body(subscriptions: Sequence[DurableSubscription],
                       cleanup: Callable[[DurableSubscription], str]) -> str:
    """The table of durable subscriptions; ``cleanup`` gives an abandoned one's form."""
    if not subscriptions:
        return '<p class="note">No durable subscription: no container reported one.</p>'
    rows = []
    for s in subscriptions:
        state = (f'<span class="down">abandoned</span> <span class="why">last reported by '
                 f"{escape(', '.join(s.reporters))}</span>{cleanup(s)}" if s.abandoned
                 else f'<span class="up">held</span> by {escape(", ".join(s.holders))}')
        rows.append(f'<tr class="subscription" data-name="{escape(s.name)}" '
                    f'data-abandoned="{str(s.abandoned).lower()}"><td>{escape(s.name)}</td>'
                    f"<td>{escape(s.destination)} on {escape(s.broker)}</td>"
                    f"<td>{escape(s.listener)}</td><td>{state}</td></tr>")
    heading = "".join(f"<th>{h}</th>" for h in ("subscription", "member", "listener", "state"))
    return f"<table><tr>{heading}</tr>\n" + "\n".join(rows) + "</table>"
