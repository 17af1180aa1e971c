"""Availability events: what the application can observe about its brokers and members.

The JMS exception listener and WebLogic's destination availability listener in one place. The
container emits an event when a broker's state changes (not once per connection: a broker
serves a container over several), logs it, counts it, and calls every registered callback::

    from mdb import BrokerEvent, on_event

    @on_event
    def page_someone(event: BrokerEvent) -> None:
        if event.kind is EventKind.BROKER_FAILED: ...

Callbacks run on the container's event loop and must not block; an exception in one is logged
and does not reach the container.
"""

from __future__ import annotations

import enum
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from mdb.messages.topology import Member

log = logging.getLogger("mdb.events")


class EventKind(enum.StrEnum):
    CONNECTION_LOST = "connection-lost"
    """The broker stopped answering (killed, hung past the heartbeat, network)."""
    CONNECTION_RESTORED = "connection-restored"
    """A connection to the broker is open again; its subscriptions are being re-created."""
    BROKER_FAILED = "broker-failed"
    """The broker has been unreachable for its ``reconnect_give_up_after``; retries go on."""
    MEMBER_UNAVAILABLE = "member-unavailable"
    """A member of a destination cannot be consumed or sent to (its broker is down, or it
    left the topology)."""
    MEMBER_AVAILABLE = "member-available"
    """A member is back (its broker reconnected, or it joined the topology)."""


@dataclass(frozen=True, slots=True)
class BrokerEvent:
    kind: EventKind
    broker: str
    member: Member | None = None
    detail: str = ""
    at: float = field(default_factory=time.time)

    def __str__(self) -> str:
        what = f"member {self.member}" if self.member else f"broker {self.broker}"
        if self.detail.startswith(f"{what} "):
            # A cause that names its broker (an adapter's error, also shown alone) says it.
            return f"{self.kind}: {self.detail}"
        return f"{self.kind}: {what}" + (f" ({self.detail})" if self.detail else "")


_LEVELS = {
    EventKind.CONNECTION_LOST: logging.WARNING,
    EventKind.CONNECTION_RESTORED: logging.INFO,
    EventKind.BROKER_FAILED: logging.ERROR,
    EventKind.MEMBER_UNAVAILABLE: logging.WARNING,
    EventKind.MEMBER_AVAILABLE: logging.INFO,
}

Callback = Callable[[BrokerEvent], None]
C = TypeVar("C", bound=Callback)

ON_EVENT_ATTRIBUTE = "__mdb_on_event__"


def on_event(func: C) -> C:
    """Mark ``func`` to be called with every ``BrokerEvent`` of a container that ``mdb run``
    starts with the function's module. Returns it unchanged."""
    setattr(func, ON_EVENT_ATTRIBUTE, True)
    return func


class Events:
    """Emits events: logs them, counts them by kind, calls the callbacks."""

    def __init__(self, callbacks: list[Callback] | None = None) -> None:
        self.callbacks: list[Callback] = list(callbacks or [])
        self.counts: Counter[EventKind] = Counter()

    def emit(self, event: BrokerEvent, *, quiet: bool = False) -> None:
        """Count, log and call back ``event``; ``quiet``: log it at DEBUG only, because a line
        already logged says it (a broker's outage names the members it affects)."""
        self.counts[event.kind] += 1
        log.log(logging.DEBUG if quiet else _LEVELS[event.kind], "%s", event)
        for callback in self.callbacks:
            try:
                callback(event)
            except Exception:  # the application's code must not take the container down
                log.exception("event callback %r failed on %s", callback, event)
