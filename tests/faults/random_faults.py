"""A randomized fault run (a soak, not a pytest test): ``python -m tests.faults.random_faults
--minutes 10 --seed 7``.

It starts three private ActiveMQ brokers and a shared-store master/slave pair (broker ``d``, at
both addresses) holding a partitioned topic (one member on each), app ``shop`` with two
container processes on a shared subscription (``one-copy-per-app``) and app ``audit`` with one
server (``one-copy-per-server``), and a producer sending continuously. For
``--minutes`` it applies a schedule of faults drawn from ``--seed``, one at a time with random
gaps of load between them:

* ``broker-kill``: SIGKILL one broker, keep it down a while, restart it (same port and data);
* ``broker-pause``: SIGSTOP one broker for a while (longer than the heartbeat timeout or not),
  then SIGCONT;
* ``container-kill``: SIGKILL one container process and start it again under its server name;
* ``master-kill``: SIGKILL the pair's master; the slave takes over (``tests.faults.takeover``);
  the killed broker starts again as the slave;
* ``node-kill``: SIGKILL one node of a three-node RabbitMQ cluster (broker ``r``, at the three
  nodes' addresses, with quorum queues, holding one more member of the topic), wait until its
  member is consumed again while the node is down, then restart the node (it rejoins). Left
  out by ``--no-cluster`` or when RabbitMQ is not installed;
* ``partition``: cut one container process's network link for 2 to 3 heart-beat intervals
  (around the broker's tolerance of a silent client: it may or may not drop the process's
  connections and hand its messages to another), then heal it.

The partition needs network namespaces (root and iproute2, ``tests.harness.netns``): where this
machine has them, every broker (the pair and the cluster's nodes too) listens on a private
bridge and every container process runs in its own namespace (the same one again after a
restart); elsewhere the run has no partitions.

After each fault it waits until the affected broker's member is consumed again (or the process
is ready, or consumes, again): the fault is then counted as survived (a takeover's times are
printed). At the end it stops the producer, waits until everything told-sent is processed (or
``--drain`` seconds pass), stops the processes in order and prints a table. The exit status is
1 when a message is lost or a repeat was not flagged redelivered (or a fault was not
survived), else 0.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import Counter
from collections.abc import Sequence
from contextlib import ExitStack

from tests.contract.support import unique
from tests.faults.ledger import (
    PER_APP,
    PER_SERVER,
    Fleet,
    LoadProducer,
    Verdict,
    fault_settings,
    fleet,
    left_behind,
)
from tests.faults.node_loss import left_behind as left_on_cluster
from tests.faults.node_loss import with_cluster
from tests.faults.takeover import take_over
from tests.harness.activemq import ActiveMQ, activemq_available
from tests.harness.activemq_pair import SharedStorePair
from tests.harness.netns import Namespace, Network, network_available, private_network
from tests.harness.process import BrokerProcess, started_together
from tests.harness.rabbitmq import rabbitmq_available
from tests.harness.rabbitmq_cluster import RabbitMQCluster

KINDS = ("broker-kill", "broker-pause", "container-kill", "master-kill", "node-kill",
         "partition")
NAMES = ("a", "b", "c")
PAIR = "d"  # the shared-store pair's broker name
CLUSTER = "r"  # the RabbitMQ cluster's broker name


class Rooms:
    """Where each container process runs: its own network namespace, one per app and server
    and kept across restarts, on ``network``; the host's network when there is none."""

    def __init__(self, network: Network | None) -> None:
        self.network = network
        self._rooms: dict[tuple[str, str], Namespace] = {}

    def of(self, app: str, server: str) -> Namespace | None:
        if self.network is None:
            return None
        if (app, server) not in self._rooms:
            self._rooms[app, server] = self.network.namespace()
        return self._rooms[app, server]

    def start(self, processes: Fleet, app: str, servers: Sequence[str], distribution: str,
              ) -> None:
        for server in servers:
            room = self.of(app, server)
            processes.start(app, [server], distribution, prefix=room.prefix if room else ())


