"""A private RabbitMQ node for tests: its own ports, data directory, epmd and process group.

It runs the Debian package's ``rabbitmq-server`` script (no init script, no service) with every
location and port taken from environment variables pointing into a per-instance directory,
and only the STOMP plugin enabled::

    broker = RabbitMQ().start()          # blocks until the STOMP port answers a CONNECT
    broker.url                           # 'stomp+rabbitmq://127.0.0.1:PORT'
    broker.kill(); broker.restart()      # same data directory and ports: durable queues survive
    broker.pause(); broker.resume()      # SIGSTOP / SIGCONT of the Erlang VM: a hung broker
    broker.close()                       # stop and delete the temporary directory

Processes. ``rabbitmq-server`` is a shell script that starts the Erlang VM (``beam.smp``) as
its child and forwards SIGTERM to it; it is started in a new session, so the script, the VM
and the VM's helpers (``erl_child_setup``, ``inet_gethost``) form one process group whose id
is the script's PID (``pid``). ``stop`` sends SIGTERM to the script; ``kill`` and the fallback
of ``stop`` send SIGKILL to that process group only. Each node gets its own ``epmd`` on its own
port (``ERL_EPMD_PORT``), started here as a foreground child and stopped by its PID, so nothing
is registered with, or left behind in, a system-wide epmd (a system RabbitMQ may run on 5672
and 4369: this node uses neither).

Readiness is polled with a STOMP CONNECT (``host:/``, RabbitMQ's vhost) against a deadline,
never a fixed sleep. The node logs to ``<base>/log/`` and its console goes to
``<base>/console.log``; ``log_tail()`` shows both when a start fails.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from types import TracebackType

from tests.harness.activemq import free_port

RABBITMQ_SERVER = Path(
    os.environ.get("MDB_RABBITMQ_SERVER", "/usr/lib/rabbitmq/bin/rabbitmq-server")
)

_STOMP_CONNECT = (
    b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\x00"
)
_STOMP_DISCONNECT = b"DISCONNECT\n\n\x00"
_POLL_INTERVAL = 0.1

_running: set[RabbitMQ] = set()


def rabbitmq_available() -> bool:
    """True when the ``rabbitmq-server`` script, ``epmd`` and the STOMP plugin exist here."""
    if not RABBITMQ_SERVER.is_file() or shutil.which("epmd") is None:
        return False
    plugins = RABBITMQ_SERVER.resolve().parents[1] / "plugins"
    if not plugins.is_dir():  # Debian: /usr/lib/rabbitmq/lib/rabbitmq_server-X/plugins
        found = list(Path("/usr/lib/rabbitmq/lib").glob("rabbitmq_server-*/plugins"))
        plugins = found[0] if found else plugins
    return any(plugins.glob("rabbitmq_stomp-*"))


def stomp_answers(host: str, port: int, timeout: float = 2.0) -> bool:
    """True if ``host:port`` answers a STOMP CONNECT to vhost ``/`` with CONNECTED in time."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(_STOMP_CONNECT)
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


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


