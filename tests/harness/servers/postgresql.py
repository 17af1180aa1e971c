"""A private PostgreSQL server for tests: its own port, data directory and postmaster process.

It runs Debian's binaries directly (``initdb``, then ``postgres`` in the foreground: no
cluster of ``pg_createcluster``, no service; the machine's own server on 5432 is left alone)::

    server = PostgreSQL().start()        # blocks until it accepts connections
    server.create_database("orders")     # 'postgresql+asyncpg://mdb@127.0.0.1:PORT/orders'
    server.stop_immediately()            # `pg_ctl stop -m immediate`: a crash, recovered at start
    server.crash()                       # kill -9 of the postmaster alone; its children follow
    server.pause(); server.resume()      # SIGSTOP / SIGCONT of its processes: a hung server
    server.start()                       # same port and data directory
    server.close()                       # stop and delete the temporary directory

initdb and the server refuse to run as root: under root both run as the ``postgres`` system
user, on a data directory handed to it. Clients log in as ``mdb`` (the cluster's superuser)
with trust authentication on 127.0.0.1 only; the Unix socket is in the instance's directory.
Readiness is polled with ``pg_isready`` against a deadline, never a fixed sleep. The server's
log goes to ``<base>/console.log``; ``log_tail()`` shows it when a start fails.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Self

from tests.harness.servers.database_server import DatabaseServer, can_run_as

USER = "mdb"
_SYSTEM_USER = "postgres"


def postgresql_bin() -> Path | None:
    """The directory of the newest Debian PostgreSQL's binaries (``MDB_POSTGRESQL_BIN``
    overrides it), or None when none is installed."""
    override = os.environ.get("MDB_POSTGRESQL_BIN")
    if override:
        return Path(override)
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"),
                   key=lambda p: int(p.parts[-3]) if p.parts[-3].isdigit() else 0)
    return found[-1].parent if found else None


def postgresql_available() -> bool:
    """True when initdb and postgres exist here, and a user they will run as."""
    bin_dir = postgresql_bin()
    return bin_dir is not None and (bin_dir / "initdb").is_file() and can_run_as(_SYSTEM_USER)


class PostgreSQL(DatabaseServer):
    """One private PostgreSQL server. Not thread-safe; meant for test fixtures.

    ``base_dir`` (default: a new temporary directory, deleted by ``close``) holds ``data/``
    (made by ``initdb`` at the first ``start``), the socket and ``console.log``; ``port``
    defaults to a free one and stays the same across restarts. It listens on ``host`` only
    (default ``127.0.0.1``; a private network's bridge address for the partition tests) and
    lets in, without a password, clients of the networks that address is on."""

    def __init__(self, base_dir: Path | None = None, *, port: int | None = None,
                 startup_timeout: float = 60.0, host: str = "127.0.0.1") -> None:
        bin_dir = postgresql_bin()
        if bin_dir is None:
            raise RuntimeError("PostgreSQL is not installed (apt-get install postgresql)")
        self.bin_dir = bin_dir
        super().__init__("postgresql", _SYSTEM_USER, base_dir, port, startup_timeout, host)

    def url(self, database: str = "postgres") -> str:
        """The SQLAlchemy URL (asyncpg) of ``database`` on this server."""
        return f"postgresql+asyncpg://{USER}@{self.host}:{self.port}/{database}"

    def start(self) -> Self:
        """Start the server (initdb first, the first time) and return once it accepts
        connections. ``RuntimeError`` with the end of its log if it exits or does not answer
        within ``startup_timeout``; the process is then killed."""
        if self.running:
            raise RuntimeError(f"PostgreSQL already running (pid {self.pid})")
        if not (self.data_dir / "PG_VERSION").exists():
            self._run(self.bin_dir / "initdb", "-D", str(self.data_dir), "-U", USER,
                      "-A", "trust", "-E", "UTF8", "--no-sync")
            # initdb trusts the loopback addresses only; a host on a private bridge has its
            # clients in network namespaces on the bridge's subnet.
            with open(self.data_dir / "pg_hba.conf", "a") as hba:
                hba.write("host all all samenet trust\n")
        self.started()
        with open(self.console_path, "ab") as console:
            self._process = subprocess.Popen(
                [str(self.bin_dir / "postgres"), "-D", str(self.data_dir), "-p", str(self.port),
                 "-c", f"listen_addresses={self.host}",
                 "-c", f"unix_socket_directories={self.base_dir}",
                 # The tests crash the server's processes, never the machine: what a commit
                 # wrote is in the OS's cache either way, so fsync would only slow them.
                 "-c", "fsync=off", "-c", "full_page_writes=off",
                 "-c", "max_connections=200"],
                stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT,
                start_new_session=True, user=self._user, group=self._user)
        try:
            self._wait_ready()
        except BaseException:
            self.kill()
            raise
        return self

    def create_database(self, name: str) -> str:
        """Create database ``name`` (empty) and return its URL."""
        self._client("createdb", name)
        return self.url(name)

    def stop(self, timeout: float = 30.0) -> None:
        """A fast shutdown (SIGINT, ``pg_ctl stop -m fast``), then SIGKILL after
        ``timeout``; returns once the postmaster is gone."""
        self._end(signal.SIGINT, timeout)

    def stop_immediately(self) -> None:
        """``pg_ctl stop -m immediate`` (SIGQUIT): every server process exits at once, no
        checkpoint; the next ``start`` recovers from the WAL, as after a crash."""
        self._end(signal.SIGQUIT, 30.0)

    def crash(self, timeout: float = 30.0) -> None:
        """SIGKILL of the postmaster alone, as an out-of-memory killer does it: its children
        notice it died and exit (a backend once its statement ended, answered or not; a
        commit it made is in the WAL); returns once they all did, as a new postmaster
        refuses to start beside them. One still there after ``timeout`` is killed."""
        children = self._server_pids()[1:]
        self.kill()
        deadline = time.monotonic() + timeout
        while alive := [pid for pid in children if _alive(pid)]:
            if time.monotonic() >= deadline:
                for pid in alive:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)

    def pause(self) -> None:
        """SIGSTOP to every server process: a hung server, whose port still accepts
        connections (the kernel's backlog) and answers nothing, not even on the connections
        it had."""
        self._signal_all(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after ``pause``."""
        self._signal_all(signal.SIGCONT)

    def _signal_all(self, signum: int) -> None:
        for pid in self._server_pids():
            # A backend may end between the listing and the signal (its client left).
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    def _server_pids(self) -> list[int]:
        """The postmaster and its children: each child is a process group of its own (it
        calls setsid), so the postmaster's group holds only itself."""
        children = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:  # it ended meanwhile
                continue
            if int(fields[1]) == self.pid:  # its parent
                children.append(int(stat.parent.name))
        return [self.pid, *children]

    def _end(self, signum: int, timeout: float) -> None:
        process = self._process
        if process is not None and process.poll() is None:
            self.resume()  # a paused server could not stop
            process.send_signal(signum)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout)
        # The postmaster's children end with it; a straggler would hold the port.
        self.kill()

    def _wait_ready(self) -> None:
        self.wait_ready("PostgreSQL", [
            str(self.bin_dir / "pg_isready"), "-q", "-h", self.host, "-p", str(self.port),
            "-U", USER, "-t", "2"])

    def _client(self, tool: str, *args: str) -> None:
        self._run(self.bin_dir / tool, "-h", self.host, "-p", str(self.port), "-U", USER, *args,
                  as_server=False)

    def _run(self, program: Path, *args: str, as_server: bool = True) -> None:
        done = subprocess.run([str(program), *args], capture_output=True, text=True,
                              check=False, timeout=120, cwd=self.base_dir,
                              user=self._user if as_server else None,
                              group=self._user if as_server else None)
        if done.returncode != 0:
            raise RuntimeError(f"{program.name} {' '.join(args)}: {done.stdout}{done.stderr}")

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.running else "stopped"
        return f"<PostgreSQL {self.url()} {state} in {self.base_dir}>"


def _alive(pid: int) -> bool:
    """True while ``pid`` runs: not gone, not a zombie its new parent did not reap yet."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"

