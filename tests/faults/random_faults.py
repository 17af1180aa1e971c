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
  out by ``--no-cluster`` or when RabbitMQ is not installed.

After each fault it waits until the affected broker's member is consumed again (or the process
is ready again): the fault is then counted as survived (a takeover's times are printed). At the
end it stops the producer, waits until everything told-sent is processed (or ``--drain``
seconds pass), stops the processes in order and prints a table. The exit status is 1 when a
message is lost or a repeat was not flagged redelivered (or a fault was not survived), else 0.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import Counter
from collections.abc import Sequence
from contextlib import nullcontext

from tests.contract.support import unique
from tests.faults.ledger import (
    PER_APP,
    PER_SERVER,
    WAIT,
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
from tests.harness.process import BrokerProcess, started_together
from tests.harness.rabbitmq import rabbitmq_available
from tests.harness.rabbitmq_cluster import RabbitMQCluster

KINDS = ("broker-kill", "broker-pause", "container-kill", "master-kill", "node-kill")
NAMES = ("a", "b", "c")
PAIR = "d"  # the shared-store pair's broker name
CLUSTER = "r"  # the RabbitMQ cluster's broker name


def hold(processes: Fleet, seconds: float) -> None:
    """Let ``seconds`` of load pass, reading the ledger meanwhile."""
    until = time.monotonic() + seconds
    processes.wait(lambda f: time.monotonic() >= until, "a gap", timeout=seconds + WAIT)


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
    kinds = KINDS if cluster else tuple(k for k in KINDS if k != "node-kill")
    with started_together(ActiveMQ, 3) as brokers, SharedStorePair() as pair, \
            (RabbitMQCluster() if cluster else nullcontext()) as rabbit:
        settings = fault_settings([*(b.url for b in brokers), pair.urls], topic)
        if rabbit is not None:
            settings = with_cluster(settings, rabbit, topic, CLUSTER)
        with fleet(settings, topic) as processes:
            processes.start(shop, ["s1", "s2"], PER_APP)
            processes.start(audit, ["s1"], PER_SERVER)
            with LoadProducer(settings, topic, pace=0.01) as producer:
                end = time.monotonic() + minutes * 60
                while time.monotonic() < end:
                    hold(processes, rng.uniform(1.0, 6.0))
                    kind = rng.choice(kinds)
                    try:
                        if kind == "master-kill":
                            kill_master(rng, pair, processes, producer, shop)
                        elif kind == "node-kill":
                            assert rabbit is not None
                            kill_cluster_node(rng, rabbit, processes, producer, shop)
                        else:
                            apply(kind, rng, brokers, processes, producer, shop)
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
          producer: LoadProducer, shop: str) -> None:
    if kind == "container-kill":
        victim = rng.choice(processes.alive())
        app = processes.app_of[victim.process.pid]
        processes.kill(victim)
        hold(processes, rng.uniform(0.0, 3.0))
        processes.start(app, [victim.server], processes.distribution[app])
        return
    index = rng.randrange(len(brokers))
    broker, outage = brokers[index], rng.uniform(0.5, 6.0)
    if kind == "broker-kill":
        broker.kill()
        hold(processes, outage)
        broker.restart()  # same port, same data directory
    else:
        broker.pause()
        hold(processes, outage)
        broker.resume()
    consumed_again(processes, producer, shop, NAMES[index])


def kill_master(rng: random.Random, pair: SharedStorePair, processes: Fleet,
                producer: LoadProducer, shop: str) -> None:
    """``master-kill``: SIGKILL the pair's master, wait until ``shop`` consumes the pair's
    member on the slave, then start the killed broker again as the slave."""
    taken = take_over(pair, processes, producer, shop, PAIR)
    print(f"  takeover {taken}", flush=True)
    hold(processes, rng.uniform(0.0, 3.0))
    pair.start_as_slave(taken.killed)


def kill_cluster_node(rng: random.Random, cluster: RabbitMQCluster, processes: Fleet,
                      producer: LoadProducer, shop: str) -> None:
    """``node-kill``: SIGKILL a node of the cluster (the one the processes are connected to,
    or another), wait until ``shop`` consumes the cluster's member again while it is down, then
    restart it and wait until it is back in the cluster."""
    node = rng.choice(cluster.nodes)
    node.kill()
    hold(processes, rng.uniform(0.0, 3.0))
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
