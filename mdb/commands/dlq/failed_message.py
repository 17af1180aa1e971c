"""``Failed``: one message on an error destination, as mdb's headers describe its failure, read as
untrusted text (a count or a time that is not one is none), and what a listing or ``show``
prints of it (secrets masked, control characters escaped).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass
from datetime import UTC, datetime

from mdb.messages.destinations import Destination
from mdb.messages.headers import (
    DELIVERY_COUNT,
    ERROR_LISTENER,
    ERROR_MESSAGE,
    ERROR_TYPE,
    FAILED_AT,
    ID,
    ORIGINAL_DESTINATION,
)
from mdb.messages.identity import Seal, identity
from mdb.messages.message import content_type_of, count_of
from mdb.messages.topology import Member
from mdb.observability.redaction import MASK, mask_secrets, printable, secret_name
from mdb.seam.broker import Delivery

TEXT_LIMIT = 200
"""Characters of a failure's text a listing shows."""
BODY_LIMIT = 4096
"""Bytes of a body ``show`` decodes and prints (``--raw`` writes all of it)."""


@dataclass(frozen=True, slots=True)
class Failed:
    """One message on an error destination, as mdb's headers describe its failure."""

    id: str
    """The ``mdb_id`` it carries, else its identity (``mdb.messages.identity``: its broker's id, or
    a digest of its content)."""
    vouched: bool
    """``id`` is its identity as mdb knows it: it carries a proof of its ``mdb_id`` with this
    process's secret (mdb moved it there), or no ``mdb_id`` at all (``mdb.messages.identity``); else
    ``id`` is only what a producer wrote, or a proof this process cannot check."""
    member: Member
    """The error destination's member it is on."""
    original_destination: str
    """Where it failed, as ``mdb_original_destination`` says, else as its broker recorded it
    (``Capabilities.dead_letter_origin``: a message on the broker's own dead-letter queue);
    text, which a producer may have written ("" when nothing says)."""
    error_type: str
    error_message: str
    listener: str
    delivery_count: int
    failed_at: datetime | None
    body: bytes
    headers: Mapping[str, str]
    protocol_headers: frozenset[str] = frozenset()

    @classmethod
    def of(cls, delivery: Delivery, member: Member, seal: Seal, *, assigned: bool,
           origin: Destination | None = None) -> Failed:
        """``delivery`` of ``member``, its proof checked with ``seal``; ``assigned``: its
        broker gives messages ids of its own (``Capabilities.assigned_ids``); ``origin`` is
        where its broker says it was (``Capabilities.dead_letter_origin``)."""
        headers = delivery.headers
        recorded = "" if origin is None else str(origin)
        claimed = headers.get(ID)
        return cls(
            id=claimed or identity(delivery, seal, assigned=assigned).key,
            vouched=not claimed or seal.proves(delivery), member=member,
            original_destination=headers.get(ORIGINAL_DESTINATION) or recorded,
            error_type=headers.get(ERROR_TYPE, ""),
            error_message=headers.get(ERROR_MESSAGE, ""),
            listener=headers.get(ERROR_LISTENER, ""),
            delivery_count=count_of(headers.get(DELIVERY_COUNT)) or 1,
            failed_at=parsed_time(headers.get(FAILED_AT)),
            body=delivery.body, headers=headers,
            protocol_headers=delivery.protocol_headers)

    def summary(self) -> dict[str, object]:
        """What a listing shows of it: no body, the failure's text bounded, secrets masked.
        The values are as the headers say: whoever prints them escapes them for a terminal
        (``printable``, ``printable_json``)."""
        text = mask_secrets(self.error_message)
        return {"id": self.id, "broker": self.member.broker,
                "original_destination": self.original_destination,
                "listener": self.listener, "error_type": self.error_type,
                "error": text if len(text) <= TEXT_LIMIT else text[:TEXT_LIMIT - 1] + "…",
                "delivery_count": self.delivery_count,
                "failed_at": None if self.failed_at is None else self.failed_at.isoformat(),
                "body_bytes": len(self.body)}

    def shown_headers(self) -> dict[str, str]:
        """Its headers as ``show`` prints them: secrets masked (the whole value of a header
        whose name says it is one, ``mdb.observability.redaction.secret_name``), control characters
        escaped."""
        return {printable(k): printable(MASK if v and secret_name(k) else mask_secrets(v))
                for k, v in self.headers.items()}

    def shown_lines(self, header: str) -> list[str]:
        """A header's value as ``show`` prints it in its own section, a traceback's say:
        line by line, each with secrets masked and control characters escaped."""
        return [printable(mask_secrets(line))
                for line in self.headers.get(header, "").splitlines()]

    def shown_body(self, limit: int = BODY_LIMIT) -> str:
        """Its body as text for a person: JSON indented, text as it is, other bytes as a
        hexadecimal dump; at most ``limit`` bytes, saying how many more there are."""
        body, rest = self.body[:limit], max(0, len(self.body) - limit)
        try:
            text = body.decode()
        except UnicodeDecodeError:
            text = body.hex(" ", 2)
        else:
            if content_type_of(self.headers) == "application/json" and not rest:
                # Labelled JSON and is not, or nested too deeply to read: shown as it is.
                with suppress(ValueError, RecursionError):
                    text = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
            text = printable(text, lines=True)
        return text + (f"\n… {rest} more bytes" if rest else "")


def parsed_time(text: str | None) -> datetime | None:
    """A time header in UTC; None for one that is not an ISO 8601 time, or is one UTC's
    calendar cannot hold (a producer may write anything there)."""
    if not text:
        return None
    try:
        found = datetime.fromisoformat(text)
        return found.astimezone(UTC) if found.tzinfo is not None else found.replace(tzinfo=UTC)
    except (ValueError, OverflowError):
        return None
