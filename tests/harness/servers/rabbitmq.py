"""A private RabbitMQ node for tests: its own ports, data directory, epmd and process group.

It runs the Debian package's ``rabbitmq-server`` script (no init script, no service) with every
location and port taken from environment variables pointing into a per-instance directory,
and only the STOMP plugin enabled::

    broker = RabbitMQ().start()          # blocks until the STOMP port answers a CONNECT
    broker.url                           # 'stomp+rabbitmq://mdb:PASSWORD@127.0.0.1:PORT'
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
and 4369: this node uses neither). The nodes of a cluster share one (``Epmd``, and
``tests.harness.servers.rabbitmq_cluster``).

The node's one user (``username``, with a password of its own, in ``url``) may do anything on
vhost ``/``; there is no ``guest``. ``ctl`` runs ``rabbitmqctl`` against the node (vhosts, users,
permissions); ``stored`` counts what each queue holds. ``RabbitMQ(tls=Certificates)`` adds a
STOMP TLS listener (``tls_url``).

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
import threading
import time
import uuid
from collections.abc import Iterable
from pathlib import Path

from tests.harness.servers.certificates import Certificates
from tests.harness.servers.process import BrokerProcess, free_port

RABBITMQ_SERVER = Path(
    os.environ.get("MDB_RABBITMQ_SERVER", "/usr/lib/rabbitmq/bin/rabbitmq-server")
)

def rabbitmq_available() -> bool:
    """True when the ``rabbitmq-server`` script, ``epmd`` and the STOMP plugin exist here."""
    if not RABBITMQ_SERVER.is_file() or shutil.which("epmd") is None:
        return False
    plugins = RABBITMQ_SERVER.resolve().parents[1] / "plugins"
    if not plugins.is_dir():  # Debian: /usr/lib/rabbitmq/lib/rabbitmq_server-X/plugins
        found = list(Path("/usr/lib/rabbitmq/lib").glob("rabbitmq_server-*/plugins"))
        plugins = found[0] if found else plugins
    return any(plugins.glob("rabbitmq_stomp-*"))


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


class Epmd:
    """An Erlang port mapper on its own port: a foreground child, stopped by its PID.

    A node registers its name here and looks other nodes up here, so the nodes of one cluster
    share one ``Epmd`` (``RabbitMQ(epmd=...)``); a lone node has its own.
    """

    def __init__(self, host: str, log_path: Path) -> None:
        self.host, self.log_path = host, log_path
        self.port = free_port(host)
        self._process: subprocess.Popen[bytes] | None = None
        self._starting = threading.Lock()  # the nodes of a cluster start in parallel
        atexit.register(self.stop)  # a run that dies half-way leaves no epmd behind

    def start(self, env: dict[str, str] | None) -> None:
        """Start it unless it runs; return once its port answers. Thread-safe."""
        with self._starting:
            self._start(env)

    def _start(self, env: dict[str, str] | None) -> None:
        if self._process is not None and self._process.poll() is None:
            return
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen(
                [shutil.which("epmd") or "epmd", "-port", str(self.port), "-address", self.host],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 10.0
        while not _port_open(self.host, self.port):
            if self._process.poll() is not None or time.monotonic() >= deadline:
                raise RuntimeError(f"epmd did not start on port {self.port}")
            time.sleep(0.02)

    def stop(self) -> None:
        """Kill it (by its PID) and wait; no-op when not running."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()


