"""What the harness's private database servers (``tests.harness.servers.postgresql``,
``tests.harness.servers.mariadb``) share: a directory of their own, a console log, a run as the
database's system user under root, kill -9 of the whole process group, and none left behind
by a test run that dies half-way."""

from __future__ import annotations

import atexit
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Self

from tests.harness.servers.process import ChildProcess, free_port

_running: set[DatabaseServer] = set()


def can_run_as(system_user: str) -> bool:
    """Whether a server can run here as it must: under root as ``system_user`` (which its
    Debian package makes), else as this process's user."""
    if os.getuid() != 0:
        return True
    try:
        pwd.getpwnam(system_user)
    except KeyError:
        return False
    return True


class DatabaseServer(ChildProcess):
    """A private database server. ``base_dir`` (default: a new temporary directory, deleted by
    ``close``) holds ``data/`` and ``console.log``; ``port`` defaults to a free one and stays
    the same across restarts; under root the server runs as ``system_user``, who is given the
    directory. A subclass starts it (``start``, which calls ``started``) and stops it
    (``stop``)."""

    def __init__(self, kind: str, system_user: str, base_dir: Path | None, port: int | None,
                 startup_timeout: float, host: str) -> None:
        self.host = host
        self._owns_dir = base_dir is None
        self.base_dir = base_dir or Path(tempfile.mkdtemp(prefix=f"mdb-{kind}-"))
        self.data_dir = self.base_dir / "data"
        self.console_path = self.base_dir / "console.log"
        self.port = port or free_port(self.host)
        self._startup_timeout = startup_timeout
        self._user = system_user if os.getuid() == 0 else None
        if self._user is not None:
            entry = pwd.getpwnam(self._user)
            os.chown(self.base_dir, entry.pw_uid, entry.pw_gid)

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self, timeout: float = 30.0) -> None:
        raise NotImplementedError

    def wait_ready(self, name: str, ping: list[str]) -> None:
        """Return once ``ping`` (the server's own client asking whether it accepts
        connections) succeeds; ``RuntimeError`` with the end of its log if the server exits or
        does not answer within ``startup_timeout``. Polled: a starting server tells no one."""
        deadline = time.monotonic() + self._startup_timeout
        while True:
            if not self.running:
                raise RuntimeError(f"{name} exited during startup:\n{self.log_tail()}")
            if subprocess.run(ping, capture_output=True, check=False).returncode == 0:
                return
            if time.monotonic() >= deadline:
                raise RuntimeError(f"{name} did not accept connections on port {self.port} "
                                   f"within {self._startup_timeout}s:\n{self.log_tail()}")
            time.sleep(0.05)

    def started(self) -> None:
        """Counts the server among those killed at the test run's exit."""
        _running.add(self)

    def kill(self) -> None:
        """SIGKILL the server's process group: nothing is left running."""
        process = self._process
        if process is not None and process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        _running.discard(self)

    def close(self) -> None:
        """Stop, and delete the base directory if it was a temporary one made here."""
        self.stop()
        if self._owns_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def log_tail(self, lines: int = 40) -> str:
        if not self.console_path.exists():
            return "(no output)"
        return "\n".join(self.console_path.read_text(errors="replace").splitlines()[-lines:])

    def __enter__(self) -> Self:
        return self if self.running else self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()


@atexit.register
def _kill_leftovers() -> None:
    for server in list(_running):
        server.kill()
