"""The ``send <destination>`` PRODUCER span of every message mdb sends, whose W3C trace context
(``traceparent``, ``tracestate``, ``baggage``) the message carries, and the count of sent
messages (docs/tracing.md)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind

from mdb.errors import error_type
from mdb.messages.destinations import Destination
from mdb.messages.message import OutgoingMessage, ReplyAddress, ReplyTo
from mdb.observability.telemetry import instruments
from mdb.observability.telemetry.instruments import Count
from mdb.observability.telemetry.names import (
    DESTINATION,
    DESTINATION_TEMPLATE,
    ERROR_TYPE,
    MESSAGE_ID,
    REPLY_TO,
)
from mdb.observability.telemetry.providers import (
    attributes,
    metric_attributes,
    record_bodies,
    tracing_on,
)

_tracer = trace.get_tracer("mdb")


@contextmanager
def sending(system: str, destination: ReplyTo, message: OutgoingMessage,
            ) -> Iterator[OutgoingMessage]:
    """A ``send <destination>`` PRODUCER span around a send; yields ``message`` with the
    span's trace context in its headers, which is what must be sent."""
    if not tracing_on():  # the fast path: nothing would record the span
        yield message
        _sent_count(system, destination).value += 1
        return
    recorded = attributes(system, destination, "send")
    recorded[MESSAGE_ID] = message.headers.get("mdb_id", "")
    recorded["messaging.message.body.size"] = len(message.body)
    with _tracer.start_as_current_span(f"send {destination}", kind=SpanKind.PRODUCER,
                                       attributes=recorded) as span:
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


# (system, destination, or None for every reply address): its count of sent messages
_sent_to: dict[tuple[str, Destination | None], Count] = {}


def _sent_count(system: str, destination: ReplyTo) -> Count:
    # A reply address comes from the message replied to, not from mdb's settings: each
    # requester's temporary queue is another. All of them are counted as one, under
    # REPLY_TO, so that neither this map nor /metrics grows with the requesters
    # (docs/security.md, "Hostile input: the operator's files and the health endpoint's
    # clients"); the span of each send still names its address.
    target = None if isinstance(destination, ReplyAddress) else destination
    count = _sent_to.get((system, target))
    if count is None:
        counted = metric_attributes(attributes(system, destination, "send"))
        if target is None:
            del counted[DESTINATION]
            counted[DESTINATION_TEMPLATE] = REPLY_TO
        count = _sent_to[system, target] = instruments.sent.of(counted)
    return count
