"""A careless operator's cases on real brokers (docs/security.md, "Secrets"; docs/failover.md):
a password never reaches the log, DEBUG included, and a broker outage is one line when it starts
and one when it ends, with nothing of the broker library's."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.harness.brokers import private_brokers

ROOT = Path(__file__).resolve().parents[2]
WAIT = 120.0

LISTENERS = (
    "from mdb import listener\n\n"
    "@listener('queue:outage_orders', pool=4)\n"
    "async def on_order(body: bytes) -> None:\n"
    "    pass\n\n"
    "@listener('topic:outage_prices', pool=2)\n"
    "async def on_price(body: bytes) -> None:\n"
    "    pass\n"
)


@pytest.mark.parametrize("broker", [
    pytest.param("activemq", marks=pytest.mark.activemq),
    pytest.param("rabbitmq", marks=pytest.mark.rabbitmq),
])
def test_debug_logs_never_show_the_password(broker: str, request: pytest.FixtureRequest) -> None:
    process = request.getfixturevalue(broker)  # it requires a login: its url carries one
    password = process.password
    env = {**os.environ, "MDB_BROKERS__DEFAULT__URL": str(process.url), "MDB_LOG_LEVEL": "DEBUG"}
    result = subprocess.run(
        [sys.executable, "-m", "mdb.cli", "send", "queue:operator_debug", "x"], cwd=ROOT,
        env=env, capture_output=True, text=True, timeout=WAIT)
    assert result.returncode == 0, result.stderr
    assert "passcode:***" in result.stderr  # stomp.py's frames are shown at DEBUG, masked
    shown = result.stdout + result.stderr
    assert f"passcode:{password}" not in shown and f":{password}@" not in shown


@pytest.mark.activemq
def test_a_broker_outage_is_one_line_when_it_starts_and_one_when_it_ends(
        tmp_path: Path) -> None:
    (tmp_path / "outage_listeners.py").write_text(LISTENERS)
    with private_brokers("activemq") as [broker]:
        env = {**os.environ, "MDB_BROKERS__MAIN__URL": str(broker.url),
               "MDB_BROKERS__MAIN__RECONNECT_DELAY": "0.1",
               "MDB_BROKERS__MAIN__RECONNECT_MAX_DELAY": "0.5"}
        process = subprocess.Popen(
            [sys.executable, "-m", "mdb.cli", "run", "outage_listeners"], cwd=tmp_path,
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        stderr: queue.Queue[str] = queue.Queue()
        lines: list[str] = []
        assert process.stdout is not None and process.stderr is not None
        pipe = process.stderr

        def read() -> None:
            for line in pipe:
                stderr.put(line)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()

        def wait_for(text: str) -> None:
            while not any(text in line for line in lines):
                lines.append(stderr.get(timeout=WAIT))

        try:
            for line in process.stdout:
                if line.startswith("mdb: ready"):
                    break
            broker.kill()
            wait_for("connection-lost")
            broker.start()
            wait_for("connection-restored")
        finally:
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=WAIT) == 0
        reader.join(WAIT)
        while not stderr.empty():
            lines.append(stderr.get_nowait())
    logged = [line for line in lines if line.strip() and "SIGTERM" not in line
              and "container ready" not in line]
    assert len(logged) == 2, "".join(lines)
    lost, restored = logged
    assert "connection-lost: broker main" in lost and "queue:outage_orders@main" in lost
    assert "connection-restored: broker main (down for" in restored
    assert "failed attempts" in restored
