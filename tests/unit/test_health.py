"""The health endpoint: probes answered from the event loop, and ``mdb status`` reading it."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import threading
from pathlib import Path

import anyio
import anyio.to_thread
import pytest

from mdb import listener
from mdb.container.report import status_report
from mdb.observability.health import Health, MemberHealth
from mdb.serving.http.routes import HealthServer
from tests.harness.apps.in_process import running, settings_for, unique
from tests.harness.processes.health import NOT_READY, READY, get, serving
from tests.harness.traffic.messages import send_all


@pytest.mark.anyio
async def test_probes_answer_from_the_event_loop() -> None:
    current = [READY]
    on_loop: list[bool] = []
    loop_thread = threading.get_ident()

    def snapshot() -> Health:
        on_loop.append(threading.get_ident() == loop_thread)
        return current[0]

    server = HealthServer(snapshot, "127.0.0.1", 0)
    server.start()
    try:
        base = f"http://127.0.0.1:{server.port}"
        assert server.port != 0
        assert await anyio.to_thread.run_sync(get, f"{base}/health/live") == (200, {"live": True})
        assert await anyio.to_thread.run_sync(get, f"{base}/health/ready") == (
            200, {"ready": True, "starting": False, "stopping": False, "brokers_down": [],
                  "databases_down": [], "listeners_short": [], "listeners_stuck": []})
        status, body = await anyio.to_thread.run_sync(get, f"{base}/status")
        assert status == 200 and Health.from_json(body) == READY

        current[0] = NOT_READY
        assert await anyio.to_thread.run_sync(get, f"{base}/health/live") == (200, {"live": True})
        assert await anyio.to_thread.run_sync(get, f"{base}/health/ready") == (503, {
            "ready": False, "starting": False, "stopping": False, "brokers_down": ["backup"],
            "databases_down": ["orders"],
            "listeners_short": [{"name": "on_order", "subscribed": 2, "members": 3}],
            "listeners_stuck": []})
        status, body = await anyio.to_thread.run_sync(get, f"{base}/status")
        assert status == 200 and Health.from_json(body) == NOT_READY

        current[0] = Health(live=False, ready=False)
        assert await anyio.to_thread.run_sync(get, f"{base}/health/live") == (
            503, {"live": False})

        status, body = await anyio.to_thread.run_sync(get, f"{base}/metrics")
        assert status == 404 and "/health/live" in str(body["error"])
        assert on_loop and all(on_loop)
    finally:
        server.close()
        server.close()  # idempotent


@pytest.mark.anyio
async def test_a_graceful_stop_is_not_ready_because_it_is_stopping() -> None:
    """Every state that is not ready says why (docs/health.md, "mdb status")."""
    url = f"memory://{unique('stopping')}"
    entered, release = anyio.Event(), anyio.Event()

    @listener("queue:slow")
    async def holding(body: str) -> None:
        entered.set()
        await release.wait()

    async with running(settings_for(url), holding) as container:
        await send_all(url, "queue:slow", ["held"])
        await entered.wait()
        container.request_stop()  # the stop waits for the handler in flight
        server = HealthServer(container.health)
        server.start()
        try:
            ready = await anyio.to_thread.run_sync(
                get, f"http://127.0.0.1:{server.port}/health/ready")
        finally:
            server.close()
        report = status_report(container.health(), "http://here")
        release.set()
    assert ready == (503, {"ready": False, "starting": False, "stopping": True,
                           "brokers_down": [], "databases_down": [], "listeners_short": [],
                           "listeners_stuck": []})
    assert "live, NOT READY\n  because it is stopping: the messages in flight finish, no new "\
           "one is taken" in report


def test_a_server_whose_loop_has_ended_answers_503() -> None:
    async def start() -> HealthServer:
        server = HealthServer(lambda: READY)
        server.start()
        return server

    server = anyio.run(start)
    try:
        status, body = get(f"http://127.0.0.1:{server.port}/health/live")
        assert status == 503 and body["live"] is False
    finally:
        server.close()


def test_from_json_refuses_what_is_not_a_snapshot() -> None:
    with pytest.raises(ValueError, match="not an mdb health snapshot"):
        Health.from_json({"live": True})
    with pytest.raises(ValueError, match="not an mdb health snapshot"):
        Health.from_json({**READY.to_json(), "ready": "yes"})


def mdb_status(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mdb.commands.cli", "status", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_mdb_status_exits_0_when_ready(tmp_path: Path) -> None:
    with serving(READY) as url:
        result = mdb_status("--url", url, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"mdb at {url}: live, ready" in result.stdout
    assert "main" in result.stdout and "3/3" in result.stdout and "42" in result.stdout
    assert "connection-lost 1" in result.stdout
    assert "stomp+activemq://u:***@standby:61613" in result.stdout  # the active address


def test_mdb_status_exits_1_when_not_ready_and_says_why(tmp_path: Path) -> None:
    with serving(NOT_READY) as url:
        port = url.rsplit(":", 1)[1]
        (tmp_path / "mdb.toml").write_text(f"health_port = {port}\n")
        result = mdb_status("--config", "mdb.toml", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert "live, NOT READY" in result.stdout
    assert "broker backup is failed" in result.stdout
    assert "listener on_order has 2 of 3 members subscribed" in result.stdout
    assert "database orders is down" in result.stdout
    assert re.search(r"orders\s+down\s+\S+ ago\s+12\s+1m15s", result.stdout), result.stdout


def test_mdb_status_exits_3_when_nothing_answers(tmp_path: Path) -> None:
    with socket.socket() as bound:  # bound, not listening: connections are refused
        bound.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{bound.getsockname()[1]}"
        result = mdb_status("--url", url, cwd=tmp_path)
    assert result.returncode == 3
    assert f"cannot reach {url}/status" in result.stderr


def test_mdb_status_without_a_port_is_a_configuration_error(tmp_path: Path) -> None:
    result = mdb_status(cwd=tmp_path)
    assert result.returncode == 2
    assert "set `health_port`" in result.stderr


@pytest.mark.anyio
async def test_status_names_each_listeners_destination_mode_and_members() -> None:
    """What ``mdb console`` shows of a listener (docs/console.md, "What it shows")."""
    url = f"memory://{unique('members')}"

    @listener("queue:orders")
    async def on_order(body: str) -> None: ...

    @listener("topic:prices", distribution="one-copy-per-server")
    async def on_price(body: str) -> None: ...

    settings = settings_for(url)
    async with running(settings, on_order, on_price) as container:
        health = Health.from_json(container.health().to_json())
    shown = {lh.name: (lh.destination, lh.mode, lh.member_states) for lh in health.listeners}
    assert shown == {
        "on_order": ("queue:orders", "queue", (MemberHealth("default", "queue:orders", True),)),
        "on_price": ("topic:prices", "one-copy-per-server",
                     (MemberHealth("default", "topic:prices", True,
                                   f"{settings.app}-s1-on_price"),)),  # a durable one, named
    }
