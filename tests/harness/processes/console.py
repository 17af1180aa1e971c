"""``mdb console`` for tests: in this process on an event loop of its own (``console``), or as
an operator starts it (``ConsoleProcess``); and a client without a browser that keeps the
session's cookie and reads the forms' CSRF field (``Visitor``)."""

from __future__ import annotations

import http.cookiejar
import os
import queue
import re
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import anyio

from mdb.commands.console.console_command import serve
from mdb.commands.console.router import Control
from mdb.config.settings import Settings


@contextmanager
def console(settings: Settings, control: Control) -> Iterator[str]:
    """The console of ``settings`` on its own event loop in a thread; yields its URL."""
    urls: queue.Queue[str] = queue.Queue()
    cancel: list[anyio.CancelScope] = []
    loop: list[anyio.lowlevel.EventLoopToken] = []

    async def run() -> None:
        with anyio.CancelScope() as scope:
            cancel.append(scope)
            loop.append(anyio.lowlevel.current_token())
            await serve(settings, control,
                        ready=lambda port: urls.put(f"http://127.0.0.1:{port}"))

    thread = threading.Thread(target=anyio.run, args=(run,), daemon=True)
    thread.start()
    try:
        yield urls.get(timeout=30)
    finally:
        anyio.from_thread.run_sync(cancel[0].cancel, token=loop[0])
        thread.join(timeout=30)


class Visitor:
    """A client of the console, its cookies kept."""

    def __init__(self, base: str) -> None:
        self.base = base
        self._opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))

    def get(self, path: str) -> tuple[int, str]:
        return self._open(urllib.request.Request(self.base + path))

    def post(self, path: str, fields: Sequence[tuple[str, str]] = (), *,
             body: bytes | None = None) -> tuple[int, str]:
        data = urllib.parse.urlencode(fields).encode() if body is None else body
        return self._open(urllib.request.Request(self.base + path, data=data, method="POST"))

    def login(self, token: str) -> str:
        """Log in; the CSRF token of the session."""
        status, page = self.post("/login", [("token", token)])
        assert status == 200, page
        found = re.search(r'name="csrf" value="([^"]+)"', page)
        assert found, page
        return found.group(1)

    def _open(self, request: urllib.request.Request) -> tuple[int, str]:
        try:
            with self._opener.open(request, timeout=30) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()


class ConsoleProcess:
    """``mdb console --config CONFIG`` in its own process (no ``MDB_*`` variable of the test's
    reaches it); ``url`` once it listens, ``tail`` its last lines of output."""

    def __init__(self, config: Path, cwd: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "mdb.commands.cli", "console", "--config", str(config)],
            cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={k: v for k, v in os.environ.items() if not k.startswith("MDB_")})
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        found = re.search(r"on (http://\S+?)/? ", line)
        assert found, line
        self.url = found.group(1)
        self.tail: deque[str] = deque(maxlen=30)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.tail.append(line.rstrip("\n"))

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)
