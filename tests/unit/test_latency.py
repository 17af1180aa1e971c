"""A listener's handler latency, p50 and p99 over its recent messages: counted in the
process (``mdb.observability.telemetry.latency``), served in ``/status``, printed by ``mdb
status`` (docs/console.md, "What it shows")."""

from __future__ import annotations

import anyio
import pytest

from mdb import listener
from mdb.container.report import status_report
from mdb.observability.health import Health
from mdb.observability.telemetry.latency import WINDOW, Latencies
from tests.harness.apps.in_process import running, settings_for, unique
from tests.harness.traffic.messages import send_all


def test_p50_and_p99_are_read_back_from_known_durations() -> None:
    latencies = Latencies()
    assert latencies.percentile(0.5) is None
    for ms in reversed(range(1, 101)):  # 100 ms down to 1 ms: the order must not matter
        latencies.record(ms / 1000)
    assert latencies.percentile(0.5) == 0.050
    assert latencies.percentile(0.99) == 0.099
    assert latencies.percentile(1.0) == 0.100


def test_the_estimate_is_over_the_recent_window_only() -> None:
    latencies = Latencies()
    for _ in range(WINDOW):
        latencies.record(5.0)
    for _ in range(WINDOW - 1):
        latencies.record(0.001)
    assert latencies.percentile(0.5) == 0.001
    assert latencies.percentile(1.0) == 5.0  # one slow call is still in the window
    latencies.record(0.002)
    assert latencies.percentile(1.0) == 0.002


@pytest.mark.anyio
async def test_status_serves_and_prints_each_listeners_handler_latency() -> None:
    url = f"memory://{unique('latency')}"
    second = anyio.Event()
    bodies: list[str] = []

    @listener("queue:timed")
    async def on_timed(body: str) -> None:
        bodies.append(body)
        if len(bodies) == 2:  # the first call has ended, its duration recorded
            second.set()

    async with running(settings_for(url), on_timed) as container:
        before = Health.from_json(container.health().to_json())
        await send_all(url, "queue:timed", ["a", "b"])
        await second.wait()
        after = Health.from_json(container.health().to_json())
    assert (before.listeners[0].latency_p50, before.listeners[0].latency_p99) == (None, None)
    p50, p99 = after.listeners[0].latency_p50, after.listeners[0].latency_p99
    assert p50 is not None and p99 is not None and 0 < p50 <= p99
    report = status_report(after, "http://here")
    assert "handler p50/p99" in report
    assert f"{p50 * 1000:.3g}/{p99 * 1000:.3g} ms" in report
