"""``ManualClock``: a ``mdb.clock.Clock`` that moves only when told to, so that a redelivery
delay of a minute passes at once in a test."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import anyio


@dataclass(order=True)
class _Timer:
    due: float
    order: int
    scope: anyio.CancelScope = field(compare=False)
    sleeping: bool = field(compare=False)


class ManualClock:
    """Time that passes only through ``advance`` (or ``advance_to_next``).

    ``sleep`` and ``deadline`` register timers; advancing past a timer's due time wakes it.
    ``sleepers`` counts the tasks in ``sleep`` (a pool slot pausing before a redelivery);
    ``on_change`` is called whenever a timer is added, so a waiter can re-check. Use it from
    the event loop's thread only.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._timers: list[_Timer] = []
        self._order = itertools.count()
        self.on_change: Callable[[], None] = lambda: None

    def now(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        with self._timer(seconds, sleeping=True):
            await anyio.sleep_forever()

    @contextmanager
    def deadline(self, seconds: float) -> Iterator[anyio.CancelScope]:
        with self._timer(seconds, sleeping=False) as scope:
            yield scope

    @contextmanager
    def _timer(self, seconds: float, *, sleeping: bool) -> Iterator[anyio.CancelScope]:
        timer = _Timer(self._now + max(seconds, 0.0), next(self._order), anyio.CancelScope(),
                       sleeping)
        if seconds <= 0:
            timer.scope.cancel()
        self._timers.append(timer)
        self.on_change()
        try:
            with timer.scope:
                yield timer.scope
        finally:
            self._timers.remove(timer)

    @property
    def sleepers(self) -> int:
        """Tasks waiting in ``sleep`` now."""
        return sum(t.sleeping for t in self._timers if not t.scope.cancel_called)

    @property
    def next_due(self) -> float | None:
        """When the next timer is due, or None when there is none."""
        waiting = [t.due for t in self._timers if not t.scope.cancel_called]
        return min(waiting) if waiting else None

    def advance(self, seconds: float) -> None:
        """Move the time on by ``seconds``, waking every timer due by then (they run at the
        next checkpoint of the caller)."""
        if seconds < 0:
            raise ValueError("time only moves forward")
        self._now += seconds
        for timer in sorted(self._timers):
            if timer.due <= self._now:
                timer.scope.cancel()

    def advance_to_next(self) -> bool:
        """Move the time to the next timer's due time and wake it; False when there is none."""
        due = self.next_due
        if due is None:
            return False
        self.advance(max(due - self._now, 0.0))
        return True
