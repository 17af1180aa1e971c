"""A private MariaDB server for tests: its own port, data directory, socket and process.

It runs Debian's binaries directly (``mariadb-install-db``, then ``mariadbd`` in the
foreground: no service; the machine's own server on 3306 is left alone)::

    server = MariaDB().start()           # blocks until it accepts connections
    server.create_database("orders")     # 'mysql+asyncmy://mdb:***@127.0.0.1:PORT/orders'
    server.crash()                       # kill -9 of mariadbd: InnoDB recovers at the next start
    server.pause(); server.resume()      # SIGSTOP / SIGCONT: a hung server
    server.start()                       # same port and data directory
    server.close()                       # stop and delete the temporary directory

Under root the server runs as the ``mysql`` system user (``--user``), on a directory handed to
it. The administrator logs in through the instance's Unix socket by the name of the process's
own user (unix_socket authentication, set up by ``mariadb-install-db``) and creates the login
clients use over TCP: ``mdb`` with a password, so that credentials are exercised as on a real
server, and every privilege (PostgreSQL's ``mdb`` is its superuser): a test may make logins of
its own. Readiness is polled with ``mariadb-admin ping`` against a deadline, never a fixed
sleep. The server's log goes to ``<base>/console.log``; ``log_tail()`` shows it when a start
fails.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Self

from tests.harness.servers.database_server import DatabaseServer, can_run_as

USER = "mdb"
PASSWORD = "mdb-secret"
_SYSTEM_USER = "mysql"


def mariadb_available() -> bool:
    """True when mariadb-install-db and mariadbd exist here, and a user they will run as."""
    return (_program("mariadbd") is not None and _program("mariadb-install-db") is not None
            and can_run_as(_SYSTEM_USER))


def _program(name: str) -> str | None:
    # mariadbd is in /usr/sbin, which a user's PATH may lack.
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin")


class MariaDB(DatabaseServer):
    """One private MariaDB server. Not thread-safe; meant for test fixtures.

    ``base_dir`` (default: a new temporary directory, deleted by ``close``) holds ``data/``
    (made by ``mariadb-install-db`` at the first ``start``), the socket and ``console.log``;
    ``port`` defaults to a free one and stays the same across restarts."""

    def __init__(self, base_dir: Path | None = None, *, port: int | None = None,
                 startup_timeout: float = 60.0, host: str = "127.0.0.1") -> None:
        if not mariadb_available():
            raise RuntimeError("MariaDB is not installed (apt-get install mariadb-server)")
        super().__init__("mariadb", _SYSTEM_USER, base_dir, port, startup_timeout, host)
        self.socket = self.base_dir / "mariadbd.sock"
        self._admin = getpass.getuser()

    def url(self, database: str = "mysql") -> str:
        """The SQLAlchemy URL (asyncmy) of ``database`` on this server, with mdb's login."""
        return f"mysql+asyncmy://{USER}:{PASSWORD}@{self.host}:{self.port}/{database}"

    def start(self) -> Self:
        """Start the server (``mariadb-install-db`` and the login first, the first time) and
        return once it accepts connections. ``RuntimeError`` with the end of its log if it
        exits or does not answer within ``startup_timeout``; the process is then killed."""
        if self.running:
            raise RuntimeError(f"MariaDB already running (pid {self.pid})")
        first = not (self.data_dir / "mysql").is_dir()
        if first:
            self._run(_program("mariadb-install-db") or "mariadb-install-db", "--no-defaults",
                      f"--datadir={self.data_dir}", "--auth-root-authentication-method=socket",
                      f"--auth-root-socket-user={self._admin}", "--skip-test-db",
                      *([f"--user={self._user}"] if self._user else []))
        self.started()
        with open(self.console_path, "ab") as console:
            self._process = subprocess.Popen(
                [_program("mariadbd") or "mariadbd", "--no-defaults",
                 f"--datadir={self.data_dir}", f"--port={self.port}",
                 f"--bind-address={self.host}", f"--socket={self.socket}",
                 f"--pid-file={self.base_dir / 'mariadbd.pid'}",
                 f"--log-error={self.console_path}", "--skip-name-resolve",
                 "--max-connections=200", "--innodb-buffer-pool-size=64M",
                 "--max-allowed-packet=256M",  # what mdb asks for (docs/exactly-once.md)
                 # The tests kill the server, never the machine: a commit written to the OS's
                 # cache survives them, so flushing it to the disk would only slow them.
                 "--innodb-flush-log-at-trx-commit=2", "--innodb-doublewrite=0",
                 *([f"--user={self._user}"] if self._user else [])],
                stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT,
                start_new_session=True)
        try:
            self._wait_ready()
            if first:
                self._sql(f"CREATE USER '{USER}'@'%' IDENTIFIED BY '{PASSWORD}'; "
                          f"GRANT ALL PRIVILEGES ON *.* TO '{USER}'@'%' WITH GRANT OPTION")
        except BaseException:
            self.kill()
            raise
        return self

    def create_database(self, name: str) -> str:
        """Create database ``name`` (empty) and return its URL."""
        self._sql(f"CREATE DATABASE `{name}`")
        return self.url(name)

    def stop(self, timeout: float = 30.0) -> None:
        """A normal shutdown (SIGTERM), then SIGKILL after ``timeout``; returns once the
        server is gone."""
        process = self._process
        if process is not None and process.poll() is None:
            self.resume()  # a paused server could not stop
            process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout)
        self.kill()

    def crash(self) -> None:
        """SIGKILL of mariadbd (one process: its connections are threads): what a commit
        wrote is in InnoDB's log, replayed by the next ``start``."""
        self.kill()

    def pause(self) -> None:
        """SIGSTOP: a hung server, whose port still accepts connections (the kernel's
        backlog) and answers nothing, not even on the connections it had."""
        if self.running:
            os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after ``pause``."""
        if self.running:
            os.kill(self.pid, signal.SIGCONT)

    def _wait_ready(self) -> None:
        self.wait_ready("MariaDB", [
            _program("mariadb-admin") or "mariadb-admin", "--no-defaults",
            f"--socket={self.socket}", f"--user={self._admin}", "--connect-timeout=2", "ping"])

    def _sql(self, statements: str) -> None:
        """Run ``statements`` as the administrator, through the socket."""
        self._run(_program("mariadb") or "mariadb", "--no-defaults", f"--socket={self.socket}",
                  f"--user={self._admin}", "-e", statements)

    def _run(self, program: str, *args: str) -> None:
        done = subprocess.run([program, *args], capture_output=True, text=True, check=False,
                              timeout=120, cwd=self.base_dir)
        if done.returncode != 0:
            raise RuntimeError(f"{Path(program).name} {' '.join(args)}: "
                               f"{done.stdout}{done.stderr}")

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.running else "stopped"
        return f"<MariaDB 127.0.0.1:{self.port} {state} in {self.base_dir}>"

