"""Heart-beats: what mdb promises and asks in CONNECT (``Heartbeats``), and the rule that a
connection silent for longer than it may be is lost, whatever arrives on it next (``Silence``).

The danger is a silent link (a network partition): the broker drops a connection it has not
heard from and hands its unacknowledged messages, flagged redelivered, to another consumer;
when the link heals, the frames it had written before still arrive. mdb must notice the
silence first, and never process what arrives after such a silence as fresh.

Measured on ActiveMQ 5.17.2 and RabbitMQ 3.10.8 with raw STOMP clients (docs/failover.md):

* To ``CONNECT heart-beat:cx,cy`` both answer ``heart-beat:sx,cx``: they send every ``sx``
  (ActiveMQ: ``cy``; RabbitMQ: ``cy`` in whole seconds, at least 1 s) and expect ``cx``.
* They drop a connection they have heard nothing on at their second check in a row that finds
  nothing: ActiveMQ checks every ``cx`` (its grace multiplier is 1.0), 2 to 3 ``cx`` after the
  last byte it read (2.0-2.7 measured); RabbitMQ checks every ``cx`` in whole seconds, after
  more than 2 of them (2.0-3.0 measured).
* ActiveMQ writes a heart-beat only when it wrote nothing during the last interval: gaps up to
  2 ``sx`` under sporadic traffic (1.97 s at 1 s); RabbitMQ checks every half interval, gaps
  up to 1 ``sx`` (0.94 s at 1 s).

The derivation from the one setting ``heartbeat_ms`` (``H``):

* mdb promises to send every ``H`` (rounded up to the broker's unit, at least its minimum):
  the broker drops a silent mdb 2 to 3 ``H`` after the last byte it read, at least ``H``
  after a cut (mdb's last byte may be ``H`` older than the cut);
* mdb asks the broker to send every ``H / 4`` and drops a connection silent for 2.5 times
  the interval the broker agreed (stomp.py's heart-beat timeout): ActiveMQ's gaps of up to 2
  intervals pass, and a silent link is noticed after 0.625 ``H`` on ActiveMQ, 2.5 s on
  RabbitMQ (whose ``H`` is at least 4 s) - before the broker can have dropped the connection.
"""

from __future__ import annotations

from dataclasses import dataclass

#: mdb drops a connection silent for this many of the broker's agreed intervals.
RECEIVE_SCALE = 2.5
#: mdb asks the broker to send this many times as often as mdb promises to.
ASK_FACTOR = 4


@dataclass(frozen=True, slots=True)
class Heartbeats:
    """The CONNECT ``heart-beat`` header's two intervals, in ms: ``send_ms`` mdb promises to
    send at least every, ``ask_ms`` it asks the broker to (0, 0: no heart-beats)."""

    send_ms: int
    ask_ms: int

    @classmethod
    def plan(cls, heartbeat_ms: int, unit_ms: int = 1, min_ms: int = 0) -> Heartbeats:
        """The intervals for the setting ``heartbeat_ms`` on a broker that counts intervals in
        ``unit_ms``, where mdb's interval must be at least ``min_ms`` for mdb to notice a silent
        link first (``Dialect.heartbeat_unit_ms``, ``Dialect.min_heartbeat_ms``)."""
        if heartbeat_ms <= 0:
            return cls(0, 0)
        send = max(min_ms, -(-heartbeat_ms // unit_ms) * unit_ms)
        return cls(send, max(1, send // ASK_FACTOR))

    def silence_limit(self, connected: str | None) -> float | None:
        """Seconds the connection may stay silent, given the CONNECTED frame's ``heart-beat``
        header: ``RECEIVE_SCALE`` times the interval the broker agreed to send at (the longer
        of what was asked and what it offers, as stomp.py reckons it); None when it sends none."""
        try:
            offered = int((connected or "0,0").split(",")[0])
        except ValueError:
            return None
        if self.ask_ms == 0 or offered <= 0:
            return None
        return RECEIVE_SCALE * max(self.ask_ms, offered) / 1000


class Silence:
    """The longest silence of one connection, judged read by read: once something is read
    after a silence longer than ``limit`` seconds, the connection is ``broken`` for good.

    Measured at the reads, not by a timer: a timer can fire late (a busy machine, a process
    paused), a read after a long silence is in doubt however late it is noticed. Called on
    the event loop only."""

    def __init__(self) -> None:
        self.limit: float | None = None  # no limit until heart-beats were agreed
        #: Once broken: the silence that broke it and the limit it broke (seconds).
        self.broken: tuple[float, float] | None = None
        self._last: float | None = None

    def heard(self, now: float) -> None:
        """Bytes were read at ``now`` (a monotonic clock's seconds)."""
        self.check(now)
        self._last = now

    def check(self, now: float) -> None:
        """Judge the silence from the last read up to ``now`` as a read at ``now`` would,
        without one: before something read earlier is handed on."""
        last, limit = self._last, self.limit
        if self.broken is None and limit is not None and last is not None and now - last > limit:
            self.broken = (now - last, limit)
