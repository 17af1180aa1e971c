"""The copies mdb re-sends of a message (for a redelivery, to an error destination, a refused
outbox row): the headers saying what failed (``with_failure``), and bounds, so that a broker
never refuses one because of the headers it inherited from a foreign producer.

A refused copy is worse than a failed handler: the delivery cannot be settled, the broker
drops the connection, redelivers the message and the copy is refused again. A copy keeps to
the limits every message mdb sends keeps to, its brokers' ``HeaderLimits``: the headers that
do not fit are left out, not refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime

from mdb import message as m
from mdb.broker import HeaderLimits

# mdb's own headers, kept first (cut to the line limit if need be); a producer may set any of
# them too, but there are only so many.
OWN = frozenset({m.ID, m.DELIVERY_COUNT, m.REDELIVERY_OF, m.ORIGINAL_DESTINATION, m.ERROR_TYPE,
                 m.ERROR_MESSAGE, m.ERROR_LISTENER, m.FAILED_AT, m.REPLAYS, m.CONTENT_TYPE,
                 m.CONTENT_TYPE_PROPERTY,
                 "traceparent", "tracestate"})


def bounded(headers: Mapping[str, str], limits: HeaderLimits) -> tuple[dict[str, str], int]:
    """``headers`` cut to ``limits``, and how many this left out. A NUL byte left in one (an
    exception's text) becomes U+FFFD: no frame can carry it, and a copy must be sent.

    mdb's own headers come first and are kept, a too-long value cut short (the error text);
    the others are kept in their order while they fit, and a header that does not fit is left
    out. When any is left out, ``mdb_headers_dropped`` says how many, those left out by an
    earlier bounding of the same headers included."""
    headers = {k.replace("\0", "\ufffd"): v.replace("\0", "\ufffd") for k, v in headers.items()}
    # Bounded before (an error copy, bounded again as it is stamped): what was left out then.
    earlier = headers.pop(m.HEADERS_DROPPED, "")
    before = int(earlier) if earlier.isdecimal() and len(earlier) < 10 else 0
    own = {k: _cut(k, v, limits) for k, v in headers.items() if k in OWN}
    kept = dict(own)
    total = sum(limits.size(k, v) for k, v in own.items())
    dropped = 0
    for name, value in headers.items():
        if name in own:
            continue
        size = limits.size(name, value)
        # One place stays free for the mdb_headers_dropped line.
        if size > limits.line or len(kept) + 1 >= limits.count \
                or total + size > limits.total - limits.line:
            dropped += 1
            continue
        kept[name] = value
        total += size
    if before + dropped:
        kept[m.HEADERS_DROPPED] = str(before + dropped)
    return kept, dropped


def _cut(name: str, value: str, limits: HeaderLimits) -> str:
    """``value`` shortened (by whole characters) until its header fits the line limit."""
    while limits.size(name, value) > limits.line:
        excess = limits.size(name, value) - limits.line
        value = value[: max(0, len(value) - max(1, excess // 2))]
    return value


ERROR_TEXT_LIMIT = 4000  # UTF-8 bytes of the failure kept in ``mdb_error_message``
ERROR_TYPE_LIMIT = 200  # UTF-8 bytes of the exception type kept in ``mdb_error_type``


def with_failure(headers: Mapping[str, str], error_type: str, text: str,
                 original_destination: str, listener: str | None = None,
                 frames: str = "") -> dict[str, str]:
    """``headers`` of a copy moved to an error destination, with what failed where:
    ``mdb_error_type`` and ``mdb_error_message`` (``error_text``, bounded),
    ``mdb_original_destination`` and, for a listener's message, ``mdb_error_listener``, and
    where a handler raised, its traceback's ``frames`` (``mdb_error_traceback``: the innermost
    ``ERROR_TEXT_LIMIT`` bytes; last, and not one of mdb's own headers, so that ``bounded``
    leaves it out first). When is the sender's to say, as it sends (``failed_now``): this
    stays a pure function."""
    failed = dict(headers)
    failed.update({m.ERROR_TYPE: error_text(error_type, ERROR_TYPE_LIMIT),
                   m.ERROR_MESSAGE: error_text(text),
                   m.ORIGINAL_DESTINATION: original_destination})
    if listener is not None:
        failed[m.ERROR_LISTENER] = listener
    failed.pop(m.ERROR_TRACEBACK, None)  # a replayed message's, from its earlier failure
    if frames:
        fit = error_text(frames, len(frames.encode(errors="replace")))
        failed[m.ERROR_TRACEBACK] = fit.encode()[-ERROR_TEXT_LIMIT:].decode(errors="ignore")
    return failed


def failed_now(headers: Mapping[str, str], limits: HeaderLimits) -> dict[str, str]:
    """``headers`` of an error copy about to be sent, with ``mdb_failed_at`` (the wall clock
    now, ISO 8601 UTC, for an operator's ``mdb dlq``), bounded again to ``limits`` (mdb's own
    headers are kept first)."""
    stamped = {**headers, m.FAILED_AT: datetime.now(UTC).isoformat(timespec="milliseconds")}
    return bounded(stamped, limits)[0]


def error_text(text: str, limit: int = ERROR_TEXT_LIMIT) -> str:
    """``text`` fit for a header of any frame: at most ``limit`` bytes of UTF-8 (cut at a
    character), no NUL nor other control character (each shown as ``\\xNN``) but tab and line
    feed (a CR LF or lone CR becomes a line feed; STOMP 1.2 escapes it in a header), and no
    character UTF-8 cannot carry (a lone surrogate becomes U+FFFD)."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").translate(_UNFIT)
    return text.encode()[:limit].decode(errors="ignore")  # "ignore": the cut character


_UNFIT: dict[int, str] = {
    **{c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0)) if chr(c) not in "\t\n"},
    **dict.fromkeys(range(0xD800, 0xE000), "\ufffd"),
}