def consumed_again(processes: Fleet, producer: LoadProducer, app: str, broker: str,
                   count: int = 3) -> None:
    """Wait until ``app`` processed ``count`` messages sent to ``broker`` from now on."""
    before = set(producer.told)

    def again(f: Fleet) -> bool:
        new = {i for i, b in producer.told.items() if b == broker and i not in before}
        return len(new & f.processed(app)) >= count

    processes.wait(again, f"{app} consuming {broker}'s member again")


def run(minutes: float, seed: int, drain: float, cluster: bool) -> int:
    rng = random.Random(seed)
    topic, shop, audit = unique("soak"), unique("shop"), unique("audit")
    survived: Counter[str] = Counter()
    failures: list[str] = []
    with ExitStack() as stack:
        network = stack.enter_context(private_network()) if network_available() else None
        kinds = tuple(k for k in KINDS if (k != "node-kill" or cluster)
                      and (k != "partition" or network))
        rooms = Rooms(network)
        host = network.address if network else None
        brokers = stack.enter_context(started_together(lambda: ActiveMQ(host=host), 3))
        pair = stack.enter_context(SharedStorePair(host=host))
        rabbit = stack.enter_context(RabbitMQCluster(host=host)) if cluster else None
        settings = fault_settings([*(b.url for b in brokers), pair.urls], topic)
        if rabbit is not None:
            settings = with_cluster(settings, rabbit, topic, CLUSTER)
        with fleet(settings, topic) as processes:
            rooms.start(processes, shop, ["s1", "s2"], PER_APP)
            rooms.start(processes, audit, ["s1"], PER_SERVER)
            with LoadProducer(settings, topic, pace=0.01) as producer:
                end = time.monotonic() + minutes * 60
                while time.monotonic() < end:
                    processes.hold(rng.uniform(1.0, 6.0))
                    kind = rng.choice(kinds)
                    try:
                        if kind == "master-kill":
                            kill_master(rng, pair, processes, producer, shop)
                        elif kind == "node-kill":
                            assert rabbit is not None
                            kill_cluster_node(rng, rabbit, processes, producer, shop)
                        else:
                            apply(kind, rng, brokers, processes, producer, shop, rooms)
                    except AssertionError as exc:  # not survived: report, stop the schedule
                        failures.append(f"{kind}: {exc}"[:500])
                        for broker in brokers:
                            broker.resume()
                        break
                    survived[kind] += 1
                    print(f"[{time.strftime('%H:%M:%S')}] survived {kind} "
                          f"(told {len(producer.told)}, raised {len(producer.raised)})",
                          flush=True)
            told = producer.told
            if not processes.drain(told, timeout=drain):
                failures.append(f"drain: not everything processed within {drain} s")
            processes.stop()
            verdicts = processes.verdicts(told)
            stored = left_behind([*brokers, pair.master()], processes, told)
            if rabbit is not None:
                stored |= left_on_cluster(rabbit, [topic], told)
    print_table(survived, verdicts, len(told), producer.raised, stored, failures)
    bad = any(v.lost or v.unflagged for v in verdicts.values()) or bool(stored or failures)
    return 1 if bad else 0


def apply(kind: str, rng: random.Random, brokers: Sequence[BrokerProcess], processes: Fleet,
          producer: LoadProducer, shop: str, rooms: Rooms) -> None:
    if kind in ("container-kill", "partition"):
        victim = rng.choice(processes.alive())
        app = processes.app_of[victim.process.pid]
        if kind == "container-kill":
            processes.kill(victim)
            processes.hold(rng.uniform(0.0, 3.0))
            rooms.start(processes, app, [victim.server], processes.distribution[app])
            return
        room = rooms.of(app, victim.server)
        assert room is not None  # partitions are drawn only where there are namespaces
        heartbeat = processes.settings.brokers[NAMES[0]].heartbeat_ms / 1000
        since = len(processes.seen)
        room.cut()
        try:
            processes.hold(rng.uniform(2.0, 3.0) * heartbeat)
        finally:
            room.heal()
        pid = victim.process.pid
        processes.wait(lambda f: f.consumed_since(pid, since), f"process {pid} consuming again")
        return
    index = rng.randrange(len(brokers))
    broker, outage = brokers[index], rng.uniform(0.5, 6.0)
    if kind == "broker-kill":
        broker.kill()
        processes.hold(outage)
        broker.restart()  # same port, same data directory
    else:
        broker.pause()
        processes.hold(outage)
        broker.resume()
    consumed_again(processes, producer, shop, NAMES[index])


