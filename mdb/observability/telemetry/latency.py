"""``Latencies``: how long a listener's handler took on its recent messages, for the p50 and
p99 that ``/status``, ``mdb status`` and the console show. A ring of the last ``WINDOW``
durations, written on every message: one store into a list made once, so the delivery path
pays neither an allocation that grows nor a sort; the percentiles are sorted out of it only
when someone reads them."""

from __future__ import annotations

import math

WINDOW = 1024
"""How many recent durations the estimate is over: enough for a p99 of ten values, small
enough to sort on every read of ``/status``."""


class Latencies:
    """The last ``WINDOW`` durations (seconds) of one listener's handler."""

    __slots__ = ("_durations", "_recorded")

    def __init__(self) -> None:
        self._durations = [0.0] * WINDOW
        self._recorded = 0

    def record(self, seconds: float) -> None:
        """One handler call took ``seconds``; the oldest of the window makes room."""
        self._durations[self._recorded % WINDOW] = seconds
        self._recorded += 1

    def percentile(self, fraction: float) -> float | None:
        """The duration ``fraction`` (0.5: the median) of the window's calls took at most
        (nearest rank); None before any call."""
        count = min(self._recorded, WINDOW)
        if not count:
            return None
        ordered = sorted(self._durations[:count])
        return ordered[max(math.ceil(fraction * count) - 1, 0)]
