"""``/metrics`` on the health port: what a Prometheus server scrapes (docs/metrics.md).

Needs the ``prometheus`` extra (``prometheus-client`` and ``opentelemetry-exporter-prometheus``)
and is served when ``OTEL_METRICS_EXPORTER=prometheus`` and ``health_port`` are set. One page
holds:

* the metrics mdb records through OpenTelemetry (``mdb.observability.telemetry``), each listener's
  counts of outcomes among them (``mdb_listener_messages_total``), under the messaging semantic
  conventions' names turned into Prometheus ones by the OpenTelemetry exporter
  (``messaging.process.duration`` → ``messaging_process_duration_seconds``, counters end in
  ``_total``), which ``mdb.observability.telemetry.configure`` reads into ``prometheus_client``'s
  registry;
* the gauges an operator pages on, read from the container when the page is asked for
  (``ContainerMetrics``): readiness, each broker's connection state, and per listener its pool
  slots, how many hold a delivery, the deliveries in its handlers and the age of the oldest
  delivery not yet settled;
* the process's own (``process_*``, ``python_*``) from ``prometheus_client``.

Under ``mdb run --workers N`` the supervisor serves every worker's page at once, each sample
labelled ``worker`` (``WorkerMetrics``), and the state and restarts of each worker.

Reading the container happens on its event loop (``HealthServer`` calls
``ContainerMetrics.read`` there), so nothing is counted twice or read half-changed; no figure
is kept for this page alone. That read is short, the container's own figures only: the
OpenTelemetry metrics and the process's are collected, and the page encoded, in the health
endpoint's request thread, at most once per ``mdb.serving.http.routes.PAGE_FRESH_FOR`` seconds
(docs/metrics.md), so that scrapers do not slow the container.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from functools import partial

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from mdb.container.container import Container
from mdb.observability.health import Health
from mdb.serving.http.routes import Page, Render

BROKER_STATES = ("up", "down", "failed", "unknown")


def exposition(collector: Collector, accept: str) -> Page:
    """``collector``'s page in the format ``accept`` asks for (OpenMetrics when it names it,
    else the Prometheus text format): (content type, body)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    encode, content_type = choose_encoder(accept)
    return content_type, encode(registry)


def content_type(accept: str) -> str:
    """The content type of the page ``accept`` asks for (``exposition``)."""
    return choose_encoder(accept)[1]


class ContainerMetrics:
    """One container's ``/metrics`` (an ``mdb.serving.http.routes.MetricsSource``): its gauges and
    counts, read on its loop, then the OpenTelemetry metrics and the process's
    (``prometheus_client``'s global registry), collected where the page is made."""

    content_type = staticmethod(content_type)

    def __init__(self, container: Container) -> None:
        self._container = container

    def read(self) -> Render:
        """On the container's loop."""
        figures = [*health_families(self._container.health()), *self._listener_families()]
        return partial(exposition, _ProcessPage(figures))

    def _listener_families(self) -> Iterator[Metric]:
        slots = GaugeMetricFamily(
            "mdb_listener_slots", "Pool slots of the listener: its pool times its members.",
            labels=["listener"])
        busy = GaugeMetricFamily(
            "mdb_listener_slots_busy",
            "Pool slots holding a delivery (handling it, waiting out a redelivery delay, "
            "settling it); slots_busy / slots is the pool's saturation.", labels=["listener"])
        oldest = GaugeMetricFamily(
            "mdb_listener_oldest_unsettled_seconds",
            "Age of the oldest delivery a pool slot received and has not settled yet; 0 when "
            "none is held.", labels=["listener"], unit="seconds")
        now = time.monotonic()
        running = list(self._container.slots.running)
        for deployed in self._container.deployed:
            name = deployed.spec.name
            held = [s.holding_since for s in running
                    if s.deployed is deployed and s.holding_since is not None]
            slots.add_metric([name], deployed.spec.options.pool * len(deployed.planned))
            busy.add_metric([name], len(held))
            oldest.add_metric([name], now - min(held) if held else 0.0)
        yield from (slots, busy, oldest)


class _ProcessPage(Collector):
    """``figures`` read from the container, then what OpenTelemetry and ``prometheus_client``
    hold, collected when the page is made."""

    def __init__(self, figures: list[Metric]) -> None:
        self._figures = figures

    def collect(self) -> Iterator[Metric]:
        yield from self._figures
        yield from without_empty_labels(REGISTRY.collect())


