"""The frames a STOMP connection receives: cut from the bytes read (``Splitter``), their headers
parsed in the same pass, and each handed on (``FrameReader``).

Where a frame ends. Its headers end at the first blank line; with a ``content-length`` header,
its body is that many bytes (a body may hold NULs), else it ends at the first NUL. A NUL before
the blank line is a protocol error that another producer can cause: STOMP has no escape for it,
and ActiveMQ and RabbitMQ store and forward such a header as it is (measured). stomp.py would cut
the MESSAGE frame there, which loses the message: on ActiveMQ (custom headers first) the head
has no ``subscription``, on RabbitMQ (custom headers last) it has no body. Here a MESSAGE frame
keeps its whole headers and body and is marked damaged, so that it is never handed to a handler
as it is; any other frame ends at the NUL, as stomp.py ends it (the broker writes those, and a
frame without a blank line must not swallow the next ones). Line breaks where a frame would
begin are heart-beats; those right after a NUL end the frame before them.

Headers are decoded as UTF-8 (undecodable bytes replaced) and unescaped as stomp.py does; the
first of repeated headers counts.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import stomp.utils

from mdb_stomp.protocol.callbacks import WireEvents
from mdb_stomp.protocol.heartbeats import Heartbeats, Silence

_LENGTH = re.compile(r"[ \t]*([0-9]+)")
_MESSAGE = b"MESSAGE"
_NUL = b"\x00"
_LF, _CR = 0x0A, 0x0D
_LINE_BREAK = (_LF, _CR)
# A MESSAGE frame with a NUL in its headers still without their end after this many bytes is
# given up on: nothing this large waits.
MAX_HELD = 64 * 1024 * 1024

NUL_IN_HEADER = "a MESSAGE frame with a NUL byte in a header"
NEVER_ENDED = "a MESSAGE frame with a NUL byte in a header, whose headers never ended"
NO_SUBSCRIPTION = "a MESSAGE frame without a subscription header"


class InboundFrame(NamedTuple):
    """One frame as read: ``damage`` says what was wrong with a MESSAGE frame (None when
    nothing was); ``raw`` is the frame's bytes without its NUL, kept for the frames handed to
    stomp.py (its log of a frame of unknown command gives their length)."""

    command: str
    headers: dict[str, str]
    body: bytes
    damage: str | None = None
    raw: bytes = b""


#: What a heart-beat is handed on as (one per run of line breaks between frames).
HEARTBEAT = InboundFrame("heartbeat", {}, b"", raw=b"\n")


class Splitter:
    """Buffers a connection's bytes and hands back each frame once it is whole, and each
    heart-beat as ``HEARTBEAT``. Pure.

    The reads of a frame not yet whole are only held until as many bytes came as it needs
    (its ``content-length`` once its headers came): a large body arriving in many reads is
    neither copied nor parsed again at each one."""

    def __init__(self) -> None:
        self._held: list[bytes] = []  # the reads since the last whole frame
        self._size = 0  # their length
        self._wanted = 0  # the length they need before a frame can be whole
        # The parsed headers of the first frame held, while it waits for its body: command,
        # headers, damage, where its body starts and its content-length.
        self._waiting: tuple[str, dict[str, str], str | None, int, int] | None = None

    def feed(self, data: bytes) -> list[InboundFrame]:
        """The frames and heart-beats that ``data`` completes, in the order they were read."""
        held = self._held
        if held:
            held.append(data)
            self._size += len(data)
            if self._size < self._wanted:
                return []
            buffer = b"".join(held)
        else:
            buffer = data
        size = len(buffer)
        frames: list[InboundFrame] = []
        at = 0
        while at < size:
            if buffer[at] in _LINE_BREAK:
                start = _after_line_breaks(buffer, at, size)
                if start > at:
                    frames.append(HEARTBEAT)
                    at = start
                    continue
            cut = self._cut(buffer, at, size)
            if cut is None:
                self._wanted -= at
                break
            frame, end = cut
            if frame is not None:
                frames.append(frame)
            at = _after_line_breaks(buffer, end + 1, size)
        self._held = [buffer[at:]] if at < size else []
        self._size = size - at
        return frames

    def __len__(self) -> int:
        """Bytes held for a frame not yet whole."""
        return self._size

    def _cut(self, buffer: bytes, at: int, size: int) -> tuple[InboundFrame | None, int] | None:
        """The frame that starts at ``at`` and where its NUL is (None for a frame of nothing,
        which stomp.py skips too), or None while it is not whole: ``_wanted`` then says how long
        ``buffer`` must be before it can be."""
        self._wanted = size + 1
        if self._waiting is None:
            head = _blank_line(buffer, at, size)
            nul = buffer.find(_NUL, at, size if head is None else head[0])
            damage = None
            if nul >= 0:
                if not buffer.startswith(_MESSAGE, at):
                    return _parsed(buffer[at:nul], None), nul
                if head is None:
                    if size - at <= MAX_HELD:
                        return None
                    last = buffer.rfind(_NUL, at)
                    return _parsed(buffer[at:last], NEVER_ENDED), last
                damage = NUL_IN_HEADER
            elif head is None:
                return None
            head_end, body_start = head
            command, headers = _head(buffer[at:head_end])
            length = _content_length(headers)
        else:  # the frame at ``at`` (the first held) had its headers parsed by an earlier read
            command, headers, damage, body_start, length = self._waiting
            self._waiting = None
        if length is None:
            end = buffer.find(_NUL, body_start)
            if end < 0:
                return None
        else:
            # stomp.py's cut: at the NUL that ends as many body bytes as announced, or at the
            # first NUL past them.
            end = body_start + length
            if end >= size:
                self._wanted = end + 1
                self._waiting = command, headers, damage, body_start - at, length
                return None
            if buffer[end]:
                first = buffer.find(_NUL, body_start)
                if first < 0:
                    return None
                end = max(end, first)
        raw = b"" if command == "MESSAGE" else buffer[at:end]
        return InboundFrame(command, headers, buffer[body_start:end], damage, raw), end


def _parsed(raw: bytes, damage: str | None) -> InboundFrame | None:
    """A frame without the blank line that ends its headers: all headers, no body."""
    command, headers = _head(raw)
    return InboundFrame(command, headers, b"", damage, raw) if command else None


def _head(preamble: bytes) -> tuple[str, dict[str, str]]:
    """The command and the headers of a frame, from the bytes before its blank line."""
    text = preamble.decode("utf-8", "replace")
    lines = text.split("\n")
    if "\r" in text:
        lines = [line.removesuffix("\r") for line in lines]
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not (colon and name):
            continue
        if "\\" in line:
            if "\\\\" in line:
                [(name, value)] = stomp.utils.parse_headers([line]).items()
            else:  # ActiveMQ escapes the colons of every ack and message-id, not names
                value = _unescaped(value)
                if "\\" in name:
                    name = _unescaped(name)
        if name not in headers:
            headers[name] = value
    return lines[0], headers


def _unescaped(text: str) -> str:
    """``text`` with STOMP's header escapes undone as stomp.py undoes them, for a text without
    an escaped backslash: each backslash then starts an escape of its own (an unknown one is
    kept). stomp.py's own undoing costs about four times the calls."""
    if "\\" not in text:
        return text
    return text.replace("\\c", ":").replace("\\n", "\n").replace("\\r", "\r")


