"""Setting up OpenTelemetry's SDK from the standard ``OTEL_*`` environment variables, when the
application did not (``configure``), and the trace ids of the current span in mdb's log lines
(``TraceIds``)."""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable
from typing import Any

from opentelemetry import metrics, trace

from mdb.errors import ConfigurationError
from mdb.observability.telemetry.providers import metrics_on


def configure(service_name: str) -> Callable[[], None]:
    """Set up tracer and meter providers from the standard ``OTEL_*`` variables, unless the
    application already did; return what flushes and shuts them down at exit.

    ``OTEL_TRACES_EXPORTER`` and ``OTEL_METRICS_EXPORTER``: ``console``, ``otlp`` (needs the
    ``otlp`` extra) or ``none`` (the default here: nothing is exported unless asked);
    ``OTEL_METRICS_EXPORTER`` also ``prometheus`` (needs the ``prometheus`` extra): the metrics
    are read into ``prometheus_client``'s registry when ``/metrics`` is asked for
    (``mdb.serving.http.metrics_page``), never pushed.
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
    if meters != "none" and not metrics_on():
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
    lines (``mdb.observability.logs.JsonLines``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        context = trace.get_current_span().get_span_context()
        trace_id = f"{context.trace_id:032x}" if context.is_valid else ""
        span_id = f"{context.span_id:016x}" if context.is_valid else ""
        record.trace_id, record.span_id = trace_id, span_id
        record.trace = f" trace={trace_id} span={span_id}" if trace_id else ""
        return True
