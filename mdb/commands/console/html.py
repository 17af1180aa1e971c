"""The one escape of the console's pages: every value shown (a container's answer, a broker's
address, a message's id, headers, body, traceback: input of others) goes through ``escape``,
so that a ``<script>`` in it is shown as text."""

from __future__ import annotations

import html
import time
import urllib.parse


def escape(value: object) -> str:
    """``value`` as text safe inside an element and inside a quoted attribute."""
    return html.escape(str(value), quote=True)


def quoted(part: str) -> str:
    """``part`` as one segment of a URL path (``queue:orders.DLQ``, a listener's name)."""
    return urllib.parse.quote(part, safe="")


def clock(at: float | None) -> str:
    """A ``time.time()`` as the console's local time of day, or "—"."""
    return "—" if at is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))
