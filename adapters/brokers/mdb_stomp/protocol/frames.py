"""What goes into and comes out of STOMP frames, as pure functions of their inputs (and the log
line of a copy not sent because it expires first), and the bytes of a frame mdb writes
(``encode``)."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Literal

from mdb.errors import ConfigurationError, EncodeError
from mdb.messages.destinations import Destination, Kind
from mdb.messages.headers import ID
from mdb.messages.message import OutgoingMessage, ReplyAddress, ReplyTo, refuse_nul
from mdb.seam.broker import Delivery
from mdb_stomp.dialects.dialect import Dialect

log = logging.getLogger("mdb_stomp")

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
        escaped(name): str(value)
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
               dialect: Dialect) -> dict[str, str] | None:
    """The headers of a SEND of ``message`` to ``target`` (``send_headers``), its STOMP
    ``destination`` among them; for one with a ``delay``, where the dialect has the broker
    hold it back (``Dialect.delayed``), at least that long to the millisecond. None, saying
    so in the log, for a copy that expires first, which is not sent (``Dialect.outlived``).
    ``EncodeError``, before anything is written, for a header holding a NUL byte or a delay
    on a send to anything but a queue."""
    headers = send_headers(message, dialect, target)
    delay_ms = math.ceil(message.delay * 1000) if message.delay > 0 else 0
    queue = target if isinstance(target, Destination) and target.kind is Kind.QUEUE else None
    if delay_ms and queue is None:
        raise EncodeError(f"{target}: only a send to a queue can be delayed")
    if dialect.outlived(message, headers, delay_ms):
        log.info("message %s expires before it could be delivered from %s: its copy is not "
                 "sent (the broker would drop it)", message.headers.get(ID), target)
        return None
    if not delay_ms or queue is None:
        headers["destination"] = dialect.address(target)
        return headers
    path, held = dialect.delayed(queue, delay_ms, headers)
    headers.update(held)
    headers["destination"] = path
    return headers


def _logical(reply_to: str | None) -> Destination | None:
    """A ``reply-to`` header the application wrote in mdb's syntax (``queue:x``), which the
    broker would otherwise keep as a plain property; None for one in the broker's form."""
    if reply_to is None or reply_to.startswith("/"):
        return None
    try:
        return Destination.parse(reply_to)
    except ConfigurationError:
        return None


def delivery_of(dialect: Dialect, destination: Destination, headers: dict[str, str],
                body: bytes | str | None, damage: str | None, token: object) -> Delivery:
    """The ``Delivery`` of a MESSAGE frame with ``headers`` and ``body`` from ``destination``,
    as ``dialect``'s broker sent it (``damage``: what the wire found wrong with the frame),
    settled with ``token`` (None for one that is never settled)."""
    reply_to, correlation_id = reply_fields(headers)
    content = body if isinstance(body, bytes) else text(body).encode()
    return Delivery(destination=destination, body=content, headers=headers,
                    message_id=dialect.message_id(headers),
                    broker_redelivered=headers.get("redelivered") == "true", token=token,
                    protocol_headers=dialect.protocol_headers, reply_to=reply_to,
                    correlation_id=correlation_id,
                    problem=dialect.problem(headers, content, damage))


def reply_fields(headers: Mapping[str, str]) -> tuple[ReplyAddress | None, str | None]:
    """The reply-to and correlation id of a received MESSAGE (``Delivery`` fields)."""
    reply_to = headers.get(REPLY_TO)
    return (ReplyAddress(reply_to) if reply_to else None), headers.get(CORRELATION_ID)


#: The frames mdb writes itself (CONNECT, DISCONNECT and heart-beats are stomp.py's).
Command = Literal["SUBSCRIBE", "UNSUBSCRIBE", "SEND", "ACK", "NACK", "BEGIN", "COMMIT", "ABORT"]


def escaped(text: str) -> str:
    """A header name or value escaped as STOMP 1.2 requires (stomp.py escapes values only),
    by stomp.py's chain of ``replace``: the backslash first, which none of the later ones
    touches again. Each ``replace`` is one search of the text; a ``str.translate`` with the
    same table looks every character up, some 15 times as long on an ActiveMQ ack id, which
    every ACK carries (docs/performance.md, "Profile")."""
    return (text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
            .replace(":", "\\c"))


def encode(command: Command, headers: Mapping[str, str], body: bytes = b"") -> bytes:
    """The frame as stomp.py's ``Protocol12`` puts it on the wire, byte for byte: the
    command, the headers sorted by name with their values escaped (names as given:
    ``send_headers`` escapes them), ``content-length`` on a SEND with a body, the body and a
    NUL. Made here rather than by stomp.py's ``send_frame`` and ``transmit``, which copy the
    headers, take a lock, tell every listener and encode each line apart: about 15 Python and
    35 C calls per frame, four frames per transacted send (docs/performance.md, "Profile")."""
    if body and command == "SEND":
        headers = {**headers, "content-length": str(len(body))}
    lines = "".join([f"{name}:{escaped(value)}\n"
                     for name, value in sorted(headers.items())])
    return f"{command}\n{lines}\n".encode("utf-8", "replace") + body + b"\0"


def text(body: bytes | str | None) -> str:
    """A frame body as text (undecodable bytes replaced); empty for none."""
    if body is None:
        return ""
    return body if isinstance(body, str) else body.decode("utf-8", "replace")
