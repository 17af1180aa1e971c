"""``Splitter``: the bytes read from a STOMP connection, cut into frames.

It cuts exactly where stomp.py's own receiver does (``BaseTransport.__read``), so that what
``mdb_stomp.reassembly`` knows of stomp.py's cuts holds: a frame ends at the first NUL byte,
unless the ``content-length`` header before the blank line says its body is longer (a body may
hold NULs); line breaks right after a NUL are skipped. Line breaks where a frame would begin are
heart-beats. Pure: it is fed by the event loop (``mdb_stomp.reading``).
"""

from __future__ import annotations

from mdb_stomp.reassembly import CONTENT_LENGTH, HEADERS_END

#: What a heart-beat is handed on as (one per run of line breaks between frames).
HEARTBEAT = b"\n"


class Splitter:
    """Buffers a connection's bytes and hands back each frame once it is whole (without its
    NUL) and each heart-beat as ``HEARTBEAT``."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[bytes]:
        """The frames and heart-beats that ``data`` completes, in the order they were read."""
        buffer = self._buffer + data
        frames: list[bytes] = []
        while buffer:
            start = _after_line_breaks(buffer, 0)
            if start:
                frames.append(HEARTBEAT)
                buffer = buffer[start:]
                continue
            end = buffer.find(b"\x00")
            if end < 0:
                break
            head = HEADERS_END.search(buffer, 0, end)
            if head is not None:
                length = CONTENT_LENGTH.search(buffer, 0, head.start())
                if length is not None:
                    size = head.end() + int(length.group(1))
                    if size > end:  # the body holds NULs: wait for all of it and its NUL
                        if size >= len(buffer):
                            break
                        end = size
            frames.append(buffer[:end])
            buffer = buffer[_after_line_breaks(buffer, end + 1):]
        self._buffer = buffer
        return frames

    def __len__(self) -> int:
        """Bytes held for a frame not yet whole."""
        return len(self._buffer)


def _after_line_breaks(data: bytes, at: int) -> int:
    """Where the run of ``\\n`` and ``\\r\\n`` starting at ``at`` ends."""
    while True:
        if data.startswith(b"\n", at):
            at += 1
        elif data.startswith(b"\r\n", at):
            at += 2
        else:
            return at
