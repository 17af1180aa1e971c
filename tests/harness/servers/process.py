"""What every private test broker shares: one process group started in its own session, a
STOMP port polled for readiness, and the lifecycle around it.

A subclass says only what differs: its command line and environment (``_command``), the
configuration it writes first (``_prepare``), anything started before it (``_before_launch``),
how a stopped or killed process is finally made gone (``_reap``), where its logs are
(``_log_paths``) and its URL scheme (``scheme``). Readiness is polled with a STOMP CONNECT
against a deadline, never a fixed sleep. Brokers still running when the interpreter exits are
killed (``atexit``), so a test run that dies half-way leaves no VMs behind.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import ClassVar, Self

_STOMP_DISCONNECT = b"DISCONNECT\n\n\x00"

_running: set[BrokerProcess] = set()


def start_all(brokers: Iterable[BrokerProcess]) -> None:
    """Start (or restart, after ``kill``) the brokers that are not running, in parallel;
    return once all answer."""
    stopped = [b for b in brokers if not b.running]
    if stopped:
        with ThreadPoolExecutor(len(stopped)) as starting:
            list(starting.map(lambda b: b.start(), stopped))


@contextmanager
def started_together(make: Callable[[], BrokerProcess],
                     count: int) -> Iterator[list[BrokerProcess]]:
    """``count`` brokers made by ``make``, started in parallel and closed at the end."""
    brokers = [make() for _ in range(count)]
    try:
        start_all(brokers)
        yield brokers
    finally:
        for broker in brokers:
            broker.close()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (another process could still take it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def alive(pid: int) -> bool:
    """Whether process ``pid`` is still there (signal 0 reaches it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def stomp_answers(host: str, port: int, connect_frame: bytes, timeout: float = 2.0) -> bool:
    """True if ``host:port`` answers ``connect_frame`` (a STOMP CONNECT) with CONNECTED within
    ``timeout``."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(connect_frame)
            received = b""
            deadline = time.monotonic() + timeout
            while b"\x00" not in received and time.monotonic() < deadline:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                received += chunk
            if received.lstrip(b"\r\n").startswith(b"CONNECTED"):
                sock.sendall(_STOMP_DISCONNECT)
                return True
    except OSError:
        pass
    return False


class ChildProcess:
    """A server the harness runs as a child process of the test's (a broker, PostgreSQL): its
    pid, and whether it still runs."""

    _process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        if self._process is None:
            raise RuntimeError(f"{type(self).__name__} was never started")
        return self._process.pid

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None


class BrokerProcess(ChildProcess):
    """One private broker process. Not thread-safe; meant for test fixtures.

    ``base_dir`` (default: a new temporary directory, deleted by ``close``) holds everything the
    broker writes; ``port`` (STOMP) defaults to a free one and stays the same across
    ``restart``; ``host`` is the address it listens on (default ``127.0.0.1``; another one
    of this machine, e.g. a ``tests.harness.servers.netns`` bridge's, for clients in namespaces).
    """

    host = "127.0.0.1"
    name: ClassVar[str]  # for messages: "ActiveMQ"
    scheme: ClassVar[str]  # of ``url``: "stomp+activemq"
    vhost: ClassVar[str]  # the CONNECT frame's host header
    username: ClassVar[str] = "mdb"  # every broker requires a login: this one may do anything
    poll_interval: ClassVar[float] = 0.05
    signal_group: ClassVar[bool] = False  # pause/resume the process group, not the PID only

    def __init__(
        self,
        base_dir: Path | str | None,
        *,
        port: int | None,
        startup_timeout: float,
        dir_prefix: str,
        host: str | None = None,
    ) -> None:
        if host is not None:
            self.host = host
        self._owns_dir = base_dir is None
        self.base_dir = Path(base_dir or tempfile.mkdtemp(prefix=dir_prefix))
        self.console_path = self.base_dir / "console.log"
        self.port = port or free_port(self.host)
        self.password = secrets.token_hex(8)
        self._startup_timeout = startup_timeout
        self._paused = False

    # -- what a subclass says ----------------------------------------------------------------

    def _prepare(self) -> None:
        """Write the directories and configuration the process needs."""

    def _command(self) -> tuple[list[str], dict[str, str] | None]:
        """The command line and the environment (``None``: inherit this one)."""
        raise NotImplementedError

    def _before_launch(self, env: dict[str, str] | None) -> None:
        """Start what the broker needs running first."""

    def _reap(self) -> None:
        """Make sure the process (after a SIGTERM, or none) is gone and waited for."""
        process = self._process
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()

    def _log_paths(self) -> Iterable[Path]:
        return (self.console_path,)

    def _close_helpers(self) -> None:
        """Stop, on ``close`` and at exit, what ``_before_launch`` started."""

    # -- identity ----------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The URL mdb connects with, the credentials of ``username`` included."""
        return f"{self.scheme}://{self.username}:{self.password}@{self.host}:{self.port}"

    @property
    def anonymous_url(self) -> str:
        """``url`` without credentials (the broker refuses it)."""
        return f"{self.scheme}://{self.host}:{self.port}"

    @property
    def stomp_connect(self) -> bytes:
        """The CONNECT frame readiness is polled with."""
        return (f"CONNECT\naccept-version:1.2\nhost:{self.vhost}\nlogin:{self.username}\n"
                f"passcode:{self.password}\n\n\x00").encode()

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> Self:
        """Start the process and return once the STOMP port answers a CONNECT.

        Raises ``RuntimeError`` (with the end of the logs) if the process exits or the port does
        not answer within ``startup_timeout``; everything started is killed then.
        """
        if self.running:
            raise RuntimeError(f"broker already running (pid {self.pid})")
        self._prepare()
        command, env = self._command()
        _running.add(self)
        try:
            self._before_launch(env)
            with open(self.console_path, "ab") as console:
                self._process = subprocess.Popen(
                    command,
                    cwd=self.base_dir,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=console,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # its own process group; Ctrl-C stays the test's
                )
            self._paused = False
            self.wait_ready(self._startup_timeout)
        except BaseException:
            self.kill()
            raise
        return self

    def wait_ready(self, timeout: float) -> None:
        """Poll until the STOMP port answers a CONNECT; ``RuntimeError`` after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            if not self.running:
                raise RuntimeError(f"{self.name} exited during startup:\n{self.log_tail()}")
            if stomp_answers(self.host, self.port, self.stomp_connect, min(2.0, timeout)):
                return
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"{self.name} did not answer STOMP on port {self.port} within {timeout}s:\n"
                    f"{self.log_tail()}"
                )
            time.sleep(self.poll_interval)

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (after SIGCONT if paused), then SIGKILL if still alive after ``timeout``;
        returns once the process is gone. No-op when not running."""
        process = self._process
        if process is not None and process.poll() is None:
            if self._paused:
                self.resume()
            process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout)
        self._reap()
        self._forget()

    def kill(self) -> None:
        """SIGKILL and wait for the process to be gone: a crash, nothing flushed."""
        self._reap()
        self._forget()

    def pause(self) -> None:
        """SIGSTOP: the broker hangs, its sockets stay open (TCP still accepts connections)."""
        if self.running and not self._paused:
            self._signal(signal.SIGSTOP)
            self._paused = True

    def resume(self) -> None:
        """SIGCONT after ``pause``."""
        if self.running and self._paused:
            self._signal(signal.SIGCONT)
            self._paused = False

    def restart(self) -> Self:
        """Stop if running (gracefully), then start again on the same data directory and port."""
        self.stop()
        return self.start()

    def close(self) -> None:
        """Stop, and delete the base directory if it was a temporary one made here."""
        self.stop()
        self._close_helpers()
        _running.discard(self)
        if self._owns_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the console output and of the broker's logs, for error messages."""
        parts = []
        for path in self._log_paths():
            if path.exists():
                text = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"--- {path}\n" + "\n".join(text))
        return "\n".join(parts) or "(no output)"

    def _signal(self, signum: int) -> None:
        if self.signal_group:
            os.killpg(self.pid, signum)
        else:
            os.kill(self.pid, signum)

    def _forget(self) -> None:
        self._paused = False
        _running.discard(self)

    def __enter__(self) -> Self:
        return self if self.running else self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = f"pid {self._process.pid}" if self.running and self._process else "stopped"
        return f"<{type(self).__name__} {self.url} {state} in {self.base_dir}>"


@atexit.register
def _kill_leftovers() -> None:
    # A test run that dies half-way must not leave brokers (or their helpers) behind.
    for broker in list(_running):
        broker.kill()
        broker._close_helpers()
