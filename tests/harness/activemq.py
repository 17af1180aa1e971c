"""A private ActiveMQ Classic broker for tests: its own port, data directory and JVM process.

It runs the Debian package's jar directly (no init script, no service), with the reference
configuration shipped in ``mdb_stomp/activemq.xml`` copied into a per-instance ``conf``
directory::

    broker = ActiveMQ().start()          # blocks until the STOMP port answers a CONNECT
    broker.url                           # 'stomp+activemq://127.0.0.1:PORT'
    broker.kill(); broker.restart()      # same data directory and port: messages survive
    broker.pause(); broker.resume()      # SIGSTOP / SIGCONT: a hung broker
    broker.close()                       # stop and delete the temporary directory

Signals go to the broker's PID only. Readiness is polled with a STOMP CONNECT against a
deadline, never a fixed sleep. The broker writes its log to ``<base>/data/activemq.log`` and its
console to ``<base>/console.log``; ``log_tail()`` shows both when a start fails.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from importlib import resources
from pathlib import Path
from types import TracebackType

ACTIVEMQ_HOME = Path(os.environ.get("MDB_ACTIVEMQ_HOME", "/usr/share/activemq"))
ACTIVEMQ_JAR = ACTIVEMQ_HOME / "bin" / "activemq.jar"

# ActiveMQ 5.17 from Debian logs through log4j 1.2 (slf4j-log4j12), which reads this from the
# classpath, i.e. the instance's conf directory. Without it the broker logs nothing.
_LOG4J_PROPERTIES = """\
log4j.rootLogger=INFO, logfile
log4j.logger.org.springframework=WARN
log4j.logger.org.apache.xbean=WARN
log4j.logger.org.apache.activemq.spring=WARN
log4j.appender.logfile=org.apache.log4j.FileAppender
log4j.appender.logfile.file=${activemq.data}/activemq.log
log4j.appender.logfile.append=true
log4j.appender.logfile.layout=org.apache.log4j.PatternLayout
log4j.appender.logfile.layout.ConversionPattern=%d | %-5p | %m | %c | %t%n
"""

_STOMP_CONNECT = b"CONNECT\naccept-version:1.2\nhost:127.0.0.1\n\n\x00"
_STOMP_DISCONNECT = b"DISCONNECT\n\n\x00"
_POLL_INTERVAL = 0.05

_running: set[ActiveMQ] = set()


def activemq_available() -> bool:
    """True when the ActiveMQ jar and a ``java`` executable exist on this machine."""
    return ACTIVEMQ_JAR.is_file() and shutil.which("java") is not None


def reference_config() -> Path:
    """The reference broker configuration shipped with the ``mdb_stomp`` adapter: the source
    tree's copy when running from a checkout, else the installed package's."""
    in_tree = Path(__file__).resolve().parents[2] / "adapters" / "mdb_stomp" / "activemq.xml"
    if in_tree.is_file():
        return in_tree
    return Path(str(resources.files("mdb_stomp") / "activemq.xml"))


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (another process could still take it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def stomp_answers(host: str, port: int, timeout: float = 2.0) -> bool:
    """True if ``host:port`` answers a STOMP CONNECT with CONNECTED within ``timeout``."""
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


class ActiveMQ:
    """One private broker process. Not thread-safe; meant for test fixtures.

    ``base_dir`` (default: a new temporary directory, deleted by ``close``) holds ``conf/`` and
    ``data/``; ``port`` defaults to a free one and stays the same across ``restart``.
    """

    host = "127.0.0.1"

    def __init__(
        self,
        base_dir: Path | str | None = None,
        *,
        port: int | None = None,
        config: Path | str | None = None,
        heap_mb: int = 256,
        startup_timeout: float = 60.0,
        jvm_args: tuple[str, ...] = (),
    ) -> None:
        self._owns_dir = base_dir is None
        self.base_dir = Path(base_dir or tempfile.mkdtemp(prefix="mdb-activemq-"))
        self.conf_dir = self.base_dir / "conf"
        self.data_dir = self.base_dir / "data"
        self.console_path = self.base_dir / "console.log"
        self.log_path = self.data_dir / "activemq.log"
        self.port = port or free_port(self.host)
        self._config = Path(config) if config is not None else reference_config()
        self._heap_mb = heap_mb
        self._startup_timeout = startup_timeout
        self._jvm_args = jvm_args
        self._process: subprocess.Popen[bytes] | None = None
        self._paused = False

    # -- identity ---------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"stomp+activemq://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        if self._process is None:
            raise RuntimeError("the broker was never started")
        return self._process.pid

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> ActiveMQ:
        """Start the JVM and return once the STOMP port answers a CONNECT.

        Raises ``RuntimeError`` (with the end of the logs) if the process exits or the port does
        not answer within ``startup_timeout``; the process is killed then.
        """
        if self.running:
            raise RuntimeError(f"broker already running (pid {self.pid})")
        self.conf_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self._config, self.conf_dir / "activemq.xml")
        (self.conf_dir / "log4j.properties").write_text(_LOG4J_PROPERTIES)
        command = [
            shutil.which("java") or "java",
            f"-Xmx{self._heap_mb}m",
            f"-Dactivemq.home={ACTIVEMQ_HOME}",
            f"-Dactivemq.base={self.base_dir}",
            f"-Dactivemq.conf={self.conf_dir}",
            f"-Dactivemq.data={self.data_dir}",
            f"-Dactivemq.classpath={self.conf_dir}",
            f"-Dmdb.stomp.host={self.host}",
            f"-Dmdb.stomp.port={self.port}",
            *self._jvm_args,
            "-jar",
            str(ACTIVEMQ_JAR),
            "start",
            f"xbean:file:{self.conf_dir / 'activemq.xml'}",
        ]
        with open(self.console_path, "ab") as console:
            self._process = subprocess.Popen(
                command,
                cwd=self.base_dir,
                stdin=subprocess.DEVNULL,
                stdout=console,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C in the terminal is the test's, not the broker's
            )
        self._paused = False
        _running.add(self)
        try:
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
                raise RuntimeError(f"ActiveMQ exited during startup:\n{self.log_tail()}")
            if stomp_answers(self.host, self.port, timeout=min(2.0, timeout)):
                return
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"ActiveMQ did not answer STOMP on port {self.port} within {timeout}s:\n"
                    f"{self.log_tail()}"
                )
            time.sleep(_POLL_INTERVAL)

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (after SIGCONT if paused), then SIGKILL if still alive after ``timeout``;
        returns once the process is gone. No-op when not running."""
        process = self._process
        if process is None or process.poll() is not None:
            self._forget()
            return
        if self._paused:
            self.resume()
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        self._forget()

    def kill(self) -> None:
        """SIGKILL and wait for the process to be gone: a crash, nothing flushed."""
        process = self._process
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()
        self._forget()

    def pause(self) -> None:
        """SIGSTOP: the broker hangs, its sockets stay open (TCP still accepts connections)."""
        if self.running and not self._paused:
            os.kill(self.pid, signal.SIGSTOP)
            self._paused = True

    def resume(self) -> None:
        """SIGCONT after ``pause``."""
        if self.running and self._paused:
            os.kill(self.pid, signal.SIGCONT)
            self._paused = False

    def restart(self) -> ActiveMQ:
        """Stop if running (gracefully), then start again on the same data directory and port."""
        self.stop()
        return self.start()

    def close(self) -> None:
        """Stop, and delete the base directory if it was a temporary one made here."""
        self.stop()
        if self._owns_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the console output and of the broker log, for error messages."""
        parts = []
        for path in (self.console_path, self.log_path):
            if path.exists():
                text = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"--- {path}\n" + "\n".join(text))
        return "\n".join(parts) or "(no output)"

    def _forget(self) -> None:
        self._paused = False
        _running.discard(self)

    def __enter__(self) -> ActiveMQ:
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
        return f"<ActiveMQ {self.url} {state} in {self.base_dir}>"


@atexit.register
def _kill_leftovers() -> None:
    # A test run that dies half-way must not leave JVMs behind.
    for broker in list(_running):
        broker.kill()
