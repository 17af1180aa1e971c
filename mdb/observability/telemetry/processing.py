"""The ``process <destination>`` CONSUMER span of each delivery, whose parent is the context the
message carries, so that producer → consumer → the consumer's own sends form one trace across
processes; a failed message re-sent for redelivery carries the context of the failed attempt,
and the next attempt's span is its child (docs/tracing.md). How the delivery ended is told to
the span (``Processing``); it is counted in the listener's ``Stats``, once."""

from __future__ import annotations

import time
from collections.abc import Mapping
from contextvars import Token
from types import TracebackType

from opentelemetry import context, propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import INVALID_SPAN, Span, SpanKind, Status, StatusCode

from mdb.errors import error_type
from mdb.messages.destinations import Destination
from mdb.observability.redaction import mask_secrets
from mdb.observability.telemetry import instruments
from mdb.observability.telemetry.instruments import Attributes, Count
from mdb.observability.telemetry.names import (
    ALREADY_PROCESSED,
    DELIVERY_COUNT,
    DESTINATION,
    ERROR_DESTINATION_EVENT,
    ERROR_TYPE,
    MESSAGE_ID,
    OUTCOME,
    PROCESS,
    REDELIVERY_EVENT,
    STUCK_EVENT,
    SUBSCRIPTION,
)
from mdb.observability.telemetry.providers import (
    attributes,
    metric_attributes,
    metrics_on,
    record_bodies,
    tracing_on,
)

_tracer = trace.get_tracer("mdb")


class Processing:
    """What the delivery code tells the ``process`` span of a delivery about its outcome, and
    the span itself as a context manager. This one records nothing: the delivery of a
    consumer nobody listens to (no provider set), or one settled unseen (not selected). The
    outcomes are counted in the listener's ``Stats``, not here."""

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
        docs/security.md) in place of the exception's own text; both with their secrets
        masked (``mdb.observability.redaction.mask_secrets``)."""

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
    while it is open, and counted in ``messaging.client.consumed.messages`` once closed.

    It is the current span while open, as ``trace.use_span(span, end_on_exit=True)`` makes it,
    an exception leaving it recorded on it the same way, but without that context manager's
    generator and decorator layers, a dozen calls a message; with no span (metrics alone),
    nothing is made current."""

    __slots__ = ("_consumer", "_start", "_token", "error_type", "span")

    def __init__(self, consumer: Consumer, span: Span) -> None:
        self._consumer = consumer
        self.span = span
        self.error_type = None
        self._token: Token[Context] | None = None

    def __enter__(self) -> Processing:
        if self.span is not INVALID_SPAN:
            self._token = context.attach(trace.set_span_in_context(self.span))
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
        instruments.process_duration.record(time.perf_counter() - self._start, attributes)
        count.value += 1
        span = self.span
        if self._token is None:  # no span
            return None
        context.detach(self._token)
        if isinstance(exc, Exception) and span.is_recording():
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        span.end()
        return None

    def failed(self, error_type: str, text: str, stacktrace: str = "") -> None:
        self.error_type = error_type
        self.span.set_attribute(ERROR_TYPE, error_type)
        text = mask_secrets(text)[:300]
        self.span.set_status(Status(StatusCode.ERROR, text))
        if stacktrace:
            self.span.add_event("exception", {
                "exception.type": error_type, "exception.message": text,
                "exception.stacktrace": mask_secrets(stacktrace)})

    def redelivery(self, count: int) -> None:
        self.span.add_event(REDELIVERY_EVENT, {DELIVERY_COUNT: count})

    def moved(self, target: Destination) -> None:
        self.span.add_event(ERROR_DESTINATION_EVENT, {DESTINATION: str(target)})

    def already_processed(self) -> None:
        self.span.set_attribute(ALREADY_PROCESSED, True)

    def given_up(self, outcome: str) -> None:
        self.span.add_event(STUCK_EVENT, {OUTCOME: outcome})


class Consumer:
    """The telemetry of one listener's consumer: its subscription on one broker, for one pool
    slot. What every ``process`` span and data point of its deliveries shares is worked out
    once, here."""

    def __init__(self, system: str, destination: Destination, subscription: str | None,
                 shared: bool) -> None:
        recorded = attributes(system, destination, "process")
        if subscription:
            recorded[SUBSCRIPTION] = subscription
            if shared:
                recorded["messaging.consumer.group.name"] = subscription
        self._attributes = recorded
        self.metric = metric_attributes(recorded)
        self.consumed = instruments.consumed.of(self.metric)
        self._failures: dict[str, tuple[Count, Attributes]] = {}
        self._span_name = f"{PROCESS} {destination}"
        self._record_bodies = record_bodies()

    def processing(self, headers: Mapping[str, str], message_id: str, body: bytes,
                   delivery_count: int, redelivered: bool) -> Processing:
        """A ``process <destination>`` CONSUMER span, child of the context in ``headers``; to
        be entered."""
        if not tracing_on():
            if not metrics_on():  # the fast path: nobody is listening
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

    def failures(self, error_type: str) -> tuple[Count, Attributes]:
        """The count and the data points' attributes of deliveries that failed with
        ``error_type``."""
        found = self._failures.get(error_type)
        if found is None:
            attributes = self.metric | {ERROR_TYPE: error_type}
            found = self._failures[error_type] = (instruments.consumed.of(attributes),
                                                  attributes)
        return found


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
