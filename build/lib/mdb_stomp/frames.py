"""What goes into and comes out of STOMP frames, as pure functions of their inputs."""

from __future__ import annotations

import math
from collections.abc import Mapping

from mdb.destinations import Destination, Kind
from mdb.errors import ConfigurationError, EncodeError
from mdb.message import OutgoingMessage, ReplyAddress, ReplyTo, refuse_nul
from mdb_stomp.dialect import Dialect

REPLY_TO = "reply-to"
CORRELATION_ID = "correlation-id"

# Headers that structure a frame or describe one received delivery; the adapter sets its own.
FRAME_HEADERS = frozenset(
    {
        "destination",
        "content-length",
        "receipt",
        "transaction",
        "message-id",
        "subscription",
        "ack",
        "redelivered",
    }
)


def send_headers(message: OutgoingMessage, dialect: Dialect, target: ReplyTo,
                 ) -> dict[str, str]:
    """The headers of a SEND of ``message`` to ``target``: its own (names escaped, the frame's
    structural ones left out) with the dialect's added over them. The caller adds ``receipt``
    or ``transaction``. ``EncodeError`` for a header holding a NUL byte, which would end the
    frame early: nothing is written then."""
    refuse_nul(message.headers)
    headers = {
        escape_name(name): str(value)
        for name, value in message.headers.items()
        if name not in FRAME_HEADERS
    }
    headers.update(dialect.send_headers(message, target))
    # The JMS fields, as ActiveMQ (JMSReplyTo, JMSCorrelationID) and RabbitMQ read them.
    reply_to = message.reply_to or _logical(headers.get(REPLY_TO))
    if reply_to is not None:
        headers[REPLY_TO] = dialect.address(reply_to)
    if message.correlation_id is not None:
        headers[CORRELATION_ID] = message.correlation_id
    return headers


def send_frame(target: ReplyTo, message: OutgoingMessage,
               dialect: Dialect) -> tuple[str, dict[str, str]]:
    """The STOMP destination and the headers (``send_headers``) of a SEND of ``message`` to
    ``target``; for one with a ``delay``, where the dialect has the broker hold it back
    (``Dialect.delayed``), at least that long to the millisecond. ``EncodeError``, before
    anything is written, for a header holding a NUL byte or a delay on a send to anything but
    a queue."""
    headers = send_headers(message, dialect, target)
    if message.delay <= 0:
        return dialect.address(target), headers
    if not (isinstance(target, Destination) and target.kind is Kind.QUEUE):
        raise EncodeError(f"{target}: only a send to a queue can be delayed")
    path, held = dialect.delayed(target, math.ceil(message.delay * 1000))
    headers.update(held)
    return path, headers


def _logical(reply_to: str | None) -> Destination | None:
    """A ``reply-to`` header the application wrote in mdb's syntax (``queue:x``), which the
    broker would otherwise keep as a plain property; None for one in the broker's form."""
    if reply_to is None or reply_to.startswith("/"):
        return None
    try:
        return Destination.parse(reply_to)
    except ConfigurationError:
        return None


def reply_fields(headers: Mapping[str, str]) -> tuple[ReplyAddress | None, str | None]:
    """The reply-to and correlation id of a received MESSAGE (``Delivery`` fields)."""
    reply_to = headers.get(REPLY_TO)
    return (ReplyAddress(reply_to) if reply_to else None), headers.get(CORRELATION_ID)


def escape_name(name: str) -> str:
    """A header name escaped as STOMP 1.2 requires (stomp.py escapes header values only)."""
    if any(c in name for c in "\\\n\r:"):
        return (
            name.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r").replace(":", "\\c")
        )
    return name


def text(body: bytes | str | None) -> str:
    """A frame body as text (undecodable bytes replaced); empty for none."""
    if body is None:
        return ""
    return body if isinstance(body, str) else body.decode("utf-8", "replace")
