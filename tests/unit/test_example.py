"""README command 1: the orders example on the embedded broker shows processing, a
redelivery and the error destination, and stops cleanly on SIGINT."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from examples.orders.trace_tree import spans_and_lines, tree

ROOT = Path(__file__).resolve().parents[2]


def test_the_orders_example_runs_on_the_embedded_broker() -> None:
    env = {**os.environ, "DEMO_ORDERS": "12", "MDB_LOG_LEVEL": "WARNING",
           "OTEL_TRACES_EXPORTER": "console"}
    process = subprocess.Popen(
        [sys.executable, "-m", "mdb.commands.cli", "run", "examples.orders.listeners",
         "--config", "examples/orders/mdb.toml"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line)
        lines.put("")

    threading.Thread(target=pump, daemon=True).start()
    seen: list[str] = []
    give_up = time.monotonic() + 120
    try:
        invoices = 0
        while invoices < 11 or not any(line.startswith("errors:") for line in seen):
            line = lines.get(timeout=60)
            assert line and time.monotonic() < give_up, "".join(seen)
            seen.append(line)
            invoices += line.startswith("invoices:")
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0
        while (line := lines.get(timeout=60)):
            seen.append(line)
    finally:
        if process.poll() is None:
            process.kill()
    out = "".join(seen)
    assert "listener         destination" in out  # the plan table
    assert "orders: o-5 succeeded on delivery 2" in out  # a redelivery
    assert "gave up after 3 deliveries: ValueError: order o-3: cannot price sku POISON" in out
    assert "events: order o-5 accepted, 47.50" in out  # on the topic, after its redelivery
    assert "mdb: stopped; processed 34" in out  # 11 orders, 11 invoices, 11 events, 1 error
    # Tracing on: o-5's trace runs from the demo's send through both deliveries to its invoice.
    traces: dict[str, list[dict[str, Any]]] = {}
    for item in spans_and_lines(seen):
        if isinstance(item, dict):
            traces.setdefault(item["context"]["trace_id"], []).append(item)
    trees = ["\n".join(tree(spans)) for spans in traces.values()]
    [o5] = [t for t in trees if "error=TimeoutError" in t]
    assert [line.split("  [")[0] for line in o5.splitlines()][:5] == [
        "send queue:orders", "  process queue:orders", "    send queue:orders",
        "      process queue:orders", "        send queue:invoices"]
    assert "delivery=2, redelivered=True" in o5.splitlines()[3]


def test_the_partitioned_example_plans_a_subscription_on_every_member() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mdb.commands.cli", "subscriptions", "examples.orders.listeners",
         "--config", "examples/orders/partitioned.toml", "--server", "web_1"],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    rows = [line.split() for line in result.stdout.splitlines()
            if line.startswith("on_order_event")]
    assert [(row[3], row[-4]) for row in rows] == [
        ("orders_example-web_1-on_order_event", broker) for broker in "abc"]
    assert result.stdout in (ROOT / "docs" / "distribution.md").read_text()  # docs are current
