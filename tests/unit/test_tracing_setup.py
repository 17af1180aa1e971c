"""Setting up OpenTelemetry: exporters named by OTEL_* variables, trace ids in log records."""

from __future__ import annotations

import logging

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from mdb.errors import ConfigurationError
from mdb.observability import telemetry


def test_an_unknown_exporter_is_a_configuration_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "jaeger")
    with pytest.raises(ConfigurationError, match="OTEL_TRACES_EXPORTER='jaeger'"):
        telemetry.configure("app")


def test_no_exporter_asked_for_sets_nothing_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_TRACES_EXPORTER", raising=False)
    monkeypatch.delenv("OTEL_METRICS_EXPORTER", raising=False)
    before = trace.get_tracer_provider()
    telemetry.configure("app")()
    assert trace.get_tracer_provider() is before


def test_log_records_carry_the_current_trace_and_span_ids() -> None:
    record = logging.LogRecord("mdb", logging.INFO, __file__, 1, "hello", None, None)
    telemetry.TraceIds().filter(record)
    assert record.trace == ""  # type: ignore[attr-defined]
    with TracerProvider().get_tracer("test").start_as_current_span("work") as span:
        telemetry.TraceIds().filter(record)
    context = span.get_span_context()
    assert record.trace == (  # type: ignore[attr-defined]
        f" trace={context.trace_id:032x} span={context.span_id:016x}")
