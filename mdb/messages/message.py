"""Messages as the core sees them: a delivery handed to a handler (``Message``), a message to send
(``OutgoingMessage``), and the ids mdb gives them. Their headers' names are
``mdb.messages.headers``."""

from __future__ import annotations

import dataclasses
import hashlib
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

from mdb.errors import EncodeError
from mdb.messages.destinations import Destination
from mdb.messages.headers import CONTENT_TYPE, CONTENT_TYPE_PROPERTY

MAX_COUNT = 1_000_000_000
"""The highest count read from a header (``count_of``): above any ``Redelivery.limit``, and
small enough for every span attribute and header that shows it."""
_WHOLE = re.compile(r"\s*(?P<sign>[+-]?)0*(?P<digits>[0-9]+)\s*")


def count_of(text: str | None) -> int | None:
    """A count header (``mdb_delivery_count``, ``mdb_replays``) read as untrusted input: any
    producer may set it (the count is advisory, docs/security.md). A whole number of ASCII
    digits, whatever its length, is clamped to ``0..MAX_COUNT``; anything else (other digits,
    which ``str.isdigit`` takes and ``int`` may not, a sign, a fraction, none) is None."""
    whole = None if text is None else _WHOLE.fullmatch(text)
    if whole is None or whole["sign"] == "-":
        return None
    digits = whole["digits"]
    # Judged by length before int() reads it: int() refuses more than a few thousand digits.
    if len(digits) > len(str(MAX_COUNT)):
        return MAX_COUNT
    return min(int(digits), MAX_COUNT)


def new_id() -> str:
    return uuid.uuid4().hex


def derived_id(incoming: str, subscription: str, listener: str, index: int) -> str:
    """The ``mdb_id`` of send number ``index`` (from 0) that ``listener``'s handler makes while
    processing message ``incoming`` from ``subscription``: the same in every processing of that
    message (a send made again after a redelivery is recognisable as a repeat), another for
    any other send. Shaped like ``new_id``'s."""
    key = "\0".join((subscription, listener, incoming, str(index)))
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def content_type_of(headers: Mapping[str, str]) -> str | None:
    """The content type ``headers`` declare: ``content-type`` (mdb writes it, as other STOMP
    producers do), else ``mdb_content_type`` (which a Java producer can set)."""
    return headers.get(CONTENT_TYPE) or headers.get(CONTENT_TYPE_PROPERTY)


def labelled(headers: Mapping[str, str], content_type: str) -> dict[str, str]:
    """``headers`` with the content type they declare (``content_type_of``), else
    ``content_type``, under both its names."""
    declared = content_type_of(headers) or content_type
    merged = {CONTENT_TYPE: declared, CONTENT_TYPE_PROPERTY: declared, **headers}
    merged[CONTENT_TYPE] = merged[CONTENT_TYPE_PROPERTY] = declared
    return merged


@dataclass(frozen=True, slots=True)
class ReplyAddress:
    """Where a received message asks for its reply, as the broker wrote it.

    It is opaque to the core: the adapter that delivered the message made it, and only an
    adapter of the same kind reads it, to send a reply on the same broker (a JMS temporary
    queue, ``/remote-temp-queue/ID:...`` on ActiveMQ; ``/reply-queue/...`` on RabbitMQ; or a
    plain queue or topic). ``str()`` shows it for logs and spans.
    """

    address: str

    def __str__(self) -> str:
        return self.address


ReplyTo = Destination | ReplyAddress
"""A reply-to of an outgoing message: a logical destination (``queue:x``), which the adapter
maps to its broker's form, or the ``ReplyAddress`` of a received message."""


@dataclass(frozen=True, slots=True)
class Message:
    """One delivery of a message, as handed to a handler through its Context."""

    id: str
    destination: Destination
    body: bytes
    headers: Mapping[str, str]
    redelivered: bool
    delivery_count: int
    reply_to: ReplyAddress | None = None
    correlation_id: str | None = None
    by_content: bool = False
    """It came with no id of any kind: ``id`` is a digest of its content
    (``mdb.messages.identity``), which a second message of that content shares."""

    @property
    def content_type(self) -> str | None:
        """The content type its producer declared (``content_type_of``), if any."""
        return content_type_of(self.headers)


@dataclass(frozen=True, slots=True)
class OutgoingMessage:
    """A message to send. ``headers`` always carries ``mdb_id``. ``reply_to`` and
    ``correlation_id`` are the JMS fields of the same names; each adapter maps them to its
    protocol (STOMP ``reply-to`` and ``correlation-id``), the core never names a header.

    ``copy_of`` is set on a copy mdb re-sends of a received message (for a redelivery, to an
    error destination): the headers of that delivery, all of them, as the adapter delivered
    them. The adapter carries over those of its protocol that make the copy the same message
    (on ActiveMQ its JMS type, priority, expiration and persistence; see ``Dialect.copy``),
    but for the expiry of an error copy or a replay, which it writes as ``ORIGINAL_EXPIRY`` instead
    (``mdb.messages.copies.outlives_original``); the core only says whose copy it is.

    ``delay`` is how many seconds the broker holds the message back before any consumer can
    receive it (a redelivery's delay); 0 for none. The core sets it only on a send to a queue,
    on a connection whose broker can hold one (``Capabilities.cannot_hold_delays`` is None).
    Held messages are the broker's: they wait in its store like any other (a transacted one
    from the commit on) and survive the sender."""

    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)
    reply_to: ReplyTo | None = None
    correlation_id: str | None = None
    copy_of: Mapping[str, str] | None = None
    delay: float = 0.0

    @property
    def content_type(self) -> str | None:
        return content_type_of(self.headers)


def addressed(message: OutgoingMessage, reply_to: str | Destination | None,
              correlation_id: str | None) -> OutgoingMessage:
    """``message`` with a reply-to (mdb's destination syntax, ``queue:NAME``) and a
    correlation id, where given."""
    if reply_to is None and correlation_id is None:
        return message
    return dataclasses.replace(
        message, reply_to=None if reply_to is None else Destination.parse(reply_to),
        correlation_id=correlation_id)


def refuse_nul(headers: Mapping[str, str]) -> None:
    """Raise ``EncodeError`` naming the first header whose name or value holds a NUL byte.

    mdb refuses such a header rather than encoding it: STOMP ends a frame at a NUL and its
    header escapes (``\\r \\n \\c \\\\``) have none for it, so a broker would hand
    consumers a frame cut in two (see docs/security.md)."""
    for name, value in headers.items():
        if "\0" in name or "\0" in value:
            raise EncodeError(f"header {name!r}: a NUL byte cannot be sent in a header")


# The largest body ``mdb send --file`` reads and an outbox row keeps: well inside the frames
# the brokers take by default (ActiveMQ's STOMP `maxFrameSize`, 100 MiB, and RabbitMQ 3.x's
# `max_message_size`, 128 MiB), headers included. A broker refuses a larger one by dropping
# the connection, which says nothing against the message: an outbox would send it for ever.
MAX_BODY_BYTES = 64 * 1024 * 1024
