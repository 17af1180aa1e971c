"""What became of each message, read from the container's own OpenTelemetry spans: every
delivery's ``process`` span says how it ended (processed, redelivered, moved to the error
destination, given up), and the ``send`` spans say where handlers sent (kept only once the
handler's delivery succeeded: the sends of a failed one were aborted). Spans are the same on
every broker, so the kit needs nothing from the broker to follow a message.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.trace import SpanKind

from mdb.errors import ConfigurationError
from mdb.observability.telemetry import names

PROCESSED = "processed"
ALREADY_PROCESSED = "already processed"  # exactly-once: a copy the inbox knew, not run
REDELIVERED = "redelivered"
MOVED = "moved to the error destination"
NOT_SETTLED = "not settled"  # a broker error; the broker redelivers it


@dataclass(frozen=True)
class Attempt:
    """One delivery of a message to one listener, as its ``process`` span ended.

    ``outcome`` is ``processed``, ``already processed`` (an exactly-once listener's copy of a
    message it processed before: settled without running), ``redelivered``, ``moved to the
    error destination``, ``dead-lettered`` or ``kept`` (given up to the broker), or ``not
    settled``. ``exception``
    is what the handler raised, when it ran in this process."""

    destination: str
    subscription: str | None
    delivery_count: int
    outcome: str
    error_type: str | None = None
    error_text: str | None = None
    moved_to: str | None = None
    exception: BaseException | None = None

    FINAL: ClassVar[frozenset[str]] = frozenset({PROCESSED, ALREADY_PROCESSED, MOVED,
                                                 names.DEAD_LETTERED, names.KEPT})

    @property
    def final(self) -> bool:
        """Nothing more will happen to this copy of the message."""
        return self.outcome in self.FINAL

    def __str__(self) -> str:
        failure = f" after {self.error_type}: {self.error_text}" if self.error_type else ""
        outcome = (f"moved to {self.moved_to}" if self.outcome == MOVED and self.moved_to
                   else self.outcome)
        return f"delivery {self.delivery_count} on {self.destination}: {outcome}{failure}"


class Tracker:
    """The attempts and expected deliveries of every message seen while it is installed.

    ``expected`` maps a message id to the destinations it was sent to for sure (by the kit, by
    code outside any handler, by a handler whose delivery succeeded, or as a copy moved to an
    error destination); ``copies`` how many copies of it were sent, when more than one.
    ``on_change`` is called on the event loop after each change."""

    def __init__(self, on_change: Callable[[], None]) -> None:
        self.attempts: dict[str, list[Attempt]] = {}
        self.expected: dict[str, list[str]] = {}
        self.copies: dict[str, int] = {}
        self._on_change = on_change
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._lock = threading.Lock()
        self._open: set[int] = set()  # process spans not ended yet
        self._held_sends: dict[int, list[tuple[str, str]]] = {}  # by the process span
        self._raised: dict[int, BaseException] = {}  # what a handler raised, by process span

    def expect(self, message_id: str, destination: str) -> None:
        with self._lock:
            self._expect(message_id, destination)
        self._changed()

    def again(self, message_id: str) -> None:
        """One more copy of ``message_id`` was sent: each of its listeners must end it too."""
        with self._lock:
            self.copies[message_id] = self.copies.get(message_id, 1) + 1
        self._changed()

    def _expect(self, message_id: str, destination: str) -> None:
        destinations = self.expected.setdefault(message_id, [])
        if destination not in destinations:
            destinations.append(destination)

    def raised(self, exc: BaseException) -> None:
        """A handler raised ``exc`` inside the current ``process`` span."""
        span_id = trace.get_current_span().get_span_context().span_id
        with self._lock:
            self._raised[span_id] = exc

    def started(self, span: Span) -> None:
        if _is_process(span):
            with self._lock:
                self._open.add(span.context.span_id)

    def ended(self, span: ReadableSpan) -> None:
        attributes = span.attributes or {}
        message_id = str(attributes.get(names.MESSAGE_ID, ""))
        if not message_id or span.context is None:
            return
        span_id = span.context.span_id
        with self._lock:
            if _is_process(span):
                self._open.discard(span_id)
                attempt = _attempt(span, self._raised.pop(span_id, None))
                self.attempts.setdefault(message_id, []).append(attempt)
                held = self._held_sends.pop(span_id, [])
                if attempt.outcome == PROCESSED:
                    for sent_id, destination in held:
                        self._expect(sent_id, destination)
                if attempt.moved_to is not None:
                    self._expect(message_id, attempt.moved_to)
            elif span.kind is SpanKind.PRODUCER and names.ERROR_TYPE not in attributes:
                destination = str(attributes.get(names.DESTINATION, ""))
                parent = span.parent.span_id if span.parent is not None else None
                if parent in self._open:
                    self._held_sends.setdefault(parent, []).append((message_id, destination))
                else:
                    self._expect(message_id, destination)
            else:
                return
        self._changed()

    def _changed(self) -> None:
        if threading.get_ident() == self._loop_thread:
            self._on_change()
        else:
            self._loop.call_soon_threadsafe(self._on_change)


def _is_process(span: ReadableSpan) -> bool:
    return span.kind is SpanKind.CONSUMER and span.name.startswith(f"{names.PROCESS} ")


def _attempt(span: ReadableSpan, exception: BaseException | None) -> Attempt:
    attributes = span.attributes or {}
    error_type = attributes.get(names.ERROR_TYPE)
    events = {event.name: event.attributes or {} for event in span.events}
    outcome, moved_to = PROCESSED, None
    if names.ERROR_DESTINATION_EVENT in events:
        outcome = MOVED
        moved_to = str(events[names.ERROR_DESTINATION_EVENT].get(names.DESTINATION))
    elif names.STUCK_EVENT in events:
        outcome = str(events[names.STUCK_EVENT].get(names.OUTCOME))
    elif names.REDELIVERY_EVENT in events:
        outcome = REDELIVERED
    elif error_type is not None:
        outcome = NOT_SETTLED
    elif attributes.get(names.ALREADY_PROCESSED):
        outcome = ALREADY_PROCESSED
    subscription = attributes.get(names.SUBSCRIPTION)
    count = attributes.get(names.DELIVERY_COUNT, 1)
    return Attempt(
        destination=str(attributes.get(names.DESTINATION, "")),
        subscription=None if subscription is None else str(subscription),
        delivery_count=count if isinstance(count, int) else 1,
        outcome=outcome,
        error_type=None if error_type is None else str(error_type),
        error_text=span.status.description if error_type is not None else None,
        moved_to=moved_to,
        exception=exception,
    )


class _Dispatch(SpanProcessor):
    """The one span processor the kit adds to the tracer provider (a provider cannot drop
    one): it hands spans to the trackers installed now."""

    def __init__(self) -> None:
        self.trackers: list[Tracker] = []

    def on_start(self, span: Span, parent_context: otel_context.Context | None = None) -> None:
        for tracker in list(self.trackers):
            tracker.started(span)

    def on_end(self, span: ReadableSpan) -> None:
        for tracker in list(self.trackers):
            tracker.ended(span)


_dispatch: _Dispatch | None = None


def install(tracker: Tracker) -> Callable[[], None]:
    """Feed ``tracker`` every span from now on; returns the function that stops it. Sets an
    SDK tracer provider when none was set (mdb then traces, with no exporter unless the
    ``OTEL_*`` variables or the test set one)."""
    global _dispatch
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        trace.set_tracer_provider(TracerProvider())
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        raise ConfigurationError(
            f"mdb.testing follows messages through OpenTelemetry spans and needs the SDK's "
            f"TracerProvider; this process set a {type(provider).__name__}")
    if _dispatch is None:
        _dispatch = _Dispatch()
        provider.add_span_processor(_dispatch)
    dispatch = _dispatch
    dispatch.trackers.append(tracker)
    return lambda: dispatch.trackers.remove(tracker)
