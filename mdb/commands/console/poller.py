"""The console's view of the fleet: every container's ``/status``, read every ``refresh``
seconds, and the last ``HISTORY`` seconds of each listener's counters, from which the pages draw
its rates. A container that does not answer is kept with why (and its last answer), never
holding up the others: each is read in a thread of its own, within ``refresh`` seconds."""

from __future__ import annotations

import itertools
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import anyio

from mdb.observability.health import Health
from mdb.serving.http.client import NotLive, Unreachable, fetch_status

HISTORY = 15 * 60.0
"""Seconds of counters kept per listener: the charts' width."""
MAX_LISTENERS = 100
"""Listeners of one container whose counters are kept: a bound on what a container's answer can
make the console hold."""
READERS = 16
"""Containers read at once."""


@dataclass(frozen=True)
class Reading:
    """A listener's counters at one time."""

    at: float
    processed: int
    redelivered: int
    to_error_destination: int


@dataclass(frozen=True)
class Rate:
    """Messages a second over the interval ending at ``at``."""

    at: float
    processed: float
    redelivered: float
    to_error_destination: float


@dataclass
class Seen:
    """One container as the console last read it."""

    url: str
    health: Health | None = None
    """Its last answer (perhaps from before it stopped answering); None until it answered."""
    error: str = ""
    """Why its last read got no answer ("" when it answered)."""
    read_at: float | None = None
    """``time.time()`` of its last read."""
    down_since: float | None = None
    """``time.time()`` of the first read of the run of reads without an answer."""

    @property
    def down(self) -> bool:
        return bool(self.error)


Fetch = Callable[[str, float], Health]


class Fleet:
    """The containers at ``urls``, read every ``refresh`` seconds by :meth:`run`."""

    def __init__(self, urls: Sequence[str], refresh: float, *, fetch: Fetch = fetch_status,
                 clock: Callable[[], float] = time.time) -> None:
        self.refresh = refresh
        self.seen = [Seen(url) for url in urls]
        self._fetch = fetch
        self.clock = clock
        self._readers = anyio.CapacityLimiter(READERS)
        self._length = math.ceil(HISTORY / refresh) + 1
        self._history: dict[tuple[str, str], deque[Reading]] = {}

    async def run(self) -> None:
        """Read every container every ``refresh`` seconds, until cancelled."""
        while True:
            began = anyio.current_time()
            await anyio.sleep_until(began + self.refresh)
            await self.read_all()

    async def read_all(self) -> None:
        async with anyio.create_task_group() as group:
            for index in range(len(self.seen)):
                group.start_soon(self.read, index)

    async def read(self, index: int) -> None:
        """Read the container at ``index`` of ``seen`` now."""
        seen = self.seen[index]
        try:
            # A container that drips its answer is cut off too: the socket's timeout is per read.
            with anyio.fail_after(2 * self.refresh):
                health = await anyio.to_thread.run_sync(
                    self._fetch, seen.url, self.refresh, limiter=self._readers,
                    abandon_on_cancel=True)
        except (NotLive, Unreachable, TimeoutError) as exc:
            now = self.clock()
            seen.error = (f"no answer within {2 * self.refresh:g} s"
                          if isinstance(exc, TimeoutError) else str(exc) or type(exc).__name__)
            seen.read_at, seen.down_since = now, seen.down_since or now
            return
        now = self.clock()
        seen.health, seen.error, seen.read_at, seen.down_since = health, "", now, None
        listeners = health.listeners[:MAX_LISTENERS]
        names = {listener.name for listener in listeners}
        for gone in [k for k in self._history if k[0] == seen.url and k[1] not in names]:
            del self._history[gone]
        for listener in listeners:
            kept = self._history.setdefault((seen.url, listener.name),
                                            deque(maxlen=self._length))
            kept.append(Reading(now, listener.processed, listener.redelivered,
                                listener.to_error_destination))

    def rates(self, url: str, listener: str) -> list[Rate]:
        """The listener's rates between consecutive reads over the last ``HISTORY`` seconds; a
        counter that went down (the container restarted) counts from zero."""
        kept = list(self._history.get((url, listener), ()))
        return [Rate(b.at, _rate(a.processed, b.processed, b.at - a.at),
                     _rate(a.redelivered, b.redelivered, b.at - a.at),
                     _rate(a.to_error_destination, b.to_error_destination, b.at - a.at))
                for a, b in itertools.pairwise(kept) if b.at > a.at]


def _rate(before: int, after: int, seconds: float) -> float:
    return (after - before if after >= before else after) / seconds
