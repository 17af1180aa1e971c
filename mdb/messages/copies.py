"""The headers of the copies mdb re-sends of a message, made here and nowhere else: a redelivery's
and a kept copy's (``redelivery_headers``), an error copy's (``error_headers``, ``with_failure``
for a refused outbox row too, ``failed_now`` as it is sent), and bounds, so that a broker never
refuses one because of the headers it inherited from a foreign producer (``bounded``).

An error copy is the failure's evidence: it never expires (``outlives_original``), whatever
its original's time to live, nor does its replay; an adapter keeps that expiry on it as
information only (``original_expiry``). A retry copy keeps its original's expiry: a message
may expire while it is retried (docs/failed-messages.md, "Expiry").

A refused copy is worse than a failed handler: the delivery cannot be settled, the broker
drops the connection, redelivers the message and the copy is refused again. A copy keeps to
the limits every message mdb sends keeps to, its brokers' ``HeaderLimits``: the headers that
do not fit are left out, not refused.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from datetime import UTC, datetime, timedelta

from mdb.messages.headers import (
    CONTENT_TYPE,
    CONTENT_TYPE_PROPERTY,
    DELIVERY_COUNT,
    ERROR_LISTENER,
    ERROR_MESSAGE,
    ERROR_TRACEBACK,
    ERROR_TYPE,
    FAILED_AT,
    HEADERS_DROPPED,
    ID,
    LAST_FAILURE,
    ORIGINAL_DESTINATION,
    ORIGINAL_EXPIRY,
    PROOF,
    REDELIVERY_OF,
    REPLAYS,
)
from mdb.messages.message import Message
from mdb.observability.redaction import mask_secrets
from mdb.seam.broker import HeaderLimits

# mdb's own headers, kept first (cut to the line limit if need be); a producer may set any of
# them too, but there are only so many.
OWN = frozenset({ID, DELIVERY_COUNT, REDELIVERY_OF, ORIGINAL_DESTINATION, ERROR_TYPE,
                 ERROR_MESSAGE, ERROR_LISTENER, FAILED_AT, ORIGINAL_EXPIRY, REPLAYS,
                 CONTENT_TYPE,
                 CONTENT_TYPE_PROPERTY,
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
    earlier = headers.pop(HEADERS_DROPPED, "")
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
        kept[HEADERS_DROPPED] = str(before + dropped)
    return kept, dropped


def _cut(name: str, value: str, limits: HeaderLimits) -> str:
    """``value`` shortened (by whole characters) until its header fits the line limit."""
    while limits.size(name, value) > limits.line:
        excess = limits.size(name, value) - limits.line
        value = value[: max(0, len(value) - max(1, excess // 2))]
    return value


def redelivery_headers(message: Message, protocol_headers: Set[str],
                       delivery_count: int) -> dict[str, str]:
    """The headers of ``message``'s copy re-sent to its subscription (a redelivery, or a kept
    copy with its own count): its own, its ``mdb_id``, ``delivery_count`` and the logical
    destination it came from. ``protocol_headers`` are those the broker set for this one
    delivery (``Delivery.protocol_headers``): they are not copied."""
    headers = _kept(message, protocol_headers)
    headers[DELIVERY_COUNT] = str(delivery_count)
    headers[REDELIVERY_OF] = str(message.destination)
    return headers


def error_headers(message: Message, protocol_headers: Set[str], error_type: str, text: str,
                  listener: str, frames: str = "") -> dict[str, str]:
    """The headers of ``message``'s copy moved to the error destination: its own, its
    ``mdb_id``, its count, and what failed where (``with_failure``)."""
    headers = _kept(message, protocol_headers)
    headers[DELIVERY_COUNT] = str(message.delivery_count)
    return with_failure(headers, error_type, text, str(message.destination), listener, frames)


def _kept(message: Message, protocol_headers: Set[str]) -> dict[str, str]:
    """The application's headers of ``message``, fit for a copy: without the broker's ones for
    this delivery, without a stale ``mdb_redelivery_of`` and without its proof (the copy is
    proven anew as it is sent), with its identity as its ``mdb_id``."""
    headers = {k: v for k, v in message.headers.items() if k not in protocol_headers}
    headers.pop(REDELIVERY_OF, None)
    headers.pop(PROOF, None)
    headers[ID] = message.id
    return headers


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
    leaves it out first). The failure's text and frames, and those of an earlier failure that
    a replayed message carries (``mdb_last_error_message``, ``mdb_last_error_traceback``),
    have their secrets masked (``mdb.observability.redaction.mask_secrets``) before they are
    bounded, so that no cut leaves a part of one. When is the sender's to say, as it sends
    (``failed_now``): this stays a pure function."""
    failed = dict(headers)
    failed.pop(ERROR_TRACEBACK, None)  # a replayed message's, from its earlier failure
    failed.update({ERROR_TYPE: error_text(error_type, ERROR_TYPE_LIMIT),
                   ERROR_MESSAGE: error_text(mask_secrets(text)),
                   ORIGINAL_DESTINATION: original_destination})
    if listener is not None:
        failed[ERROR_LISTENER] = listener
    for earlier, masked in ((LAST_FAILURE[ERROR_MESSAGE], error_text),
                            (LAST_FAILURE[ERROR_TRACEBACK], _innermost)):
        if earlier in failed:
            failed[earlier] = masked(mask_secrets(failed[earlier]))
    if frames:
        failed[ERROR_TRACEBACK] = _innermost(mask_secrets(frames))
    return failed


def _innermost(frames: str) -> str:
    """``frames`` fit for a header (``error_text``), their innermost ``ERROR_TEXT_LIMIT``
    bytes: where the handler raised."""
    fit = error_text(frames, 4 * len(frames.encode(errors="replace")))  # an escape: 4 bytes
    return fit.encode()[-ERROR_TEXT_LIMIT:].decode(errors="ignore")


def failed_now(headers: Mapping[str, str], limits: HeaderLimits) -> dict[str, str]:
    """``headers`` of an error copy about to be sent, with ``mdb_failed_at`` (the wall clock
    now, ISO 8601 UTC, for an operator's ``mdb dlq``), bounded again to ``limits`` (mdb's own
    headers are kept first)."""
    stamped = {**headers, FAILED_AT: datetime.now(UTC).isoformat(timespec="milliseconds")}
    return bounded(stamped, limits)[0]


def outlives_original(headers: Mapping[str, str]) -> bool:
    """Whether a copy with ``headers`` is sent without its original's expiry, which it keeps
    as ``original_expiry`` says: an error copy (they say what failed, ``with_failure``), so
    that it waits on its error destination until an operator replays or purges it; and a
    replayed message (``mdb_replays``), for whether one whose time is over is still to be
    processed was the operator's call (an error copy made by an older mdb may have an
    expiry, passed by the time it is replayed)."""
    return ERROR_TYPE in headers or REPLAYS in headers


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_LAST_MS = (datetime.max.replace(tzinfo=UTC) - _EPOCH) // timedelta(milliseconds=1)


def original_expiry(expires_ms: int | None) -> dict[str, str]:
    """The header of an error copy whose original expires at ``expires_ms`` (milliseconds
    since the epoch; None or 0 for never): ``mdb_original_expiry``, ISO 8601 UTC as
    ``mdb_failed_at`` (a producer's time past year 9999 shows as its end); none for a message
    that never expires."""
    if not expires_ms:
        return {}
    when = _EPOCH + timedelta(milliseconds=min(expires_ms, _LAST_MS))
    return {ORIGINAL_EXPIRY: when.isoformat(timespec="milliseconds")}


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