def kill_master(rng: random.Random, pair: SharedStorePair, processes: Fleet,
                producer: LoadProducer, shop: str) -> None:
    """``master-kill``: SIGKILL the pair's master, wait until ``shop`` consumes the pair's
    member on the slave, then start the killed broker again as the slave."""
    taken = take_over(pair, processes, producer, shop, PAIR)
    print(f"  takeover {taken}", flush=True)
    processes.hold(rng.uniform(0.0, 3.0))
    pair.start_as_slave(taken.killed)


def kill_cluster_node(rng: random.Random, cluster: RabbitMQCluster, processes: Fleet,
                      producer: LoadProducer, shop: str) -> None:
    """``node-kill``: SIGKILL a node of the cluster (the one the processes are connected to,
    or another), wait until ``shop`` consumes the cluster's member again while it is down, then
    restart it and wait until it is back in the cluster."""
    node = rng.choice(cluster.nodes)
    node.kill()
    processes.hold(rng.uniform(0.0, 3.0))
    consumed_again(processes, producer, shop, CLUSTER)
    node.restart()  # it rejoins: its data remembers the cluster
    cluster.wait_members(len(cluster.nodes))


def print_table(survived: Counter[str], verdicts: dict[str, Verdict], told: int,
                raised: dict[str, str], stored: dict[str, list[str]], failures: list[str],
                ) -> None:
    print()
    print("faults survived: " + ", ".join(f"{k} {survived[k]}" for k in KINDS)
          + f" (total {sum(survived.values())})")
    print(f"messages told-sent: {told}; sends that raised: {len(raised)} "
          f"{dict(Counter(raised.values()))}")
    header = ("view", "told", "processed", "deliveries", "dup flagged", "dup unflagged",
              "lost", "unconfirmed")
    rows = [header] + [
        (key.split("_")[0] + key[key.index("/"):] if "/" in key else key.split("_")[0],
         str(v.told), str(v.processed), str(v.deliveries), str(v.flagged),
         str(len(v.unflagged)), str(len(v.lost)), str(v.unconfirmed))
        for key, v in sorted(verdicts.items())]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for row in rows:
        print("  ".join(c.rjust(w) if i else c.ljust(w)
                        for i, (c, w) in enumerate(zip(row, widths, strict=True))))
    print(f"left behind on the brokers: {sum(len(v) for v in stored.values())} {stored or ''}")
    for failure in failures:
        print(f"NOT SURVIVED: {failure}")
    lost = sum(len(v.lost) for v in verdicts.values())
    unflagged = sum(len(v.unflagged) for v in verdicts.values())
    print(f"result: lost {lost}, unflagged {unflagged} -> "
          + ("FAIL" if lost or unflagged or stored or failures else "ok"))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults.random_faults",
                                     description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--minutes", type=float, default=10.0, help="how long faults go on")
    parser.add_argument("--seed", type=int, default=7, help="seed of the fault schedule")
    parser.add_argument("--drain", type=float, default=120.0,
                        help="seconds to wait at the end for everything to be processed")
    parser.add_argument("--no-cluster", action="store_true",
                        help="leave the RabbitMQ cluster (and its node-kill faults) out")
    args = parser.parse_args(argv)
    if not activemq_available():
        print("ActiveMQ Classic is not installed here", file=sys.stderr)
        return 2
    return run(args.minutes, args.seed, args.drain,
               cluster=not args.no_cluster and rabbitmq_available())


if __name__ == "__main__":
    sys.exit(main())
