"""A RabbitMQ cluster node killed under load, and the container going on through another, timed.

``kill_node`` kills (SIGKILL) the cluster node the fleet's processes are connected to, while
they consume, and returns the time from the kill until a process processed a message over its
new connection (after it reported the lost one). The fault test, the random fault run and
``python -m tests.faults.tools.node_loss`` (the measurement of docs/failover.md) share it, and the
settings: one broker ``a`` at every node's address, with quorum queues (``cluster_settings``, or
``with_cluster`` to add the cluster to other brokers as one more member). ``left_behind`` takes
what the cluster's queues still hold once the fleet stopped.
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import stomp

from mdb import Settings
from mdb.config.broker_settings import BrokerSettings
from mdb.config.settings import MemberSettings
from mdb.messages.headers import ID
from tests.faults.tools.command_line import not_installed, parser_for
from tests.harness.apps.in_process import unique
from tests.harness.processes.fleet import WAIT, Fleet, fault_settings, fleet
from tests.harness.servers.rabbitmq import RabbitMQ, rabbitmq_available
from tests.harness.servers.rabbitmq_cluster import RabbitMQCluster
from tests.harness.traffic.ledger import PER_APP
from tests.harness.traffic.load_producer import LoadProducer

BROKER = "a"  # the cluster's broker name in ``cluster_settings``


def cluster_settings(cluster: RabbitMQCluster, topic: str) -> Settings:
    """``fault_settings`` with one broker, ``a``, at all of ``cluster``'s addresses (in node
    order: a reconnect tries the next node), its queues quorum queues."""
    settings = fault_settings([cluster.urls], topic)
    return settings.model_copy(update={"brokers": {BROKER: cluster_broker(settings, BROKER)}})


def cluster_broker(settings: Settings, name: str) -> BrokerSettings:
    """Broker ``name`` of ``settings`` (a cluster's addresses) with quorum queues."""
    return settings.brokers[name].model_copy(update={"queue_type": "quorum"})


def with_cluster(settings: Settings, cluster: RabbitMQCluster, topic: str, name: str,
                 ) -> Settings:
    """``settings`` (``fault_settings`` of a partitioned topic) and broker ``name`` at
    ``cluster``'s addresses, with quorum queues, holding one more member of
    ``topic:<topic>``."""
    broker = cluster_broker(fault_settings([cluster.urls], topic), BROKER)
    key = f"topic:{topic}"
    members = [*settings.destinations[key].members, MemberSettings(broker=name)]
    return settings.model_copy(update={
        "brokers": {**settings.brokers, name: broker},
        "destinations": {**settings.destinations,
                         key: settings.destinations[key].model_copy(update={"members": members})}})


def next_node(cluster: RabbitMQCluster, index: int) -> int:
    """The node a broker's connections move to when node ``index`` dies: the next running one
    in address order (a reconnect round starts at the address that failed)."""
    count = len(cluster.nodes)
    return next(i % count for i in range(index + 1, index + count)
                if cluster.nodes[i % count].running)


@dataclass(frozen=True)
class NodeLoss:
    killed: int  # the index of the node killed
    consumed_after: float  # seconds from the kill until a message was processed elsewhere

    def __str__(self) -> str:
        return (f"node {self.killed} killed: a message processed through another node after "
                f"{self.consumed_after:.2f} s")


def kill_node(cluster: RabbitMQCluster, index: int, processes: Fleet, app: str) -> NodeLoss:
    """SIGKILL node ``index`` (the one ``app``'s processes are connected to) and wait until one
    of them reports the lost connection and then processes a message: over a new connection,
    to another node. Fails (AssertionError) if none was connected to it."""
    pids = {p.process.pid for p in processes.processes if processes.app_of.get(p.process.pid)
            == app and p.process.poll() is None}
    start = len(processes.seen)
    killed_at = time.monotonic()
    cluster.nodes[index].kill()

    def resumed(f: Fleet) -> bool:
        lost: set[int] = set()
        for entry in f.seen[start:]:  # one process's lines arrive in the order it wrote them
            pid = entry.get("pid")
            if pid not in pids:
                continue
            if entry.get("event") == "connection-lost":
                lost.add(pid)
            elif entry.get("event") == "done" and pid in lost:
                return True
        return False

    processes.wait(resumed, f"{app} processing through another node than node {index}")
    return NodeLoss(index, time.monotonic() - killed_at)


def stored(nodes: Sequence[RabbitMQ]) -> dict[str, int]:
    """How many messages each queue of a cluster's ``nodes`` (or of one node) holds, asked of
    a running node."""
    return next(n for n in nodes if n.running).stored()


class _Taker(stomp.ConnectionListener):  # type: ignore[misc]
    def __init__(self, count: int) -> None:
        self.ids: list[str] = []
        self.count = count
        self.taken = threading.Event()

    def on_message(self, frame: Any) -> None:
        self.ids.append(frame.headers.get(ID, ""))
        if len(self.ids) >= self.count:
            self.taken.set()


def left_behind(nodes: Sequence[RabbitMQ], names: Collection[str],
                told: Collection[str] | None) -> dict[str, list[str]]:
    """Told-sent messages (with ``told`` None: any) still stored in the queues of a cluster's
    ``nodes`` (or of one node) whose name contains one of ``names``, after the fleet stopped:
    ``{queue: [ids]}`` for each queue holding any. What the queues hold is taken
    (``/amq/queue/`` with ``ack:auto``: it declares nothing, so the queue's type does not
    matter)."""
    told_set, found = None if told is None else set(told), {}
    node = next(n for n in nodes if n.running)
    for queue, count in stored(nodes).items():
        if not count or not any(name in queue for name in names):
            continue
        connection = stomp.Connection12([(node.host, node.port)], vhost="/")
        taker = _Taker(count)
        connection.set_listener("taker", taker)
        connection.connect(node.username, node.password, wait=True)
        try:
            connection.subscribe(f"/amq/queue/{queue}", id="take", ack="auto")
            # The count may be the queue's last published figure, taken before the fleet's
            # last acks: stop once the queue says it is empty too.
            deadline = time.monotonic() + WAIT
            while not taker.taken.wait(1.0):
                assert time.monotonic() < deadline, f"{queue}: {len(taker.ids)} of {count} taken"
                if not stored(nodes).get(queue):
                    break
        finally:
            connection.disconnect()
        if kept := [i for i in taker.ids if told_set is None or i in told_set]:
            found[queue] = kept
    return found


def measure(rounds: int) -> list[NodeLoss]:
    """``rounds`` node kills (each time the killed node restarts and rejoins) with one container
    process of a ``one-copy-per-app`` app on a topic, and a producer, on a three-node cluster."""
    topic, app = unique("nodeloss"), unique("shop")
    times = []
    with RabbitMQCluster() as cluster:
        settings = cluster_settings(cluster, topic)
        with fleet(settings, topic) as processes:
            processes.start(app, ["s1"], PER_APP)
            with LoadProducer(settings, topic, pace=0.01) as producer:
                producer.wait_told(50)
                active = 0
                for _ in range(rounds):
                    loss = kill_node(cluster, active, processes, app)
                    print(loss, flush=True)
                    times.append(loss)
                    active = next_node(cluster, active)
                    cluster.nodes[loss.killed].restart()
                    cluster.wait_members(len(cluster.nodes))
            processes.stop()
    return times


def main(argv: Sequence[str] | None = None) -> int:
    parser = parser_for("node_loss", __doc__)
    parser.add_argument("--rounds", type=int, default=10, help="node kills to time")
    args = parser.parse_args(argv)
    if not rabbitmq_available():
        return not_installed("RabbitMQ with the STOMP plugin")
    values = [t.consumed_after for t in measure(args.rounds)]
    print(f"kill -9 to a message processed through another node: median "
          f"{statistics.median(values):.2f} s, min {min(values):.2f} s, max {max(values):.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