def without_empty_labels(families: Iterable[Metric]) -> Iterator[Metric]:
    """``families`` with every label whose value is empty left out. OpenTelemetry's exporter
    gives each sample of a metric every label any of its samples has, empty where the sample
    has none (``error_type=""`` on a message that did not fail); Prometheus reads an empty
    label as no label, so the page says so."""
    for family in families:
        family.samples = [
            sample._replace(labels={k: v for k, v in sample.labels.items() if v})
            if "" in sample.labels.values() else sample for sample in family.samples]
        yield family


def health_families(health: Health) -> Iterator[Metric]:
    """What a health snapshot says, as metrics (the container's, or one of the supervisor's)."""
    yield GaugeMetricFamily("mdb_live", "1 while the container's event loop answers.",
                            value=int(health.live))
    yield GaugeMetricFamily("mdb_ready", "1 while /health/ready answers 200.",
                            value=int(health.ready))
    state = GaugeMetricFamily(
        "mdb_broker_state", "1 for the broker's current connection state, 0 for the others.",
        labels=["broker", "state"])
    since = GaugeMetricFamily(
        "mdb_broker_state_since_timestamp_seconds",
        "When the broker's connection state last changed (Unix time).", labels=["broker"])
    for broker in health.brokers:
        current = broker.state if broker.state in BROKER_STATES else "unknown"
        for each in BROKER_STATES:
            state.add_metric([broker.name, each], int(each == current))
        since.add_metric([broker.name], broker.since)
    yield state
    yield since
    in_flight = GaugeMetricFamily("mdb_listener_in_flight",
                                  "Deliveries in the listener's handlers now.",
                                  labels=["listener"])
    members = GaugeMetricFamily("mdb_listener_members",
                                "Members of the listener's destination.", labels=["listener"])
    subscribed = GaugeMetricFamily("mdb_listener_members_subscribed",
                                   "Members with a subscribed consumer.", labels=["listener"])
    paused = GaugeMetricFamily("mdb_listener_paused",
                               "1 while the listener is paused (docs/health.md).",
                               labels=["listener"])
    for listener in health.listeners:
        in_flight.add_metric([listener.name], listener.in_flight)
        members.add_metric([listener.name], listener.members)
        subscribed.add_metric([listener.name], listener.subscribed)
        paused.add_metric([listener.name], int(listener.paused))
    yield from (in_flight, members, subscribed, paused)
    events = CounterMetricFamily("mdb_events", "Availability events emitted (docs/failover.md).",
                                 labels=["kind"])
    for kind, count in sorted(health.events.items()):
        events.add_metric([kind], count)
    yield events


class WorkerMetrics(Collector):
    """The supervisor's page: each worker's page, every sample labelled with its ``worker``
    (the place, 1 to N), then each worker's state and restarts. ``pages`` are the pages the
    workers answered, by place; ``health`` the supervisor's snapshot (its ``workers``)."""

    def __init__(self, health: Health, pages: dict[int, str]) -> None:
        self._health = health
        self._pages = pages

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        for index, page in sorted(self._pages.items()):
            for family in text_string_to_metric_families(page):
                into = merged.get(family.name)
                if into is None:
                    into = merged[family.name] = Metric(family.name, family.documentation,
                                                        family.type, family.unit)
                into.samples += [sample._replace(labels={**sample.labels, "worker": str(index)})
                                 for sample in family.samples]
        yield from merged.values()
        yield from worker_families(self._health)


def worker_families(health: Health) -> Iterator[Metric]:
    ready = GaugeMetricFamily("mdb_worker_ready", "1 while the worker runs and is ready.",
                              labels=["worker"])
    restarts = CounterMetricFamily("mdb_worker_restarts",
                                   "Times the supervisor started the worker's place again.",
                                   labels=["worker"])
    for worker in health.workers:
        ready.add_metric([str(worker.index)], int(worker.state == "ready"))
        restarts.add_metric([str(worker.index)], worker.restarts)
    yield ready
    yield restarts


class SupervisorMetrics:
    """The supervisor's ``/metrics`` (an ``mdb.serving.http.routes.MetricsSource``): ``ask``, on its
    loop, gets its snapshot and every worker's page; they are parsed and merged where the page is
    made (``WorkerMetrics``)."""

    content_type = staticmethod(content_type)

    def __init__(self, ask: Callable[[], Awaitable[tuple[Health, dict[int, str]]]]) -> None:
        self._ask = ask

    async def read(self) -> Render:
        health, pages = await self._ask()
        return partial(exposition, WorkerMetrics(health, pages))
