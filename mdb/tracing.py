"""Telemetry: spans, trace context in message headers, and metrics, after the OpenTelemetry
messaging semantic conventions. The only module of the core that imports OpenTelemetry.

* Every message mdb sends carries the W3C trace context (``traceparent``, ``tracestate``,
  ``baggage``) of its ``send <destination>`` PRODUCER span.
* Each delivery is handled in a ``process <destination>`` CONSUMER span whose **parent** is the
  context the message carries, so producer → consumer → the consumer's own sends form one
  trace across processes. A failed message re-sent for redelivery carries the context of the
  failed attempt: the next attempt's span is its child.
* Metrics: ``messaging.process.duration``, ``messaging.client.consumed.messages``,
  ``messaging.client.sent.messages``, ``mdb.redeliveries``, ``mdb.error_destination.moves``,
  ``mdb.stuck.messages``, ``mdb.pool.usage`` and ``mdb.broker.connected``.

Instruments come from the global providers, so an application (or a test) that set up
OpenTelemetry itself keeps its own; ``configure`` sets them up from the ``OTEL_*``
environment variables only when nobody did. Message bodies are never recorded, unless
``MDB_TRACE_BODIES`` is set (``record_bodies``).
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from types import TracebackType
from typing import Any, Protocol

from opentelemetry import metrics, propagate, trace
from opentelemetry.context import Context
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.metrics import _internal as metrics_internal
from opentelemetry.trace import INVALID_SPAN, Span, SpanKind, Status, StatusCode

from mdb.destinations import Destination
from mdb.errors import ConfigurationError, error_type
from mdb.message import OutgoingMessage, ReplyAddress, ReplyTo

_tracer = trace.get_tracer("mdb")
_meter = metrics.get_meter("mdb")

# The names of what a ``process`` span records, which the testing kit (``mdb.testing.tracker``)
# reads back to tell how each delivery ended: defined here once, so that a rename reaches both.
PROCESS = "process"  # the CONSUMER span of a delivery is named ``process <destination>``
MESSAGE_ID = "messaging.message.id"
DESTINATION = "messaging.destination.name"
DESTINATION_TEMPLATE = "messaging.destination.template"
REPLY_TO = "(reply-to)"  # the DESTINATION_TEMPLATE that counts every send to a reply address
SUBSCRIPTION = "messaging.destination.subscription.name"
ERROR_TYPE = "error.type"
DELIVERY_COUNT = "mdb.delivery_count"
REDELIVERY_EVENT = "mdb.redelivery"  # re-sent for another delivery (with its DELIVERY_COUNT)
ERROR_DESTINATION_EVENT = "mdb.error_destination"  # moved there (the DESTINATION it went to)
STUCK_EVENT = "mdb.stuck"  # given up on: its OUTCOME says how
OUTCOME = "mdb.outcome"
DEAD_LETTERED = "dead-lettered"  # an OUTCOME: handed to the broker's dead-letter queue
KEPT = "kept"  # an OUTCOME: kept on its own queue, not handled again
ALREADY_PROCESSED = "mdb.already_processed"  # exactly-once: a copy its inbox knew, not run


class _Count:
    """A counter's value for one set of attributes: the code that counts adds to ``value``
    (no call: a message's counting costs nothing), the instrument's callback reads it when the
    metrics are collected."""

    __slots__ = ("attributes", "value")

    def __init__(self, attributes: Mapping[str, str | int | bool]) -> None:
        self.attributes = dict(attributes)
        self.value = 0


class _Counter:
    """A counter that mdb keeps itself, one ``_Count`` per set of attributes, reported by an
    observable counter at collection time: an SDK ``Counter.add`` per message would cost more
    than the rest of the message's telemetry."""

    def __init__(self, name: str, description: str) -> None:
        self._counts: dict[tuple[tuple[str, str | int | bool], ...], _Count] = {}
        _meter.create_observable_counter(name, [self._observe], unit="{message}",
                                         description=description)

    def of(self, attributes: Mapping[str, str | int | bool]) -> _Count:
        """The count of ``attributes``: look it up once and keep it where it is added to."""
        key = tuple(sorted(attributes.items()))
        count = self._counts.get(key)
        if count is None:
            count = self._counts[key] = _Count(attributes)
        return count

    def _observe(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(count.value, count.attributes)
                for count in list(self._counts.values()) if count.value]


_process_duration = _meter.create_histogram(
    "messaging.process.duration", unit="s", description="Duration of processing operation.")
_consumed = _Counter("messaging.client.consumed.messages",
                     "Number of messages that were delivered to the application.")
_sent = _Counter("messaging.client.sent.messages",
                 "Number of messages producer attempted to send to the broker.")
# (system, destination, or None for every reply address): its count in _sent
_sent_to: dict[tuple[str, Destination | None], _Count] = {}
_redeliveries = _Counter("mdb.redeliveries", "Failed deliveries re-sent for another attempt.")
_error_moves = _Counter("mdb.error_destination.moves",
                        "Messages moved to their listener's error destination.")
_given_up = _Counter("mdb.stuck.messages",
                     "Messages whose settlement kept failing outside the handler, handed to the "
                     "broker's dead-letter queue or kept on their own queue.")


# Whether a provider is set is asked for every message. The API's getters read an environment
# variable on every call while none is set, which would cost more than all the rest of a
# message's telemetry, so the API's own module globals are read instead, with the getters as
# the fallback should a release rename them.
_UNKNOWN = object()


def _tracing_on() -> bool:
    provider = getattr(trace, "_TRACER_PROVIDER", _UNKNOWN)
    if provider is _UNKNOWN:
        return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    return provider is not None


def _metrics_on() -> bool:
    provider = getattr(metrics_internal, "_METER_PROVIDER", _UNKNOWN)
    if provider is _UNKNOWN:
        return not type(metrics.get_meter_provider()).__name__.startswith("_Proxy")
    return provider is not None


def record_bodies() -> bool:
    """Whether spans record message bodies (``MDB_TRACE_BODIES=true``); off by default."""
    return os.environ.get("MDB_TRACE_BODIES", "").lower() in {"1", "true", "yes"}


def _attributes(system: str, destination: ReplyTo, operation: str,
                ) -> dict[str, str | int | bool]:
    return {"messaging.system": system, DESTINATION: str(destination),
            "messaging.operation.name": operation, "messaging.operation.type": operation}


@contextmanager
def sending(system: str, destination: ReplyTo, message: OutgoingMessage,
            ) -> Iterator[OutgoingMessage]:
    """A ``send <destination>`` PRODUCER span around a send; yields ``message`` with the
    span's trace context in its headers, which is what must be sent."""
    if not _tracing_on():  # the fast path: nothing would record the span
        yield message
        _sent_count(system, destination).value += 1
        return
    attributes = _attributes(system, destination, "send")
    attributes[MESSAGE_ID] = message.headers.get("mdb_id", "")
    attributes["messaging.message.body.size"] = len(message.body)
    with _tracer.start_as_current_span(f"send {destination}", kind=SpanKind.PRODUCER,
                                       attributes=attributes) as span:
        if record_bodies():
            span.set_attribute("mdb.message.body", message.body.decode(errors="replace"))
        headers = dict(message.headers)
        propagate.inject(headers)
        try:
            yield dataclasses.replace(message, headers=headers)
        except Exception as exc:
            span.set_attribute(ERROR_TYPE, error_type(exc))
            raise
        _sent_count(system, destination).value += 1


def _sent_count(system: str, destination: ReplyTo) -> _Count:
    # A reply address comes from the message replied to, not from mdb's settings: each
    # requester's temporary queue is another. All of them are counted as one, under
    # REPLY_TO, so that neither this map nor /metrics grows with the requesters
    # (docs/security.md, "Hostile input: the operator's files and the health endpoint's
    # clients"); the span of each send still names its address.
    target = None if isinstance(destination, ReplyAddress) else destination
    count = _sent_to.get((system, target))
    if count is None:
        attributes = _metric_attributes(_attributes(system, destination, "send"))
        if target is None:
            del attributes[DESTINATION]
            attributes[DESTINATION_TEMPLATE] = REPLY_TO
        count = _sent_to[system, target] = _sent.of(attributes)
    return count


class Processing:
    """What the delivery code tells the ``process`` span of a delivery about its outcome, and
    the span itself as a context manager. This one records nothing: the delivery of a
    consumer nobody listens to (no provider set), or one settled unseen (not selected)."""

    __slots__ = ()

    span: Span = INVALID_SPAN
    error_type: str | None = None

    def __enter__(self) -> Processing:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> bool | None:
        return None

    def failed(self, error_type: str, text: str, stacktrace: str = "") -> None:
        """The handler (or decoding) failed: the span gets ``error.type``, an error status and,
        when the handler raised (``stacktrace``), an ``exception`` event as
        ``record_exception`` makes it, but with ``text`` (what may be shown of the exception:
        docs/security.md) in place of the exception's own text."""

    def redelivery(self, count: int) -> None:
        """Re-sent for delivery ``count``."""

    def moved(self, target: Destination) -> None:
        """Moved to the error destination ``target``."""

    def already_processed(self) -> None:
        """An exactly-once listener's copy of a message already processed, settled unrun."""

    def given_up(self, outcome: str) -> None:
        """A stuck message was ``DEAD_LETTERED`` or ``KEPT`` (``mdb.delivery.decision``)."""


UNSEEN = Processing()
"""The ``process`` span of a delivery settled unseen, or that nothing records: none."""


class _Recorded(Processing):
    """The ``process`` span of one delivery of ``consumer`` while a provider is set: timed
    while it is open, and counted in ``messaging.client.consumed.messages`` once closed."""

    __slots__ = ("_consumer", "_scope", "_start", "error_type", "span")

    def __init__(self, consumer: Consumer, span: Span) -> None:
        self._consumer = consumer
        self.span = span
        self.error_type = None
        self._scope = trace.use_span(span, end_on_exit=True)

    def __enter__(self) -> Processing:
        self._scope.__enter__()
        self._start = time.perf_counter()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> bool | None:
        consumer = self._consumer
        if exc is not None:
            self.error_type = self.error_type or error_type(exc)
            self.span.set_attribute(ERROR_TYPE, self.error_type)
        if self.error_type:
            count, attributes = consumer.failures(self.error_type)
        else:
            count, attributes = consumer.consumed, consumer.metric
        _process_duration.record(time.perf_counter() - self._start, attributes)
        count.value += 1
        return self._scope.__exit__(exc_type, exc, traceback)

    def failed(self, error_type: str, text: str, stacktrace: str = "") -> None:
        self.error_type = error_type
        self.span.set_attribute(ERROR_TYPE, error_type)
        self.span.set_status(Status(StatusCode.ERROR, text[:300]))
        if stacktrace:
            self.span.add_event("exception", {
                "exception.type": error_type, "exception.message": text[:300],
                "exception.stacktrace": stacktrace})

    def redelivery(self, count: int) -> None:
        _redeliveries.of(self._consumer.metric).value += 1
        self.span.add_event(REDELIVERY_EVENT, {DELIVERY_COUNT: count})

    def moved(self, target: Destination) -> None:
        _error_moves.of(self._consumer.metric).value += 1
        self.span.add_event(ERROR_DESTINATION_EVENT, {DESTINATION: str(target)})

    def already_processed(self) -> None:
        self.span.set_attribute(ALREADY_PROCESSED, True)

    def given_up(self, outcome: str) -> None:
        _given_up.of(self._consumer.metric | {OUTCOME: outcome}).value += 1
        self.span.add_event(STUCK_EVENT, {OUTCOME: outcome})


class InFlight(Protocol):
    """A listener's count of the deliveries in its handlers (``mdb.delivery.Stats``)."""

    in_flight: int


class Consumer:
    """The telemetry of one listener's consumer: its subscription on one broker, for one pool
    slot. What every ``process`` span and data point of its deliveries shares is worked out
    once, here. ``stats`` is the listener's: ``mdb.pool.usage`` reads its ``in_flight``."""

    def __init__(self, listener: str, system: str, destination: Destination,
                 subscription: str | None, shared: bool, stats: InFlight) -> None:
        attributes = _attributes(system, destination, "process")
        if subscription:
            attributes[SUBSCRIPTION] = subscription
            if shared:
                attributes["messaging.consumer.group.name"] = subscription
        self._attributes = attributes
        self.metric = _metric_attributes(attributes)
        self.consumed = _consumed.of(self.metric)
        self._failures: dict[str, tuple[_Count, dict[str, str | int | bool]]] = {}
        self._span_name = f"{PROCESS} {destination}"
        self._record_bodies = record_bodies()
        self.listener = listener
        self.stats = stats
        with _consumers_lock:
            _consumers.add(self)

    def processing(self, headers: Mapping[str, str], message_id: str, body: bytes,
                   delivery_count: int, redelivered: bool) -> Processing:
        """A ``process <destination>`` CONSUMER span, child of the context in ``headers``; to
        be entered."""
        tracing_on = _tracing_on()
        if not tracing_on:
            if not _metrics_on():  # the fast path: nobody is listening
                return UNSEEN
            return _Recorded(self, INVALID_SPAN)
        # All the attributes at the start: set later, on a span that records, they would cost
        # a second pass through the SDK (a sampled-out span never looks at them).
        span = _tracer.start_span(
            self._span_name, context=_parent(headers), kind=SpanKind.CONSUMER,
            attributes={**self._attributes, MESSAGE_ID: message_id,
                        "messaging.message.body.size": len(body),
                        DELIVERY_COUNT: delivery_count, "mdb.redelivered": redelivered})
        if self._record_bodies:
            span.set_attribute("mdb.message.body", body.decode(errors="replace"))
        return _Recorded(self, span)

    def failures(self, error_type: str) -> tuple[_Count, dict[str, str | int | bool]]:
        """The count and the data points' attributes of deliveries that failed with
        ``error_type``."""
        found = self._failures.get(error_type)
        if found is None:
            attributes = self.metric | {ERROR_TYPE: error_type}
            found = self._failures[error_type] = (_consumed.of(attributes), attributes)
        return found


_consumers: weakref.WeakSet[Consumer] = weakref.WeakSet()
# A WeakSet must not be added to while the metric reader's thread copies it.
_consumers_lock = threading.Lock()


def _observe_pool_usage(options: CallbackOptions) -> Iterable[Observation]:
    in_flight: dict[str, dict[int, int]] = {}  # listener → its Stats (by id) → in flight
    with _consumers_lock:
        consumers = list(_consumers)
    for consumer in consumers:
        in_flight.setdefault(consumer.listener, {})[id(consumer.stats)] = \
            consumer.stats.in_flight
    return [Observation(sum(counts.values()), {"mdb.listener": listener})
            for listener, counts in in_flight.items()]


_meter.create_observable_up_down_counter(
    "mdb.pool.usage", [_observe_pool_usage], unit="{delivery}",
    description="Deliveries being handled now, per listener (the pool slots in use).")


def _parent(headers: Mapping[str, str]) -> Context:
    """The context ``headers`` carry. A message that carries none of the propagator's fields
    (sent by a client that does not trace) has none: extracting would find nothing, at the
    cost of a look-up per propagator and field."""
    propagator = propagate.get_global_textmap()
    global _fields_of
    if _fields_of[0] is not propagator:
        _fields_of = (propagator, frozenset(propagator.fields))
    if _fields_of[1].isdisjoint(headers):
        return _EMPTY
    return propagate.extract(headers)


_EMPTY = Context()
_fields_of: tuple[object, frozenset[str]] = (None, frozenset())


class BrokerStates(Protocol):
    def broker_states(self) -> Iterable[tuple[str, str, bool]]:
        """``(broker, messaging.system, up)`` for each broker in use."""
        ...


_watched: weakref.WeakSet[BrokerStates] = weakref.WeakSet()


def watch_brokers(source: BrokerStates) -> None:
    """Report ``source``'s brokers in ``mdb.broker.connected`` (1 up, 0 down) while it lives."""
    _watched.add(source)


def _observe_brokers(options: CallbackOptions) -> Iterable[Observation]:
    return [Observation(int(up), {"mdb.broker": name, "messaging.system": system})
            for source in list(_watched) for name, system, up in source.broker_states()]


_meter.create_observable_gauge("mdb.broker.connected", [_observe_brokers], unit="1",
                               description="1 while the broker is up, else 0.")


def _metric_attributes(attributes: Mapping[str, str | int | bool]) -> dict[str, str | int | bool]:
    return {k: v for k, v in attributes.items() if k != "messaging.operation.type"}


# -- setting up the SDK ------------------------------------------------------------------------

def configure(service_name: str) -> Callable[[], None]:
    """Set up tracer and meter providers from the standard ``OTEL_*`` variables, unless the
    application already did; return what flushes and shuts them down at exit.

    ``OTEL_TRACES_EXPORTER`` and ``OTEL_METRICS_EXPORTER``: ``console``, ``otlp`` (needs the
    ``otlp`` extra) or ``none`` (the default here: nothing is exported unless asked);
    ``OTEL_METRICS_EXPORTER`` also ``prometheus`` (needs the ``prometheus`` extra): the metrics
    are read into ``prometheus_client``'s registry when ``/metrics`` is asked for
    (``mdb.metrics``), never pushed.
    ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` name the resource; without a
    service name it is the app's name.
    """
    from opentelemetry.sdk.resources import Resource

    resource = Resource.create({} if os.environ.get("OTEL_SERVICE_NAME")
                               else {"service.name": service_name})
    done: list[Callable[[], None]] = []
    traces = _exporter_name("OTEL_TRACES_EXPORTER")
    if traces != "none" and isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        tracer_provider = TracerProvider(resource=resource)
        tracer_provider.add_span_processor(BatchSpanProcessor(_exporter("traces", traces)))
        trace.set_tracer_provider(tracer_provider)
        done.append(tracer_provider.shutdown)
    meters = metrics_exporter()
    if meters != "none" and not _metrics_on():
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

        meter_provider = MeterProvider(
            resource=resource, metric_readers=[
                _exporter("metrics", meters) if meters == "prometheus"
                else PeriodicExportingMetricReader(_exporter("metrics", meters))])
        metrics.set_meter_provider(meter_provider)
        done.append(meter_provider.shutdown)

    def shutdown() -> None:
        for step in done:
            step()

    return shutdown


def metrics_exporter() -> str:
    """``OTEL_METRICS_EXPORTER``: ``console``, ``otlp``, ``prometheus`` or ``none``."""
    return _exporter_name("OTEL_METRICS_EXPORTER", "prometheus")


def _exporter_name(variable: str, *more: str) -> str:
    value = os.environ.get(variable, "none").strip().lower() or "none"
    known = ("console", "otlp", *more, "none")
    if value not in known:
        raise ConfigurationError(f"{variable}={value!r}: mdb knows "
                                 f"{', '.join(map(repr, known[:-1]))} and 'none'")
    return value


# (signal, OTEL_*_EXPORTER value) → the exporter class, imported only when asked for.
_EXPORTERS = {
    ("traces", "console"): ("opentelemetry.sdk.trace.export", "ConsoleSpanExporter"),
    ("traces", "otlp"): ("opentelemetry.exporter.otlp.proto.http.trace_exporter",
                         "OTLPSpanExporter"),
    ("metrics", "console"): ("opentelemetry.sdk.metrics.export", "ConsoleMetricExporter"),
    ("metrics", "otlp"): ("opentelemetry.exporter.otlp.proto.http.metric_exporter",
                          "OTLPMetricExporter"),
    # A reader, not an exporter: the metrics are read when /metrics is scraped.
    ("metrics", "prometheus"): ("opentelemetry.exporter.prometheus", "PrometheusMetricReader"),
}

_MISSING = {
    "otlp": "OTEL_*_EXPORTER=otlp needs the OTLP exporter: pip install 'mdb[otlp]' "
            "(opentelemetry-exporter-otlp-proto-http)",
    "prometheus": "OTEL_METRICS_EXPORTER=prometheus needs pip install 'mdb[prometheus]' "
                  "(opentelemetry-exporter-prometheus, prometheus-client)",
}


def _exporter(signal: str, name: str) -> Any:
    module, cls = _EXPORTERS[signal, name]
    try:
        return getattr(importlib.import_module(module), cls)()
    except ImportError:
        raise ConfigurationError(_MISSING[name]) from None


class TraceIds(logging.Filter):
    """Adds ``trace`` to every log record: `` trace=<id> span=<id>`` while a span is
    current (the message being handled), else empty. ``mdb run``'s log format ends with it.
    ``trace_id`` and ``span_id`` hold the two ids alone (empty without a span), for the JSON
    lines (``mdb.logs.JsonLines``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        context = trace.get_current_span().get_span_context()
        trace_id = f"{context.trace_id:032x}" if context.is_valid else ""
        span_id = f"{context.span_id:016x}" if context.is_valid else ""
        record.trace_id, record.span_id = trace_id, span_id
        record.trace = f" trace={trace_id} span={span_id}" if trace_id else ""
        return True
