"""Bounds on the copies mdb re-sends (for a redelivery or to an error destination), so that a
broker never refuses one because of the headers it inherited.

A refused copy is worse than a failed handler: the delivery cannot be settled, the broker
drops the connection, redelivers the message and the copy is refused again. Measured here
(raw STOMP 1.2 SENDs): ActiveMQ 5.17 refuses a frame of 1,000 header lines or more, or with
one header line of 10,240 bytes or more ("The maximum number of headers was exceeded", "The
maximum header length was exceeded"); RabbitMQ 3.10 took 2,000 headers, one of 200 KB and 1.6 MB
in all. The bounds below stay well inside ActiveMQ's, leaving room for the lines the adapter
adds (destination, transaction, receipt, persistence, ...), and keep a copy small elsewhere.
"""

from __future__ import annotations

from collections.abc import Mapping, Set

from mdb import message as m
from mdb.delivery.decision import Failure, MoveToError, Policy, Redeliver, error_headers
from mdb.message import Message

MAX_HEADERS = 512  # headers of a copy, mdb's own included
MAX_HEADER_BYTES = 8_192  # one header line as written: name, ':', escaped value
MAX_TOTAL_BYTES = 262_144  # every header line of a copy together
# mdb's own headers, kept first (cut to MAX_HEADER_BYTES if need be); a producer may set any of
# them too, but there are only so many.
OWN = frozenset({m.ID, m.DELIVERY_COUNT, m.REDELIVERY_OF, m.ORIGINAL_DESTINATION, m.ERROR_TYPE,
                 m.ERROR_MESSAGE, m.ERROR_LISTENER, m.CONTENT_TYPE, "traceparent", "tracestate"})
ESCAPED = "\\\r\n:"  # STOMP 1.2 writes each of these as two bytes


def line_bytes(name: str, value: str) -> int:
    """The size of ``name:value`` as a STOMP 1.2 header line, escapes included."""
    return (len(name.encode()) + 1 + len(value.encode())
            + sum(value.count(c) + name.count(c) for c in ESCAPED))


def bounded(headers: Mapping[str, str]) -> tuple[dict[str, str], int]:
    """``headers`` cut to the bounds above, and how many were left out. A NUL byte left in
    one (an exception's text) becomes U+FFFD: no frame can carry it, and a copy must be sent.

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


def fitted(outcome: Redeliver | MoveToError, message: Message, failure: Failure,
           policy: Policy, protocol_headers: Set[str]) -> Redeliver | MoveToError:
    """``outcome`` with its copy's headers within the bounds above. A message
    whose headers do not all fit is not retried (its copy would lack some): it moves to the
    error destination at once, with the headers that fit and ``mdb_headers_dropped``."""
    headers, dropped = bounded(outcome.headers)
    if isinstance(outcome, MoveToError):
        return MoveToError(outcome.destination, headers)
    if not dropped:
        return outcome
    return MoveToError(policy.error_destination, bounded(error_headers(
        message, failure, policy.listener, protocol_headers))[0])
