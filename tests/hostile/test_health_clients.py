"""A hostile or careless client of the health endpoint (docs/security.md, "Hostile input:
the operator's files and the health endpoint's clients"): a flood of idle and slow
connections, under a low file limit, must leave the probes answered and the threads few;
clients that go away print nothing; clients scraping ``/metrics`` in a loop cost the
container's loop one short read per interval, and the page is made off it."""

from __future__ import annotations

import os
import resource
import signal
import socket
import struct
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import anyio
import anyio.to_thread
import pytest

from mdb.observability.health import Health
from mdb.serving.http import routes
from mdb.serving.http.routes import HealthServer, Page, Render
from mdb.serving.http.server import ProbeServer
from tests.harness.processes.health import READY, serving

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
        [sys.executable, "-m", "mdb.commands.cli", "run", "flood_listeners"], cwd=tmp_path, env=env,
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


class Pages:
    """A ``MetricsSource`` that says where it is read and where its pages are made; a page
    waits for ``release`` while ``hold`` is set."""

    def __init__(self) -> None:
        self.reads: list[int] = []  # threads
        self.renders: list[int] = []
        self.hold = threading.Event()
        self.holding = threading.Event()  # a page is being made, held
        self.release = threading.Event()

    def content_type(self, accept: str) -> str:
        return "text/plain"

    def read(self) -> Render:
        self.reads.append(threading.get_ident())
        number = len(self.reads)

        def render(accept: str) -> Page:
            self.renders.append(threading.get_ident())
            if self.hold.is_set():
                self.holding.set()
                self.release.wait(WAIT)
            return "text/plain", f"page {number}".encode()

        return render


async def scraped(pages: Pages, clients: Callable[[str], None]) -> None:
    """Serve ``pages`` from this loop while ``clients(url)`` runs in a thread."""
    server = HealthServer(lambda: READY, metrics=pages)
    server.start()
    try:
        await anyio.to_thread.run_sync(clients, f"http://127.0.0.1:{server.port}")
    finally:
        server.close()


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=WAIT) as answer:
        return bytes(answer.read())


@pytest.mark.anyio
async def test_scrapers_in_a_loop_cost_the_container_one_read_and_no_page(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(routes, "PAGE_FRESH_FOR", 3600.0)  # no page goes stale in this test
    loop = threading.get_ident()
    pages = Pages()

    def twenty_scrapers(url: str) -> None:
        def scrape() -> None:
            for _ in range(5):
                assert get(f"{url}/metrics") == b"page 1"

        threads = [threading.Thread(target=scrape) for _ in range(20)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    await scraped(pages, twenty_scrapers)
    assert pages.reads == [loop]  # 100 scrapes: one read, on the container's loop
    assert len(pages.renders) == 1 and loop not in pages.renders


@pytest.mark.anyio
async def test_a_scrape_while_the_page_is_made_anew_gets_the_last_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(routes, "PAGE_FRESH_FOR", 0.0)  # every page is stale at once
    monkeypatch.setattr(routes, "PAGE_REUSE", 0.0)
    pages = Pages()

    def clients(url: str) -> None:
        assert get(f"{url}/metrics") == b"page 1"
        pages.hold.set()
        making = threading.Thread(target=lambda: get(f"{url}/metrics"))
        making.start()
        assert pages.holding.wait(WAIT)
        # Page 2 is being made and held: neither a scrape nor a probe waits for it.
        assert get(f"{url}/metrics") == b"page 1"
        assert get(f"{url}/health/live") == b'{"live": true}'
        pages.release.set()
        making.join()
        pages.hold.clear()
        assert get(f"{url}/metrics") == b"page 3"

    await scraped(pages, clients)
    assert len(pages.reads) == 3


@pytest.mark.anyio
async def test_scrapers_wait_their_turn_and_give_way_to_probes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(routes, "PAGE_FRESH_FOR", 3600.0)  # the first page is served on
    monkeypatch.setattr(ProbeServer, "AT_HAND_PER_SECOND", 1e-9)  # one page, then no turn
    monkeypatch.setattr(ProbeServer, "MAX_CONNECTIONS", 2)
    monkeypatch.setattr(ProbeServer, "DEADLINE", 3600.0)  # no connection is cut off for time

    def clients(url: str) -> None:
        port = int(url.rsplit(":", 1)[1])
        assert get(f"{url}/metrics") == b"page 1"  # made in a request thread
        assert get(f"{url}/metrics") == b"page 1"  # served at once: the first turn
        with socket.create_connection(("127.0.0.1", port)) as waiting:
            waiting.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")  # the next turn is far off
            assert get(f"{url}/health/live") == b'{"live": true}'  # a probe does not wait
            with socket.create_connection(("127.0.0.1", port)):  # both connections open
                # Past MAX_CONNECTIONS, the scraper waiting for its turn is closed, unanswered,
                # and the probe answered.
                assert get(f"{url}/health/ready").startswith(b'{"ready": true')
                waiting.settimeout(WAIT)
                assert waiting.recv(1024) == b""

    await scraped(Pages(), clients)
