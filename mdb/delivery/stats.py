"""``Stats``: what one listener did in this process, for the health endpoint and tests."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Stats:
    """Counters of one listener in this process."""

    processed: int = 0
    redelivered: int = 0
    to_error_destination: int = 0
    rolled_back: int = 0
    in_flight: int = 0
    damaged: int = 0  # arrived as an inconsistent frame; moved to an error destination unseen
    filtered: int = 0  # not selected by a topic listener's selector, settled unseen
    dead_lettered: int = 0  # stuck: handed to the broker's own dead-letter queue
    kept: int = 0  # stuck, where the broker has no such queue: times one was kept on its queue
    # A copy settled without the handler: the exactly-once inbox knew it, or its round was
    # settled or overtaken (mdb.delivery.strikes).
    already_processed: int = 0