class RabbitMQ:
    """One private RabbitMQ node. Not thread-safe; meant for test fixtures.

    ``base_dir`` (default: a new temporary directory, deleted by ``close``) holds the
    configuration, ``mnesia/`` (the data) and ``log/``. The STOMP, AMQP, distribution and epmd
    ports default to free ones and stay the same across ``restart``.
    """

    host = "127.0.0.1"

    def __init__(
        self,
        base_dir: Path | str | None = None,
        *,
        port: int | None = None,
        startup_timeout: float = 90.0,
    ) -> None:
        self._owns_dir = base_dir is None
        self.base_dir = Path(base_dir or tempfile.mkdtemp(prefix="mdb-rabbitmq-"))
        self.config_path = self.base_dir / "rabbitmq.conf"
        self.plugins_path = self.base_dir / "enabled_plugins"
        self.env_path = self.base_dir / "rabbitmq-env.conf"
        self.mnesia_dir = self.base_dir / "mnesia"
        self.log_dir = self.base_dir / "log"
        self.console_path = self.base_dir / "console.log"
        self.port = port or free_port(self.host)
        self.amqp_port = free_port(self.host)
        self.dist_port = free_port(self.host)
        self.epmd_port = free_port(self.host)
        self.nodename = f"mdbtest-{uuid.uuid4().hex[:10]}@localhost"
        self._startup_timeout = startup_timeout
        self._process: subprocess.Popen[bytes] | None = None
        self._epmd: subprocess.Popen[bytes] | None = None
        self._paused = False

    # -- identity ---------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"stomp+rabbitmq://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        """The ``rabbitmq-server`` script's PID, also the id of the node's process group."""
        if self._process is None:
            raise RuntimeError("the broker was never started")
        return self._process.pid

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> RabbitMQ:
        """Start epmd and the node; return once the STOMP port answers a CONNECT.

        Raises ``RuntimeError`` (with the end of the logs) if the node exits or the port does
        not answer within ``startup_timeout``; everything started is killed then.
        """
        if self.running:
            raise RuntimeError(f"broker already running (pid {self.pid})")
        self.mnesia_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(
            "\n".join(
                [
                    f"listeners.tcp.1 = {self.host}:{self.amqp_port}",
                    f"stomp.listeners.tcp.1 = {self.host}:{self.port}",
                    # A CONNECT without login uses guest, who may connect from loopback only.
                    "stomp.default_user = guest",
                    "stomp.default_pass = guest",
                    "loopback_users.guest = true",
                    "log.console = false",
                    "log.file.level = info",
                    # Test machines are small; do not block publishers on free disk.
                    "disk_free_limit.absolute = 1MB",
                    "",
                ]
            )
        )
        self.plugins_path.write_text("[rabbitmq_stomp].\n")
        self.env_path.write_text("")  # keeps /etc/rabbitmq/rabbitmq-env.conf out
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "HOME": str(self.base_dir),  # the Erlang cookie lives here
            "RABBITMQ_CONF_ENV_FILE": str(self.env_path),
            "RABBITMQ_NODENAME": self.nodename,
            "RABBITMQ_NODE_IP_ADDRESS": self.host,
            "RABBITMQ_NODE_PORT": str(self.amqp_port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_CONFIG_FILE": str(self.config_path),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(self.base_dir / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.plugins_path),
            "RABBITMQ_MNESIA_BASE": str(self.mnesia_dir),
            "RABBITMQ_LOG_BASE": str(self.log_dir),
            "RABBITMQ_PID_FILE": str(self.base_dir / "rabbitmq.pid"),
            "ERL_EPMD_PORT": str(self.epmd_port),
            "ERL_EPMD_ADDRESS": self.host,
        }
        _running.add(self)
        try:
            self._start_epmd(env)
            with open(self.console_path, "ab") as console:
                self._process = subprocess.Popen(
                    [str(RABBITMQ_SERVER)],
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

    def _start_epmd(self, env: dict[str, str]) -> None:
        if self._epmd is not None and self._epmd.poll() is None:
            return
        with open(self.base_dir / "epmd.log", "ab") as log:
            self._epmd = subprocess.Popen(
                [shutil.which("epmd") or "epmd", "-port", str(self.epmd_port),
                 "-address", self.host],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 10.0
        while not _port_open(self.host, self.epmd_port):
            if self._epmd.poll() is not None or time.monotonic() >= deadline:
                raise RuntimeError(f"epmd did not start on port {self.epmd_port}")
            time.sleep(0.02)

    def wait_ready(self, timeout: float) -> None:
        """Poll until the STOMP port answers a CONNECT; ``RuntimeError`` after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            if not self.running:
                raise RuntimeError(f"RabbitMQ exited during startup:\n{self.log_tail()}")
            if stomp_answers(self.host, self.port, timeout=min(2.0, timeout)):
                return
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"RabbitMQ did not answer STOMP on port {self.port} within {timeout}s:\n"
                    f"{self.log_tail()}"
                )
            time.sleep(_POLL_INTERVAL)

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM to the script (after SIGCONT if paused), which stops the VM; SIGKILL to the
        node's process group if still alive after ``timeout``. Returns once all of it is gone.
        No-op when not running."""
        process = self._process
        if process is None or process.poll() is not None:
            self._kill_group()
            self._forget()
            return
        if self._paused:
            self.resume()
        process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout)
        self._kill_group()
        self._forget()

    def kill(self) -> None:
        """SIGKILL to the node's process group and wait for the script: a crash, nothing
        flushed. epmd keeps running (as a machine's epmd would) until ``close``."""
        self._kill_group()
        self._forget()

    def pause(self) -> None:
        """SIGSTOP to the node's process group: the VM hangs, its sockets stay open."""
        if self.running and not self._paused:
            os.killpg(self.pid, signal.SIGSTOP)
            self._paused = True

    def resume(self) -> None:
        """SIGCONT after ``pause``."""
        if self.running and self._paused:
            os.killpg(self.pid, signal.SIGCONT)
            self._paused = False

    def restart(self) -> RabbitMQ:
        """Stop if running (gracefully), then start again on the same data directory, node
        name and ports."""
        self.stop()
        return self.start()

    def close(self) -> None:
        """Stop the node and its epmd, and delete the base directory if it was a temporary
        one made here."""
        self.stop()
        epmd, self._epmd = self._epmd, None
        if epmd is not None and epmd.poll() is None:
            epmd.kill()
            epmd.wait()
        _running.discard(self)
        if self._owns_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the console output and of the node's log, for error messages."""
        parts = []
        for path in (self.console_path, *sorted(self.log_dir.glob("*.log"))):
            if path.exists():
                text = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"--- {path}\n" + "\n".join(text))
        return "\n".join(parts) or "(no output)"

    def _kill_group(self) -> None:
        process = self._process
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # the group's id is the script's PID
        process.wait()

    def _forget(self) -> None:
        self._paused = False

    def __enter__(self) -> RabbitMQ:
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
        return f"<RabbitMQ {self.url} {state} in {self.base_dir}>"


@atexit.register
def _kill_leftovers() -> None:
    # A test run that dies half-way must not leave Erlang VMs or epmds behind.
    for broker in list(_running):
        broker.kill()
        epmd = broker._epmd
        if epmd is not None and epmd.poll() is None:
            epmd.kill()
