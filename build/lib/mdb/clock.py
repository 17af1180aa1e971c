"""The clock of the waits a test may want to skip: the pause before a redelivery, and a memory
broker holding a delayed message back.

Everything that waits for time to pass *as part of the delivery contract* (not timeouts on the
network) asks ``current()``: ``now()`` for the time, ``sleep`` to wait, ``deadline`` to wait
for something else but at most that long. In production it is ``SYSTEM``, the event loop's
monotonic time. ``mdb.testing`` installs a clock it drives (``use``), so that a test of
``Redelivery(delay=60)`` takes no minute.

The clock is one per process, not per container: the container and the memory broker it talks
to must agree on the time.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Protocol

import anyio


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a monotonic scale (only differences mean something)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Return once ``seconds`` passed on this clock (at once for 0 or less)."""
        ...

    def deadline(self, seconds: float) -> AbstractContextManager[anyio.CancelScope]:
        """A cancel scope cancelled once ``seconds`` passed on this clock: what runs inside
        stops waiting then, as in ``anyio.move_on_after``."""
        ...


class SystemClock:
    """The event loop's time: ``anyio.current_time``, ``anyio.sleep``, ``anyio.move_on_after``."""

    def now(self) -> float:
        return anyio.current_time()

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(max(seconds, 0.0))

    def deadline(self, seconds: float) -> AbstractContextManager[anyio.CancelScope]:
        return anyio.move_on_after(max(seconds, 0.0))


SYSTEM = SystemClock()
_current: Clock = SYSTEM


def current() -> Clock:
    """The clock in use in this process."""
    return _current


@contextmanager
def use(clock: Clock) -> Iterator[Clock]:
    """Use ``clock`` until the block exits, then the one before. Install it before starting
    the containers and brokers that must keep its time."""
    global _current
    before, _current = _current, clock
    try:
        yield clock
    finally:
        _current = before
