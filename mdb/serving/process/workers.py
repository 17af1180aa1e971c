"""What the supervisor of ``mdb run --workers N`` knows of each worker (``Worker``:
the process now in it, its state and its history of ends and restarts), and how a line names
several (``named``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import anyio
from anyio.abc import Process


@dataclass
class Worker:
    """One worker, 1 to N: the process now in it (a restart's takes its place), and its history."""

    index: int
    process: Process | None = None
    state: str = "starting"
    health_url: str | None = None
    restarts: int = 0
    renewing: bool = False  # its worker was asked to end by SIGHUP, to be started again at once
    # For SIGHUP: set once the worker being started is ready (start_status None) or has ended
    # before it was (its exit status).
    started: anyio.Event | None = None
    start_status: int | None = None
    failed_starts: int = 0  # ends before ready, in a row
    ends: deque[float] = field(default_factory=deque)  # monotonic times of recent ends
    wake: anyio.Event | None = None  # ends its pause, or its being given up, at once

    @property
    def pid(self) -> int:
        return self.process.pid if self.process is not None else 0


def settle(place: Worker, status: int | None) -> None:
    """Tell a SIGHUP round waiting for the worker of ``place`` that it is ready (None) or
    ended with ``status`` before it was."""
    if place.started is not None:
        place.start_status = status
        place.started.set()
        place.started = None


def named(indexes: Sequence[int], one: str, several: str, none: str) -> str:
    """``worker 2 <one>``, ``workers 2, 3 <several>`` or ``none``, for a line."""
    if not indexes:
        return none
    if len(indexes) == 1:
        return f"worker {indexes[0]} {one}"
    return f"workers {', '.join(map(str, indexes))} {several}"
