"""Where the messages a ``Runner`` follows are: which listeners must still finish each one, and
the text of a ``NotSettled`` saying so. Pure: reads the tracker, the running containers and the
clock, waits on nothing."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from mdb.container.container import Container
from mdb.testing.manual_clock import ManualClock
from mdb.testing.tracker import Tracker


def expected_subscriptions(running: Sequence[Container], destination: str) -> set[str | None]:
    """The subscriptions of the running listeners a message sent to ``destination`` goes to
    (None for a queue); one with a selector is left out (it may not select it)."""
    names: set[str | None] = set()
    for container in running:
        for deployed in container.deployed:
            if str(deployed.spec.destination) != destination:
                continue
            for planned in deployed.planned:
                if planned.selector is None and not deployed.spec.options.selector:
                    names.add(planned.request.name)
    return names


def is_done(tracker: Tracker, running: Sequence[Container], message_id: str) -> bool:
    """Every running listener of every destination the message was sent to is done with it
    (with each copy of it, when it was sent again)."""
    attempts = tracker.attempts.get(message_id, [])
    copies = tracker.copies.get(message_id, 1)
    for destination in tracker.expected.get(message_id, []):
        finished = Counter(a.subscription for a in attempts if a.destination == destination
                           and a.final)
        if any(finished[s] < copies for s in expected_subscriptions(running, destination)):
            return False
    return True


def describe(tracker: Tracker, running: Sequence[Container], clock: ManualClock,
             pending: list[str], timeout: float) -> str:
    """Where each of the ``pending`` messages is, for a wait that ended after ``timeout``
    seconds (0: one that failed at once)."""
    lines = [f"not settled within {timeout} s (real time):" if timeout else "not settled:"]
    for message_id in pending:
        for destination in tracker.expected.get(message_id, []):
            subscriptions = expected_subscriptions(running, destination)
            seen = [a for a in tracker.attempts.get(message_id, [])
                    if a.destination == destination]
            lines.append(f"- message {message_id} sent to {destination}:")
            if not subscriptions:
                lines.append("    no running listener serves it")
            for attempt in seen:
                lines.append(f"    {attempt}")
            if not seen:
                lines.append("    no delivery of it ended yet")
    busy = sum(d.stats.in_flight for container in running for d in container.deployed)
    if busy:
        lines.append(f"handlers holding a delivery now: {busy}")
    if clock.next_due is not None:
        lines.append(f"the clock is at {clock.now():g} s, next timer due at "
                     f"{clock.next_due:g} s ({clock.sleepers} handlers sleeping)")
    return "\n".join(lines)
