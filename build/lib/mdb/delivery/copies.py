"""Bounds on the copies mdb re-sends (for a redelivery or to an error destination), so that a
broker never refuses one because of the headers it inherited from a foreign producer.

A refused copy is worse than a failed handler: the delivery cannot be settled, the broker
drops the connection, redelivers the message and the copy is refused again. A copy keeps to
the bounds every message mdb sends keeps to (``mdb.message.MAX_HEADERS`` and the others, with
what they rest on): the headers that do not fit are left out, not refused.
"""

from __future__ import annotations

from collections.abc import Mapping, Set

from mdb import message as m
from mdb.delivery.decision import (
    DeadLetter,
    Failure,
    Keep,
    MoveToError,
    Policy,
    Redeliver,
    error_headers,
)
from mdb.message import MAX_HEADER_BYTES, MAX_HEADERS, MAX_TOTAL_BYTES, Message, line_bytes

# mdb's own headers, kept first (cut to MAX_HEADER_BYTES if need be); a producer may set any of
# them too, but there are only so many.
OWN = frozenset({m.ID, m.DELIVERY_COUNT, m.REDELIVERY_OF, m.ORIGINAL_DESTINATION, m.ERROR_TYPE,
                 m.ERROR_MESSAGE, m.ERROR_LISTENER, m.CONTENT_TYPE, m.CONTENT_TYPE_PROPERTY,
                 "traceparent", "tracestate"})


def bounded(headers: Mapping[str, str]) -> tuple[dict[str, str], int]:
    """``headers`` cut to the bounds of ``mdb.message``, and how many were left out. A NUL
    byte left in one (an exception's text) becomes U+FFFD: no frame can carry it, and a copy
    must be sent.

    mdb's own headers come first and are kept, a too-long value cut short (the error text);
    the others are kept in their order while they fit, and a header that does not fit is left
    out. When any is left out, ``mdb_headers_dropped`` says how many."""
    headers = {k.replace("\0", "\ufffd"): v.replace("\0", "\ufffd") for k, v in headers.items()}
    own = {k: _cut(k, v) for k, v in headers.items() if k in OWN}
    kept = dict(own)
    total = sum(line_bytes(k, v) for k, v in own.items())
    dropped = 0
    for name, value in headers.items():
        if name in own:
            continue
        size = line_bytes(name, value)
        # One place stays free for the mdb_headers_dropped line.
        if size > MAX_HEADER_BYTES or len(kept) + 1 >= MAX_HEADERS \
                or total + size > MAX_TOTAL_BYTES - MAX_HEADER_BYTES:
            dropped += 1
            continue
        kept[name] = value
        total += size
    if dropped:
        kept[m.HEADERS_DROPPED] = str(dropped)
    return kept, dropped


def _cut(name: str, value: str) -> str:
    """``value`` shortened (by whole characters) until its header line fits MAX_HEADER_BYTES."""
    while line_bytes(name, value) > MAX_HEADER_BYTES:
        excess = line_bytes(name, value) - MAX_HEADER_BYTES
        value = value[: max(0, len(value) - max(1, excess // 2))]
    return value


def fitted(outcome: Redeliver | MoveToError | DeadLetter | Keep, message: Message,
           failure: Failure, policy: Policy, protocol_headers: Set[str],
           ) -> Redeliver | MoveToError | DeadLetter | Keep:
    """``outcome`` with its copy's headers within the bounds. A message
    whose headers do not all fit is not retried (its copy would lack some): it moves to the
    error destination at once, with the headers that fit and ``mdb_headers_dropped``. A kept
    copy keeps what fits."""
    if isinstance(outcome, DeadLetter):
        return outcome
    headers, dropped = bounded(outcome.headers)
    if isinstance(outcome, MoveToError):
        return MoveToError(outcome.destination, headers)
    if isinstance(outcome, Keep):
        return Keep(outcome.delay, outcome.destination, headers, outcome.round)
    if not dropped:
        return outcome
    return MoveToError(policy.error_destination, bounded(error_headers(
        message, failure, policy.listener, protocol_headers))[0])
