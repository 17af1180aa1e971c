"""Bounds on the copies mdb re-sends (for a redelivery or to an error destination), so that a
broker never refuses one because of the headers it inherited from a foreign producer.

A refused copy is worse than a failed handler: the delivery cannot be settled, the broker
drops the connection, redelivers the message and the copy is refused again. A copy keeps to
the limits every message mdb sends keeps to, its brokers' ``HeaderLimits``: the headers that
do not fit are left out, not refused.
"""

from __future__ import annotations

from collections.abc import Mapping

from mdb import message as m
from mdb.broker import HeaderLimits

# mdb's own headers, kept first (cut to the line limit if need be); a producer may set any of
# them too, but there are only so many.
OWN = frozenset({m.ID, m.DELIVERY_COUNT, m.REDELIVERY_OF, m.ORIGINAL_DESTINATION, m.ERROR_TYPE,
                 m.ERROR_MESSAGE, m.ERROR_LISTENER, m.CONTENT_TYPE, m.CONTENT_TYPE_PROPERTY,
                 "traceparent", "tracestate"})


def bounded(headers: Mapping[str, str], limits: HeaderLimits) -> tuple[dict[str, str], int]:
    """``headers`` cut to ``limits``, and how many were left out. A NUL byte left in one (an
    exception's text) becomes U+FFFD: no frame can carry it, and a copy must be sent.

    mdb's own headers come first and are kept, a too-long value cut short (the error text);
    the others are kept in their order while they fit, and a header that does not fit is left
    out. When any is left out, ``mdb_headers_dropped`` says how many."""
    headers = {k.replace("\0", "\ufffd"): v.replace("\0", "\ufffd") for k, v in headers.items()}
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
    if dropped:
        kept[m.HEADERS_DROPPED] = str(dropped)
    return kept, dropped


def _cut(name: str, value: str, limits: HeaderLimits) -> str:
    """``value`` shortened (by whole characters) until its header fits the line limit."""
    while limits.size(name, value) > limits.line:
        excess = limits.size(name, value) - limits.line
        value = value[: max(0, len(value) - max(1, excess // 2))]
    return value
