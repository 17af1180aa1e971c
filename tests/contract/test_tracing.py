"""Traces and metrics, read back with the OpenTelemetry SDK's in-memory exporter and reader, on
the memory broker and on ActiveMQ: one connected trace from a producer through two listeners,
a redelivered message, the move to the error destination, and the metrics of a known
workload."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence

import anyio
import pytest
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, NumberDataPoint
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from mdb import Context, Producer, Redelivery, listener
from tests.harness.apps.in_process import Calls, record_spans, running, settings_for, unique

pytestmark = pytest.mark.anyio

# The global providers can be set once per process: every test here shares them and looks
# only at the spans and data points of its own (uniquely named) destinations.
_SPANS = InMemorySpanExporter()
_METRICS = InMemoryMetricReader()


@pytest.fixture(scope="module", autouse=True)
def providers() -> Iterator[None]:
    record_spans(_SPANS)
    if not isinstance(metrics.get_meter_provider(), MeterProvider):
        metrics.set_meter_provider(MeterProvider(metric_readers=[_METRICS]))
    yield


@pytest.fixture(params=["memory", pytest.param("activemq", marks=pytest.mark.activemq)])
def url(request: pytest.FixtureRequest) -> str:
    if request.param == "memory":
        return f"memory://{unique('traced')}"
    return str(request.getfixturevalue("activemq").url)


def spans_of(*destinations: str) -> list[ReadableSpan]:
    names = {f"{op} {d}" for d in destinations for op in ("send", "process")}
    return [s for s in _SPANS.get_finished_spans() if s.name in names]


def one(spans: Sequence[ReadableSpan], name: str) -> ReadableSpan:
    [found] = [s for s in spans if s.name == name]
    return found


async def test_a_message_is_one_trace_from_the_producer_through_two_listeners(url: str) -> None:
    orders, invoices = f"queue:{unique('orders')}", f"queue:{unique('invoices')}"
    settings = settings_for(url)
    calls = Calls()

    @listener(orders)
    async def on_order(body: str, ctx: Context) -> None:
        await ctx.send(invoices, f"invoice for {body}")

    @listener(invoices)
    async def on_invoice(body: str, ctx: Context) -> None:
        calls.add("invoice", body)

    with trace.get_tracer("test").start_as_current_span("request") as request:
        async with Producer(settings) as producer:
            sent_id = await producer.send(orders, "o-1")
    async with running(settings, on_order, on_invoice):
        await calls.wait(lambda c: bool(c.of("invoice")))
    spans = spans_of(orders, invoices)
    send_order, process_order = one(spans, f"send {orders}"), one(spans, f"process {orders}")
    send_invoice = one(spans, f"send {invoices}")
    process_invoice = one(spans, f"process {invoices}")
    trace_id = request.get_span_context().trace_id
    chain = [send_order, process_order, send_invoice, process_invoice]
    assert {s.context.trace_id for s in chain if s.context} == {trace_id}
    parents = [request.get_span_context(), send_order.context, process_order.context,
               send_invoice.context]
    for child, parent in zip(chain, parents, strict=True):
        assert child.parent is not None and parent is not None
        assert child.parent.span_id == parent.span_id, child.name
    assert [s.kind for s in chain] == [SpanKind.PRODUCER, SpanKind.CONSUMER] * 2
    system = "memory" if url.startswith("memory") else "activemq"
    assert dict(process_order.attributes or {}).items() >= {
        "messaging.system": system, "messaging.destination.name": orders,
        "messaging.operation.name": "process", "messaging.operation.type": "process",
        "messaging.message.id": sent_id, "mdb.delivery_count": 1, "mdb.redelivered": False,
    }.items()
    assert dict(send_order.attributes or {}).items() >= {
        "messaging.system": system, "messaging.destination.name": orders,
        "messaging.operation.type": "send", "messaging.message.id": sent_id}.items()
    assert not any("mdb.message.body" in (s.attributes or {}) for s in chain)  # not recorded


async def test_redeliveries_and_the_error_destination_are_in_the_trace(
        url: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, "mdb.delivery")
    queue = f"queue:{unique('flaky')}"
    settings = settings_for(url)
    calls = Calls()

    # A delay: the broker holds each retry, and the trace goes on through it.
    @listener(queue, redelivery=Redelivery(limit=1, delay=0.2))
    async def flaky(body: str, ctx: Context) -> None:
        calls.add("run", (body, ctx.delivery_count))
        if body == "poison" or ctx.delivery_count == 1:
            raise ValueError(f"{body} fails")

    async with Producer(settings) as producer:
        for body in ("once", "poison"):
            await producer.send(queue, body)
    async with running(settings, flaky):
        await calls.wait(lambda c: len(c.of("run")) >= 4)
    processes = [s for s in spans_of(queue) if s.name == f"process {queue}"]
    by_trace: dict[int, list[ReadableSpan]] = {}
    for span in processes:
        assert span.context is not None
        by_trace.setdefault(span.context.trace_id, []).append(span)
    assert sorted(len(v) for v in by_trace.values()) == [2, 2]  # two attempts, one trace each
    outcomes = sorted(
        (str((s.attributes or {}).get("mdb.delivery_count")),
         str((s.attributes or {}).get("error.type")), ",".join(e.name for e in s.events))
        for s in processes)
    assert outcomes == [
        ("1", "ValueError", "exception,mdb.redelivery"),
        ("1", "ValueError", "exception,mdb.redelivery"),
        ("2", "None", ""), ("2", "ValueError", "exception,mdb.error_destination")]
    # Each failure's traceback: on its span (as record_exception makes it) and in the log, at
    # DEBUG for a redelivery, with the WARNING of the move to the error destination, as the
    # record's exception text (mdb.observability.logs.with_traceback), not in its message.
    exception = next(e for s in processes for e in s.events if e.name == "exception")
    stacktrace = str((exception.attributes or {})["exception.stacktrace"])
    assert 'raise ValueError(f"{body} fails")' in stacktrace and ", in flaky" in stacktrace
    tracebacks = [(r.levelname, r.exc_text) for r in caplog.records
                  if r.exc_text and "Traceback (most recent call last)" in r.exc_text]
    assert sorted(level for level, _ in tracebacks) == ["DEBUG", "DEBUG", "WARNING"]
    assert all(", in flaky" in text and "ValueError: " in text for _, text in tracebacks)
    second = [s for s in processes if (s.attributes or {}).get("mdb.delivery_count") == 2]
    assert all((s.attributes or {}).get("mdb.redelivered") is True for s in second)
    moved = [s for s in _SPANS.get_finished_spans() if s.name == f"send {queue}.DLQ"]
    assert len(moved) == 1 and moved[0].kind is SpanKind.PRODUCER


async def test_metrics_count_a_known_workload(url: str) -> None:
    queue = f"queue:{unique('counted')}"
    settings = settings_for(url)
    calls = Calls()

    name = unique("counted")

    @listener(queue, redelivery=Redelivery(limit=0, delay=0), name=name)
    async def counted(body: str, ctx: Context) -> None:
        calls.add("run", body)
        if body == "bad":
            raise RuntimeError("bad")

    async with Producer(settings) as producer:
        for body in ("a", "b", "c", "bad"):
            await producer.send(queue, body)
    async with running(settings, counted):
        await calls.wait(lambda c: len(c.of("run")) >= 4)
        # The listener's outcomes, counted once in its Stats and read by OpenTelemetry while
        # it lives (the metrics are known only when collected).
        with anyio.fail_after(30):
            while sum((outcomes := _outcomes(name)).values()) < 4:
                await anyio.sleep(0.01)
    assert (outcomes["processed"], outcomes["to_error_destination"],
            outcomes["redelivered"]) == (3, 1, 0)
    points = _points(queue)
    assert points["messaging.client.sent.messages"] == 4
    assert points["messaging.client.consumed.messages"] == 4
    assert points["messaging.process.duration"] == 4  # data points: one per delivery
    assert _points(f"{queue}.DLQ")["messaging.client.sent.messages"] == 1
    # One series per destination: the per-message attributes of a span are not a counter's.
    system = "memory" if url.startswith("memory") else "activemq"
    assert _series("messaging.client.sent.messages", queue) == [{
        "messaging.system": system, "messaging.destination.name": queue,
        "messaging.operation.name": "send"}]
    errors = _points(queue, error_type="RuntimeError")
    assert errors["messaging.client.consumed.messages"] == 1
    assert _usage("counted") == 0  # every pool slot given back


def _points(destination: str, error_type: str | None = None) -> dict[str, int]:
    """Per metric: the sum of the counters, or the count of the histogram, over the data
    points about ``destination`` (with ``error.type`` = ``error_type`` when given)."""
    totals: dict[str, int] = {}
    data = _METRICS.get_metrics_data()
    assert data is not None
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    attributes = dict(point.attributes or {})
                    if attributes.get("messaging.destination.name") != destination:
                        continue
                    if error_type is not None and attributes.get("error.type") != error_type:
                        continue
                    value = int(point.value) if isinstance(point, NumberDataPoint) else \
                        int(getattr(point, "count", 0))
                    totals[metric.name] = totals.get(metric.name, 0) + value
    return totals


def _series(name: str, destination: str) -> list[dict[str, object]]:
    """The attributes of each data point of metric ``name`` about ``destination``."""
    data = _METRICS.get_metrics_data()
    assert data is not None
    return [dict(point.attributes or {}) for resource in data.resource_metrics
            for scope in resource.scope_metrics for metric in scope.metrics
            if metric.name == name for point in metric.data.data_points
            if dict(point.attributes or {}).get("messaging.destination.name") == destination]


def _outcomes(listener_name: str) -> dict[str, int]:
    """``mdb.listener.messages`` of one listener, per ``mdb.outcome``."""
    data = _METRICS.get_metrics_data()
    assert data is not None
    return {str(attributes["mdb.outcome"]): int(point.value)
            for resource in data.resource_metrics for scope in resource.scope_metrics
            for metric in scope.metrics if metric.name == "mdb.listener.messages"
            for point in metric.data.data_points if isinstance(point, NumberDataPoint)
            and (attributes := dict(point.attributes or {})).get("mdb.listener")
            == listener_name}


def _usage(listener_name: str) -> int:
    data = _METRICS.get_metrics_data()
    assert data is not None
    return sum(int(point.value) for resource in data.resource_metrics
               for scope in resource.scope_metrics for metric in scope.metrics
               if metric.name == "mdb.pool.usage" for point in metric.data.data_points
               if isinstance(point, NumberDataPoint)
               and dict(point.attributes or {}).get("mdb.listener") == listener_name)
