"""What goes into and comes out of STOMP frames, as pure functions of their inputs."""

from __future__ import annotations

from mdb.message import OutgoingMessage, refuse_nul
from mdb_stomp.dialect import Dialect

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


def send_headers(message: OutgoingMessage, dialect: Dialect) -> dict[str, str]:
    """The headers of a SEND of ``message``: its own (names escaped, the frame's structural
    ones left out) with the dialect's added over them. The caller adds ``receipt`` or
    ``transaction``. ``EncodeError`` for a header holding a NUL byte, which would end the
    frame early: nothing is written then."""
    refuse_nul(message.headers)
    headers = {
        escape_name(name): str(value)
        for name, value in message.headers.items()
        if name not in FRAME_HEADERS
    }
    headers.update(dialect.send_headers(message))
    return headers


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
