"""stomp.py's DEBUG lines without message bodies.

At DEBUG, stomp.py logs every frame it receives (``received frame: cmd, headers=..., body=...``)
and sends (``sending frame: [...]``, the frame's pieces with the body last); the frames mdb
encodes and writes itself (``frames.encode``) are logged in the same words on the same logger
(``log_sent``). mdb promises that
bodies reach logs only with ``MDB_TRACE_BODIES=true`` (docs/security.md), so ``HiddenBodies``,
which the package puts on stomp.py's logger (``mdb.observability.logs.quiet_library``), rewrites
those lines to show the body's size instead. The command and headers stay: they are what a DEBUG log
is read for.
"""

from __future__ import annotations

import ast
import logging

from mdb.observability.telemetry.providers import record_bodies

STOMP_LOGGER = "stomp.py"
STOMP_LOG = logging.getLogger(STOMP_LOGGER)
_RECEIVED = "received frame: %r, headers=%r, body=%r"
_SENT = "sending frame: %s"
_FRAME_END = b"\x00"
_BLANK_LINE = b"\n"


class HiddenBodies(logging.Filter):
    """Replaces the body in stomp.py's frame lines by its size, unless bodies are traced."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg not in (_RECEIVED, _SENT) or record.args is None or record_bodies():
            return True
        args = tuple(record.args) if isinstance(record.args, tuple) else (record.args,)
        if record.msg == _RECEIVED and len(args) == 3:
            record.args = (*args[:2], _size(args[2]))
        elif record.msg == _SENT and len(args) == 1:
            record.args = (sent_frame_without_body(str(args[0])),)
        return True


def log_sent(frame: bytes) -> None:
    """stomp.py's DEBUG line for ``frame`` (encoded, as it is written), as stomp.py would have
    logged it: the repr of its pieces, one per header line."""
    head, _, rest = frame.partition(b"\n\n")
    command, *lines = head.split(b"\n")
    body = [rest[:-1]] if len(rest) > 1 else []
    pieces = [command, b"\n", *(line + b"\n" for line in lines), b"\n", *body, _FRAME_END]
    STOMP_LOG.debug(_SENT, pieces)


def sent_frame_without_body(pieces: str) -> str:
    """stomp.py's text of a frame it sends — the ``repr`` of its pieces: command, line feed,
    header lines, line feed, body (when there is one), NUL — with the body replaced by its
    size. A text of another shape is not shown at all: it might hold a body."""
    try:
        parts = ast.literal_eval(pieces)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return "<frame not shown: it may hold a body>"
    if not (isinstance(parts, list) and len(parts) >= 3 and parts[-1] == _FRAME_END):
        return "<frame not shown: it may hold a body>"
    if parts[-2] != _BLANK_LINE:  # the body is the piece before the NUL
        parts[-2] = _size(parts[-2])
    return repr(parts)


def _size(body: object) -> str:
    return f"<body of {len(body) if isinstance(body, bytes | str) else '?'} bytes not shown>"

