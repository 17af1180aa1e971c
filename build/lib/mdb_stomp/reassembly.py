"""MESSAGE frames that stomp.py cut at a NUL byte inside them, joined again.

Another producer may put a NUL byte in a header (STOMP has no escape for it). ActiveMQ and
RabbitMQ store and forward it as it is, and stomp.py ends the frame at that NUL: the consumer
gets a head with part of the headers and no body — without ``subscription`` on ActiveMQ (whose
custom headers come first), without its body on RabbitMQ — and a tail it parses as a frame of
an unknown command and drops (measured, issue 11 finding 1). A valid frame always has the blank
line that ends its headers, and as many body bytes as its ``content-length`` says; a MESSAGE
frame without them is a head, joined with the next pieces (and the NULs between them) until it
is whole. stomp.py skips line breaks right after a NUL, so a line break that followed one is
lost: the header holding the NUL then runs into the next one. What was joined is reported as
cut, so that the message is never handed to a handler as it is.

Pure and used by one thread (stomp.py's receiver): ``Joiner.feed`` takes the raw frames in the
order stomp.py read them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

HEADERS_END = re.compile(rb"\r?\n\r?\n")
CONTENT_LENGTH = re.compile(rb"^content-length:[ \t]*([0-9]+)", re.MULTILINE)
# A head still waiting for its rest after this many bytes is given up: nothing this large waits.
MAX_JOINED = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Whole:
    """A frame as the broker wrote it (as far as it can be told), ``cut`` when it was joined
    from pieces stomp.py split at NUL bytes, or given up on (``complete`` false)."""

    raw: bytes
    cut: bool
    complete: bool


def is_complete(frame: bytes) -> bool:
    """Whether ``frame`` (without its final NUL) has the end of its headers and at least as
    many body bytes as its ``content-length`` says."""
    end = HEADERS_END.search(frame)
    if end is None:
        return False
    length = CONTENT_LENGTH.search(frame, 0, end.start())
    return length is None or len(frame) - end.end() >= int(length.group(1))


class Joiner:
    """Joins the pieces of MESSAGE frames cut at NUL bytes; other frames pass through."""

    def __init__(self) -> None:
        self._head: bytes | None = None

    def feed(self, raw: bytes) -> Whole | None:
        """The frame ``raw`` completes, or None while it is the head (or a middle piece) of a
        frame still waiting for its rest."""
        if self._head is None:
            if raw.startswith(b"MESSAGE") and not is_complete(raw):
                self._head = raw
                return None
            return Whole(raw, cut=False, complete=True)
        joined = self._head + b"\x00" + raw
        if is_complete(joined):
            self._head = None
            return Whole(joined, cut=True, complete=True)
        if len(joined) > MAX_JOINED:
            self._head = None
            return Whole(joined, cut=True, complete=False)
        self._head = joined
        return None