def _content_length(headers: dict[str, str]) -> int | None:
    value = headers.get("content-length")
    if value is None:
        return None
    digits = _LENGTH.match(value)
    return int(digits[1]) if digits else None


def _blank_line(data: bytes, at: int, size: int) -> tuple[int, int] | None:
    """Where the first blank line from ``at`` starts and ends (the line break before it
    included), or None before it was read. A line break is ``\\n`` or ``\\r\\n``."""
    first = data.find(b"\n\n", at)
    # Found by two searches of bytes rather than a pattern: what a pattern costs per frame.
    crlf = data.find(b"\n\r\n", at, size if first < 0 else first + 2)
    if crlf >= 0:
        first = crlf
    elif first < 0:
        return None
    start = first - 1 if first > at and data[first - 1] == _CR else first
    return start, first + (2 if data[first + 1] == _LF else 3)


def _after_line_breaks(data: bytes, at: int, size: int) -> int:
    """Where the run of ``\\n`` and ``\\r\\n`` starting at ``at`` ends."""
    while at < size:
        byte = data[at]
        if byte == _LF:
            at += 1
        elif byte == _CR and at + 1 < size and data[at + 1] == _LF:
            at += 2
        else:
            break
    return at


class FrameReader:
    """The bytes read from one connection (``mdb_stomp.protocol.reading``), on the loop: each read
    is timed, cut into frames, and each frame handed on.

    Every read is timed (``heartbeats.Silence``, with the limit the CONNECTED frame's
    ``heart-beat`` header sets through ``heartbeats``): from the first read after too long a
    silence on, nothing read goes further, and ``WireEvents.on_silence`` says so once - what arrives
    then may be what the broker wrote before it dropped the connection and handed the messages
    to another consumer. What was read before is judged again as it is handed on (``check``).
    ``heard_by`` (the stomp.py connection's ``on_heartbeat``) hears every
    read too, which keeps stomp.py's heart-beat timeout away.

    A MESSAGE frame goes straight to ``WireEvents.on_message``, or to
    ``WireEvents.on_damaged`` when it is damaged or lacks the ``subscription`` header that
    routes it (whether one without an
    ``ack`` header is damaged depends on its subscription: ``Wire.on_message``). So does a
    RECEIPT frame to ``WireEvents.on_receipt`` when it answers one of mdb's requests (two per
    transacted send: stomp.py's dispatch of a frame costs some 25 calls). Every other frame
    goes to stomp.py's ``process_frame``, which tells stomp.py's listeners (its heart-beats,
    its DISCONNECT's receipt, ``mdb_stomp.protocol.callbacks.StompCallbacks``)."""

    def __init__(self, process_frame: Callable[[Any, bytes], None], events: WireEvents,
                 heartbeats: Heartbeats, heard_by: Callable[[], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._process_frame = process_frame
        self._events = events
        self._heartbeats = heartbeats
        self._heard_by = heard_by
        self._clock = clock
        self._silence = Silence()
        self._told = False  # on_silence was called
        self._splitter = Splitter()

    def read(self, data: bytes) -> None:
        """``data`` was read from the socket just now."""
        silence = self._silence
        silence.heard(self._clock())
        self._heard_by()
        if silence.broken is not None:
            self._tell(silence.broken)
            return
        events = self._events
        for frame in self._splitter.feed(data):
            command, headers, body, damage, raw = frame
            if damage is not None:
                events.on_damaged(headers, body, damage)
            elif command == "MESSAGE":
                if "subscription" in headers:
                    events.on_message(headers, body)
                else:
                    events.on_damaged(headers, body, NO_SUBSCRIPTION)
            elif command == "RECEIPT" and events.on_receipt(headers.get("receipt-id")):
                continue
            elif frame is HEARTBEAT:
                self._process_frame(stomp.utils.HEARTBEAT_FRAME, raw)
            else:
                if command == "CONNECTED":
                    silence.limit = self._heartbeats.silence_limit(headers.get("heart-beat"))
                self._process_frame(stomp.utils.Frame(command, headers, body), raw)

    def check(self) -> None:
        """Something read earlier is about to be handed on (a buffered delivery to a handler):
        the silence since the last read counts as if a read came now. A process paused with
        deliveries buffered may resume and take one before the loop reads the socket again,
        while its broker gave up meanwhile and handed that delivery to another consumer."""
        silence = self._silence
        if silence.broken is None:
            silence.check(self._clock())
            if silence.broken is not None:
                self._tell(silence.broken)

    def _tell(self, broken: tuple[float, float]) -> None:
        if not self._told:
            self._told = True
            self._events.on_silence(*broken)
