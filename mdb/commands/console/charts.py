"""A listener's rates over the last 15 minutes as an inline SVG drawn on the server: one line
per counter (processed, redelivered, moved to the error destination). Each line carries its
points in ``data-at`` and ``data-rates`` (seconds since the epoch, messages a second), which a
test, or a reader's tool, reads back."""

from __future__ import annotations

from collections.abc import Sequence

from mdb.commands.console.html import escape
from mdb.commands.console.poller import HISTORY, Rate

WIDTH, HEIGHT = 320, 64
SERIES = (("processed", "#1f77b4"), ("redelivered", "#d08600"),
          ("to_error_destination", "#c0392b"))


def rate_chart(rates: Sequence[Rate], now: float) -> str:
    """The chart of ``rates`` up to ``now``; its title says the last rates."""
    top = max((getattr(r, name) for r in rates for name, _ in SERIES), default=0.0) or 1.0
    lines = []
    for name, colour in SERIES:
        points = " ".join(
            f"{_x(r.at, now):.1f},{HEIGHT - 2 - getattr(r, name) / top * (HEIGHT - 4):.1f}"
            for r in rates)
        lines.append(
            f'<polyline class="{name}" fill="none" stroke="{colour}" stroke-width="1.5" '
            f'points="{points}" data-at="{" ".join(f"{r.at:.1f}" for r in rates)}" '
            f'data-rates="{" ".join(f"{getattr(r, name):.3g}" for r in rates)}"/>')
    last = rates[-1] if rates else Rate(now, 0.0, 0.0, 0.0)
    said = (f"last: {last.processed:.3g}/s processed, {last.redelivered:.3g}/s redelivered, "
            f"{last.to_error_destination:.3g}/s to the error destination; top {top:.3g}/s "
            "over 15 minutes")
    return (f'<svg class="chart" width="{WIDTH}" height="{HEIGHT}" role="img" '
            f'viewBox="0 0 {WIDTH} {HEIGHT}"><title>{escape(said)}</title>'
            + "".join(lines) + f"</svg><div class=\"why\">{escape(said)}</div>")


def _x(at: float, now: float) -> float:
    return max(0.0, WIDTH - (now - at) / HISTORY * WIDTH)
