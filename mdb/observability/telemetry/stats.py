"""``Stats``: what one listener did in this process, counted once, where it happens. The
status line, ``/status``, the testing kit and the ``mdb.listener.messages`` metric
(``mdb.observability.telemetry.instruments``) all read these counters; none keeps a count of its
own."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from mdb.observability.telemetry.latency import Latencies


@dataclass(eq=False)
class Stats:
    """Counters of one listener in this process: ``in_flight`` now, the others (its
    outcomes, ``OUTCOMES``) since it started. Compared and hashed as the one object it is
    (``mdb.observability.telemetry.instruments.watch_listener`` keeps it by itself)."""

    processed: int = 0
    redelivered: int = 0
    to_error_destination: int = 0
    rolled_back: int = 0
    in_flight: int = 0
    damaged: int = 0  # arrived as an inconsistent frame; moved to an error destination unseen
    filtered: int = 0  # not selected by a topic listener's selector, settled unseen
    dead_lettered: int = 0  # stuck: handed to the broker's own dead-letter queue
    kept: int = 0  # stuck, where the broker has no such queue: times one was kept on its queue
    # A copy settled without the handler: the exactly-once inbox knew it, or its delivery attempt
    # was settled or overtaken (mdb.delivery.strikes).
    already_processed: int = 0
    # How long its handler took on its recent messages: a window, not a count of outcomes.
    latencies: Latencies = field(default_factory=Latencies)


OUTCOMES = tuple(f.name for f in fields(Stats) if f.name not in ("in_flight", "latencies"))
"""The outcomes a listener counts (the ``mdb.outcome`` of ``mdb.listener.messages``)."""
