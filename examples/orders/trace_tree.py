"""Print the traces of a run as trees: the spans of OpenTelemetry's console exporter, read from
standard input.

    OTEL_TRACES_EXPORTER=console examples/orders/run \
        | .venv/bin/python -m examples.orders.trace_tree

Lines that are not spans pass through. When the input ends (stop the example with Ctrl-C; this
script ignores the signal and reads on), it prints every trace in which a message was
redelivered, one span a line, children indented under their parent.
"""

from __future__ import annotations

import json
import signal
import sys
from collections import defaultdict
from collections.abc import Iterable, Iterator
from typing import Any

Span = dict[str, Any]

SHOWN = {"mdb.delivery_count": "delivery", "mdb.redelivered": "redelivered",
         "error.type": "error"}


def spans_and_lines(lines: Iterable[str]) -> Iterator[Span | str]:
    """The console exporter writes each span as an indented JSON object starting with a line
    ``{`` and ending with a line ``}``; everything else is passed on as it is."""
    pending: list[str] = []
    for line in lines:
        if pending or line.rstrip() == "{":
            pending.append(line)
            if line.rstrip() == "}":
                yield json.loads("".join(pending))
                pending = []
        else:
            yield line
    yield from pending


def tree(spans: list[Span]) -> list[str]:
    """One trace as lines: each span under its parent, in start order."""
    ids = {s["context"]["span_id"] for s in spans}
    children: dict[str | None, list[Span]] = defaultdict(list)
    for span in sorted(spans, key=lambda s: s["start_time"]):
        parent = span.get("parent_id")
        children[parent if parent in ids else None].append(span)
    lines: list[str] = []

    def walk(parent: str | None, depth: int) -> None:
        for span in children[parent]:
            attributes = span.get("attributes", {})
            shown = ", ".join(f"{label}={attributes[key]}"
                              for key, label in SHOWN.items() if key in attributes)
            events = "".join(f" +{e['name']}" for e in span.get("events", []))
            kind = span["kind"].removeprefix("SpanKind.")
            lines.append(f"{'  ' * depth}{span['name']}  [{kind}] {shown}{events}".rstrip())
            walk(span["context"]["span_id"], depth + 1)

    walk(None, 0)
    return lines


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the example; read to the end
    traces: dict[str, list[Span]] = defaultdict(list)
    for item in spans_and_lines(sys.stdin):
        if isinstance(item, str):
            sys.stdout.write(item)
        else:
            traces[item["context"]["trace_id"]].append(item)
    for trace_id, spans in traces.items():
        if any(s.get("attributes", {}).get("mdb.redelivered") for s in spans):
            print(f"\ntrace {trace_id.removeprefix('0x')}")
            print("\n".join(tree(spans)))


if __name__ == "__main__":
    main()
