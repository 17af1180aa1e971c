"""The metrics mdb records through OpenTelemetry's global meter provider (docs/tracing.md):

* ``messaging.process.duration`` (a histogram: the one measurement per delivery);
* ``messaging.client.consumed.messages`` and ``messaging.client.sent.messages``, counted by
  mdb itself (``Counter``) and observed when the metrics are collected;
* ``mdb.listener.messages``: each listener's outcomes, read from its ``Stats``, where they are
  counted once (``watch_listener``);
* ``mdb.pool.usage`` (the deliveries in each listener's handlers) and
  ``mdb.broker.connected`` (``watch_brokers``), observed gauges.

A counter of mdb's own is an attribute of an object looked up once per consumer and added to
per message: an SDK ``Counter.add`` per message would cost more than the rest of the
message's telemetry.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable, Mapping
from typing import Protocol

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

from mdb.observability.telemetry.names import LISTENER, OUTCOME
from mdb.observability.telemetry.stats import OUTCOMES, Stats

Attributes = dict[str, str | int | bool]

_meter = metrics.get_meter("mdb")


class Count:
    """A counter's value for one set of attributes: the code that counts adds to ``value``
    (no call), the instrument's callback reads it when the metrics are collected."""

    __slots__ = ("attributes", "value")

    def __init__(self, attributes: Mapping[str, str | int | bool]) -> None:
        self.attributes = dict(attributes)
        self.value = 0


class Counter:
    """A counter that mdb keeps itself, one ``Count`` per set of attributes, reported by an
    observable counter at collection time."""

    def __init__(self, name: str, description: str) -> None:
        self._counts: dict[tuple[tuple[str, str | int | bool], ...], Count] = {}
        _meter.create_observable_counter(name, [self._observe], unit="{message}",
                                         description=description)

    def of(self, attributes: Mapping[str, str | int | bool]) -> Count:
        """The count of ``attributes``: look it up once and keep it where it is added to."""
        key = tuple(sorted(attributes.items()))
        count = self._counts.get(key)
        if count is None:
            count = self._counts[key] = Count(attributes)
        return count

    def _observe(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(count.value, count.attributes)
                for count in list(self._counts.values()) if count.value]


process_duration = _meter.create_histogram(
    "messaging.process.duration", unit="s", description="Duration of processing operation.")
consumed = Counter("messaging.client.consumed.messages",
                   "Number of messages that were delivered to the application.")
sent = Counter("messaging.client.sent.messages",
               "Number of messages producer attempted to send to the broker.")


# -- what the container reports while it lives -------------------------------------------------

# Each live listener's Stats and its name; not to be added to while the metric reader's thread
# copies it.
_listeners: weakref.WeakKeyDictionary[Stats, str] = weakref.WeakKeyDictionary()
_listeners_lock = threading.Lock()


def watch_listener(name: str, stats: Stats) -> None:
    """Report listener ``name``'s ``stats`` in ``mdb.listener.messages`` (its outcomes) and
    ``mdb.pool.usage`` (its ``in_flight``) while ``stats`` lives."""
    with _listeners_lock:
        _listeners[stats] = name


def _watched_listeners() -> list[tuple[str, Stats]]:
    with _listeners_lock:
        return [(name, stats) for stats, name in _listeners.items()]


def _observe_outcomes(options: CallbackOptions) -> Iterable[Observation]:
    # Summed by name: two containers of one process (a test's) may each run a listener of it.
    counts: dict[tuple[str, str], int] = {}
    for name, stats in _watched_listeners():
        for outcome in OUTCOMES:
            counts[name, outcome] = counts.get((name, outcome), 0) + getattr(stats, outcome)
    return [Observation(count, {LISTENER: name, OUTCOME: outcome})
            for (name, outcome), count in counts.items()]


def _observe_pool_usage(options: CallbackOptions) -> Iterable[Observation]:
    in_flight: dict[str, int] = {}
    for name, stats in _watched_listeners():
        in_flight[name] = in_flight.get(name, 0) + stats.in_flight
    return [Observation(count, {LISTENER: name}) for name, count in in_flight.items()]


_meter.create_observable_counter(
    "mdb.listener.messages", [_observe_outcomes], unit="{message}",
    description="Messages of each listener in this process, by outcome (mdb.outcome).")
_meter.create_observable_up_down_counter(
    "mdb.pool.usage", [_observe_pool_usage], unit="{delivery}",
    description="Deliveries being handled now, per listener (the pool slots in use).")


class BrokerStates(Protocol):
    def broker_states(self) -> Iterable[tuple[str, str, bool]]:
        """``(broker, messaging.system, up)`` for each broker in use."""
        ...


_brokers: weakref.WeakSet[BrokerStates] = weakref.WeakSet()


def watch_brokers(source: BrokerStates) -> None:
    """Report ``source``'s brokers in ``mdb.broker.connected`` (1 up, 0 down) while it lives."""
    _brokers.add(source)


def _observe_brokers(options: CallbackOptions) -> Iterable[Observation]:
    return [Observation(int(up), {"mdb.broker": name, "messaging.system": system})
            for source in list(_brokers) for name, system, up in source.broker_states()]


_meter.create_observable_gauge("mdb.broker.connected", [_observe_brokers], unit="1",
                               description="1 while the broker is up, else 0.")