class RabbitMQ(BrokerProcess):
    """One private RabbitMQ node. Not thread-safe; meant for test fixtures.

    ``base_dir`` (default: a new temporary directory, deleted by ``close``) holds the
    configuration, ``mnesia/`` (the data) and ``log/``. The STOMP, AMQP, distribution and epmd
    ports default to free ones and stay the same across ``restart``. ``pid`` is the
    ``rabbitmq-server`` script's PID, also the id of the node's process group: ``pause`` and
    ``resume`` signal that group, ``kill`` (and the fallback of ``stop``) SIGKILL it. epmd keeps
    running across ``kill`` (as a machine's epmd would) until ``close``. ``host`` (default
    ``127.0.0.1``) is the address its listeners and epmd bind (epmd also listens on loopback).

    ``epmd``: a port mapper shared with other nodes (a cluster's), which then outlives this
    node's ``close``; default: one of its own. ``home``: the ``HOME`` whose ``.erlang.cookie``
    the node and ``ctl`` use (nodes of a cluster share one); default: ``base_dir``.
    """

    name = "RabbitMQ"
    scheme = "stomp+rabbitmq"
    vhost = "/"
    poll_interval = 0.1
    signal_group = True

    def __init__(
        self,
        base_dir: Path | str | None = None,
        *,
        port: int | None = None,
        startup_timeout: float = 90.0,
        tls: Certificates | None = None,
        host: str | None = None,
        epmd: Epmd | None = None,
        home: Path | None = None,
    ) -> None:
        super().__init__(
            base_dir, port=port, startup_timeout=startup_timeout, dir_prefix="mdb-rabbitmq-",
            host=host,
        )
        self.config_path = self.base_dir / "rabbitmq.conf"
        self.plugins_path = self.base_dir / "enabled_plugins"
        self.env_path = self.base_dir / "rabbitmq-env.conf"
        self.mnesia_dir = self.base_dir / "mnesia"
        self.log_dir = self.base_dir / "log"
        self.amqp_port = free_port(self.host)
        self.dist_port = free_port(self.host)
        self._owns_epmd = epmd is None
        self.epmd = epmd or Epmd(self.host, self.base_dir / "epmd.log")
        self.home = home or self.base_dir
        self.nodename = f"mdbtest-{uuid.uuid4().hex[:10]}@localhost"
        self.tls = tls
        self.tls_port = free_port(self.host) if tls is not None else None

    @property
    def tls_url(self) -> str:
        """``url`` for the STOMP TLS listener (server certificate only), when started with
        ``tls``."""
        if self.tls_port is None:
            raise RuntimeError("this node has no TLS listener (RabbitMQ(tls=...))")
        return f"{self.scheme}://{self.username}:{self.password}@{self.host}:{self.tls_port}"

    def ctl(self, *args: str) -> str:
        """Run ``rabbitmqctl ARGS`` against this node; its output. ``RuntimeError`` if it
        fails."""
        _, env = self._command()
        assert env is not None
        done = subprocess.run(
            [str(RABBITMQ_SERVER.parent / "rabbitmqctl"), "-n", self.nodename, *args],
            env=env, capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"rabbitmqctl {' '.join(args)}: {done.stdout}{done.stderr}")
        return done.stdout

    def stored(self) -> dict[str, int]:
        """How many messages each queue of this node holds, delivered and not yet acked ones
        included (``rabbitmqctl list_queues``' ``messages``)."""
        listed = self.ctl("list_queues", "name", "messages", "--no-table-headers", "--quiet")
        return {name: int(count) for name, count in
                (line.split("\t") for line in listed.splitlines() if line)}

    def elect(self, *queues: str) -> None:
        """Have this node's member of each quorum queue of ``queues`` (vhost ``/``) stand for
        leader. A single node's quorum queue has none after a kill -9 and restart (3.10.8:
        still none after 120 s, while a clean restart elects one at once), and everything sent
        to it waits unanswered (docs/rabbitmq.md#queue-types)."""
        members = ", ".join(f"{{'%2F_{queue}', node()}}" for queue in queues)
        self.ctl("eval", f"[ra:trigger_election(M) || M <- [{members}]].")

    def _prepare(self) -> None:
        self.mnesia_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(
            "\n".join(
                [
                    f"listeners.tcp.1 = {self.host}:{self.amqp_port}",
                    f"stomp.listeners.tcp.1 = {self.host}:{self.port}",
                    # The node's only user, made on first boot (there is no guest); STOMP
                    # has no default user: a CONNECT without login is refused.
                    f"default_user = {self.username}",
                    f"default_pass = {self.password}",
                    *self._tls_config(),
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

    def _tls_config(self) -> list[str]:
        if self.tls is None:
            return []
        return [
            f"stomp.listeners.ssl.1 = {self.host}:{self.tls_port}",
            f"ssl_options.cacertfile = {self.tls.ca}",
            f"ssl_options.certfile = {self.tls.server_cert}",
            f"ssl_options.keyfile = {self.tls.server_key}",
            "ssl_options.verify = verify_none",
            "ssl_options.fail_if_no_peer_cert = false",
        ]

    def _command(self) -> tuple[list[str], dict[str, str] | None]:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "HOME": str(self.home),  # the Erlang cookie lives here
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
            "ERL_EPMD_PORT": str(self.epmd.port),
            "ERL_EPMD_ADDRESS": self.host,
        }
        return [str(RABBITMQ_SERVER)], env

    def _before_launch(self, env: dict[str, str] | None) -> None:
        self.epmd.start(env)

    def _reap(self) -> None:
        """SIGKILL to the node's process group (its id is the script's PID), then wait for the
        script: the SIGTERM of ``stop`` reaches the VM only through the script."""
        process = self._process
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    def _close_helpers(self) -> None:
        if self._owns_epmd:
            self.epmd.stop()

    def _forget(self) -> None:
        # Stays registered until ``close``: the atexit clean-up must still stop its epmd.
        self._paused = False

    def _log_paths(self) -> Iterable[Path]:
        return (self.console_path, *sorted(self.log_dir.glob("*.log")))
