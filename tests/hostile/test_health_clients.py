"""A hostile or careless client of the health endpoint (docs/security.md, "Hostile input:
the operator's files and the health endpoint's clients"): a flood of idle and slow
connections, under a low file limit, must leave the probes answered and the threads few;
clients that go away print nothing."""

from __future__ import annotations

import os
import resource
import signal
import socket
import struct
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from mdb.health import Health
from mdb.probe_server import ProbeServer
from tests.unit.test_health import serving

ROOT = Path(__file__).resolve().parents[2]
WAIT = 60.0
FLOOD = 300
FILE_LIMIT = 200  # below FLOOD: a connection each would run out of file descriptors

LISTENERS = (
    "from mdb import listener\n\n"
    "@listener('queue:health_flood')\n"
    "async def on_message(body: bytes) -> None:\n"
    "    pass\n"
)


@contextmanager
def container(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``mdb run`` on the embedded broker with a low file limit; yields it and its health URL
    once ready, and yields the rest of its stderr to ``process.stderr`` after SIGTERM."""
    (tmp_path / "flood_listeners.py").write_text(LISTENERS)
    env = {**os.environ, "MDB_HEALTH_PORT": "0"}
    env.pop("MDB_LOG_LEVEL", None)

    def limit_files() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (FILE_LIMIT, FILE_LIMIT))

    process = subprocess.Popen(
        [sys.executable, "-m", "mdb.cli", "run", "flood_listeners"], cwd=tmp_path, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=limit_files)
    assert process.stdout is not None
    url = ""
    try:
        for line in process.stdout:
            if "health on " in line:
                url = line.split("health on ", 1)[1].strip()
            if line.startswith("mdb: ready"):
                break
        assert url, "no health endpoint announced"
        yield process, url
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=WAIT)


def threads_of(process: subprocess.Popen[str]) -> int:
    status = Path(f"/proc/{process.pid}/status").read_text()
    return int(next(line for line in status.splitlines()
                    if line.startswith("Threads:")).split()[1])


def probe(url: str) -> int:
    with urllib.request.urlopen(f"{url}/health/ready", timeout=WAIT) as response:
        return int(response.status)


def files_of(process: subprocess.Popen[str]) -> int:
    return len(os.listdir(f"/proc/{process.pid}/fd"))


def test_probes_are_answered_under_a_flood_of_idle_and_slow_clients(tmp_path: Path) -> None:
    with container(tmp_path) as (process, url), ExitStack() as clients:
        port = int(url.rsplit(":", 1)[1])
        assert probe(url) == 200
        threads, files = threads_of(process), files_of(process)
        for index in range(FLOOD):
            client = clients.enter_context(socket.create_connection(("127.0.0.1", port)))
            if index % 2:  # slow: half a request, and then nothing
                client.sendall(b"GET /health/ready HTTP/1.1\r\nHost: x\r\n")
        assert probe(url) == 200
        assert probe(url) == 200
        assert threads_of(process) <= threads + 2
        assert files_of(process) <= files + ProbeServer.MAX_CONNECTIONS + 2
    assert process.stderr is not None
    stderr = process.stderr.read()
    assert "Traceback" not in stderr and "cannot accept" not in stderr, stderr


def test_a_slow_client_is_cut_off_and_what_is_not_a_get_is_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ProbeServer, "DEADLINE", 0.5)
    with serving(Health(live=True, ready=True)) as url:
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port)) as slow:
            slow.sendall(b"GET /health/live HTTP/1.1\r\n")
            slow.settimeout(WAIT)
            assert slow.recv(1024) == b""  # closed by the server, unanswered
        for request, status in ((b"POST /health/live HTTP/1.1\r\n\r\n", b" 405 "),
                                (b"hello\r\n\r\n", b" 400 "),
                                (b"GET /health/live?x=1 HTTP/1.1\r\n\r\n", b" 200 ")):
            with socket.create_connection(("127.0.0.1", port)) as client:
                client.sendall(request)
                client.settimeout(WAIT)
                assert status in client.recv(1024).split(b"\r\n", 1)[0]


def test_clients_that_go_away_early_print_nothing(tmp_path: Path) -> None:
    with container(tmp_path) as (process, url):
        port = int(url.rsplit(":", 1)[1])
        for _ in range(20):
            with socket.create_connection(("127.0.0.1", port)) as client:
                client.sendall(b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n")
                # closed at once with a reset, before the answer is written
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        assert probe(url) == 200
    assert process.stderr is not None
    stderr = process.stderr.read()
    assert "Traceback" not in stderr, stderr
