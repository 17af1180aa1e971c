"""Three private RabbitMQ nodes joined into one cluster, for the high-availability tests.

Each node is a ``tests.harness.servers.rabbitmq.RabbitMQ`` with its own node name, STOMP, AMQP and
distribution ports and data directory; all share one ``epmd`` (a node finds the others through
it) and one Erlang cookie, in a private ``HOME`` (the cluster's directory)::

    with RabbitMQCluster() as cluster:      # started and joined: one cluster of three
        cluster.urls                        # every node's STOMP URL, the same login on each
        cluster.nodes[0].kill()             # kill -9 one node
        cluster.nodes[0].restart()          # it rejoins the cluster (its data remembers it)
        cluster.members()                   # the running members, as rabbitmqctl sees them

Joining is what an operator does (docs/failover.md): the first node starts alone; each other
node starts, then ``rabbitmqctl stop_app``, ``join_cluster <first node>``, ``start_app``. A
joining node throws its own data away and takes the cluster's (users included), so every node
is given the first node's password before it starts: the URLs all log in as ``mdb`` with one
password. Everything is stopped by PID (the nodes' process groups, then the epmd).
"""

from __future__ import annotations

import json
import secrets
import shutil
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Self

from tests.harness.servers.process import start_all
from tests.harness.servers.rabbitmq import Epmd, RabbitMQ


class RabbitMQCluster:
    """``size`` private RabbitMQ nodes in one cluster, listening on ``host`` (default
    ``127.0.0.1``; see ``RabbitMQ``). Not thread-safe; for test fixtures."""

    def __init__(self, size: int = 3, *, startup_timeout: float = 90.0,
                 host: str | None = None) -> None:
        self.base_dir = Path(tempfile.mkdtemp(prefix="mdb-rabbitmq-cluster-"))
        cookie = self.base_dir / ".erlang.cookie"
        cookie.write_text(secrets.token_hex(16))
        cookie.chmod(0o400)  # Erlang refuses a cookie others may read
        self.epmd = Epmd(host or RabbitMQ.host, self.base_dir / "epmd.log")
        self.nodes = [
            RabbitMQ(self.base_dir / f"node{i}", startup_timeout=startup_timeout,
                     epmd=self.epmd, home=self.base_dir, host=host)
            for i in range(size)
        ]
        for node in self.nodes:
            node.base_dir.mkdir()
            node.password = self.nodes[0].password

    @property
    def urls(self) -> list[str]:
        """Every node's STOMP URL (credentials included), in node order."""
        return [node.url for node in self.nodes]

    def start(self) -> Self:
        """Start every node (in parallel), then join the others to the first; return once each
        answers STOMP as a member of the cluster. Everything is killed if that fails."""
        try:
            start_all(self.nodes)
            first = self.nodes[0]
            for node in self.nodes[1:]:
                node.ctl("stop_app")
                node.ctl("join_cluster", first.nodename)
                node.ctl("start_app")
                node.wait_ready(60.0)
            self.wait_members(len(self.nodes))
        except BaseException:
            self.close()
            raise
        return self

    def members(self) -> set[str]:
        """The node names of the running cluster members, asked of a running node."""
        node = next(n for n in self.nodes if n.running)
        status = node.ctl("cluster_status", "--formatter", "json")
        return set(json.loads(status)["running_nodes"])

    def wait_members(self, count: int, timeout: float = 60.0) -> None:
        """Poll ``cluster_status`` until ``count`` nodes run in the cluster."""
        deadline = time.monotonic() + timeout
        while len(running := self.members()) < count:
            if time.monotonic() >= deadline:
                raise RuntimeError(f"only {sorted(running)} of {count} nodes in the cluster")
            time.sleep(0.2)

    def close(self) -> None:
        """Stop every node, then the epmd, and delete the cluster's directory."""
        for node in self.nodes:
            node.close()
        self.epmd.stop()
        shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()
