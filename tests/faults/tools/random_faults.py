"""A randomized fault run (a soak, not a pytest test): ``python -m tests.faults.tools.random_faults
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
* ``master-kill``: SIGKILL the pair's master; the slave takes over
  (``tests.faults.tools.takeover``); the killed broker starts again as the slave;
* ``node-kill``: SIGKILL one node of a three-node RabbitMQ cluster (broker ``r``, at the three
  nodes' addresses, with quorum queues, holding one more member of the topic), wait until its
  member is consumed again while the node is down, then restart the node (it rejoins). Left
  out by ``--no-cluster`` or when RabbitMQ is not installed;
* ``partition``: cut one container process's network link for 2 to 3 heart-beat intervals
  (around the broker's tolerance of a silent client: it may or may not drop the process's
  connections and hand its messages to another), then heal it.

The partition needs network namespaces (root and iproute2, ``tests.harness.servers.netns``): where
this machine has them, every broker (the pair and the cluster's nodes too) listens on a private
bridge and every container process runs in its own namespace (the same one again after a
restart); elsewhere the run has no partitions.

After each fault it waits until the affected broker's member is consumed again (or the process
is ready, or consumes, again): the fault is then counted as survived (a takeover's times are
printed). At the end it stops the producer, waits until everything told-sent is processed (or
``--drain`` seconds pass), stops the processes in order and prints a table. The exit status is
1 when a message is lost or a repeat was not flagged redelivered (or a fault was not
survived), else 0.

``--rabbitmq cluster`` (a three-node cluster, quorum queues) or ``--rabbitmq node`` (one node,
classic queues) runs RabbitMQ only, with a two-stage pipeline: app ``shop``'s two processes
consume the topic (stage 1), send each message on to a queue (``ctx.send``) and consume that
queue too (stage 2, ``tests.harness.apps.topic_ledger_app``). Its faults:

* ``node-kill``: SIGKILL a node (on the cluster, any of the three: ``shop`` must consume again
  while it is down) and restart it;
* ``node-pause``: SIGSTOP a node for 0.5 to 6 s (mdb gives up on a silent RabbitMQ after
  2.5 s: past that or not), then SIGCONT;
* ``container-kill`` and ``partition`` as above (a partition lasts 2 to 3 heart-beat
  intervals of 4 s, what RabbitMQ makes of a shorter ``heartbeat_ms``, docs/rabbitmq.md).

The table has a row for each stage: the second stage owes each message the first processed,
under one ``mdb_id``, repeats flagged ``redelivered`` or ``mdb_maybe_repeat``
(``tests.harness.traffic.ledger.check_sent_on``); nothing may be left in either queue. On one node,
a run whose only finding is messages lost that the first stage began to handle within
``IN_FLIGHT`` seconds of a kill -9 of the node, once, unflagged (delivered just before it, never
delivered again) exits 3 (``KNOWN_LOSS``): the open finding docs/failover.md lists among its
known limits, told apart from any other loss, which exits 1. ``--capture
DIR`` (root, ``tcpdump``) records every STOMP packet to and from the nodes in DIR, with the
nodes' log files and each process's log at INFO: evidence of who wrote what that does not
depend on mdb's own logs (``python -m tests.faults.tools.stomp_capture DIR --audit`` or ``DIR
MDB_ID``).

``--exactly-once`` runs exactly-once listeners (docs/exactly-once.md) on three ActiveMQ
brokers and a private PostgreSQL server (``--database mariadb``: a MariaDB server, whose
faults are ``mariadb-kill`` and ``mariadb-pause``, as PostgreSQL's below): two container
processes (``s1``, ``s2``) of one app running the two stages of
``tests.harness.apps.exactly_once_app`` (the first inserts a row of an effect ledger per business
id and sends the id on through the outbox, the second inserts a row per id it receives),
both stages partitioned over the three brokers, one member on each
(``tests.harness.processes.exactly_once_stages``), and a foreign producer (plain stomp.py: no
``mdb_id``, the business id ``mN`` in the body, ``tests.harness.traffic.foreign``) sending to the
first stage's members in turn. Its faults (``upset_pipeline``):

* ``pg-kill``: SIGKILL of the postmaster, PostgreSQL down 0.5 to 6 s, then started again
  (it recovers from its WAL);
* ``pg-pause``: SIGSTOP of PostgreSQL's processes for 0.5 s to twice the databases'
  ``timeout`` (3 s), then SIGCONT;
* ``broker-kill``, ``broker-pause`` of one of the three brokers, ``container-kill`` as
  above; ``partition``: a process's link cut for 2 to 6 s (the brokers and the database all
  out of reach).

After each it waits until the second stage recorded more rows (and, after a container's
fault, until that container ran the first stage again), reading the ledger in the database.
The table counts each stage's rows against what it owes: the first one row per business id
whose send a broker confirmed (one whose receipt did not come may have one, ``extra``), the
second one per id the first ran; nothing may be left in the outbox, the queues or their
DLQs on any broker. The exit status is 1 otherwise, and the offending ids are printed, with
the inbox's rows per listener, subscription and kind of key. ``--delay S`` keeps each run of
the first stage S seconds in its transaction: more work in flight when a fault comes.
"""

from __future__ import annotations

import json
import random
import re
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Protocol

from tests.faults.tools.command_line import not_installed, parser_for
from tests.faults.tools.node_loss import cluster_settings, with_cluster
from tests.faults.tools.node_loss import left_behind as left_on_cluster
from tests.faults.tools.stomp_capture import Capture
from tests.faults.tools.takeover import take_over
from tests.harness.apps.in_process import unique
from tests.harness.processes.container_process import ContainerProcess
from tests.harness.processes.exactly_once_stages import APP, TIMEOUT, Stages, check_once
from tests.harness.processes.fleet import SEND_TO, WAIT, Fleet, fault_settings, fleet, left_behind
from tests.harness.servers.activemq import ActiveMQ, activemq_available
from tests.harness.servers.activemq_pair import SharedStorePair
from tests.harness.servers.mariadb import MariaDB, mariadb_available
from tests.harness.servers.netns import Namespace, Network, network_available, private_network
from tests.harness.servers.postgresql import PostgreSQL, postgresql_available
from tests.harness.servers.process import BrokerProcess, started_together
from tests.harness.servers.rabbitmq import RabbitMQ, rabbitmq_available
from tests.harness.servers.rabbitmq_cluster import RabbitMQCluster
from tests.harness.traffic.foreign import ForeignLoad
from tests.harness.traffic.ledger import PER_APP, PER_SERVER, Verdict
from tests.harness.traffic.load_producer import LoadProducer

KINDS = ("broker-kill", "broker-pause", "container-kill", "master-kill", "node-kill",
         "partition")
RABBITMQ_KINDS = ("node-kill", "node-pause", "container-kill", "partition")
# The database's two faults (``--database``) come first in an exactly-once run's kinds.
DATABASE_KINDS = {"postgresql": ("pg-kill", "pg-pause"),
                  "mariadb": ("mariadb-kill", "mariadb-pause")}
# Each database an exactly-once run may keep its stages' tables in: its private server, what it
# is called, and whether it can run here.
DATABASE_SERVERS: dict[str, tuple[type[PostgreSQL | MariaDB], str, Callable[[], bool]]] = {
    "postgresql": (PostgreSQL, "PostgreSQL", postgresql_available),
    "mariadb": (MariaDB, "MariaDB", mariadb_available)}
EXACTLY_ONCE_KINDS = ("broker-kill", "broker-pause", "container-kill", "partition")
TOPOLOGIES = ("cluster", "node")  # of --rabbitmq: three nodes, quorum queues; one, classic
RABBITMQ_HEARTBEAT_MS = 4000  # what RabbitMQ makes of a smaller one (docs/rabbitmq.md)
KNOWN_LOSS = 3  # the exit status of a run whose only finding is RabbitMQ's known loss
IN_FLIGHT = 0.5  # seconds around a kill -9 within which a handler's start means "in flight"
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

    def names(self) -> dict[str, str]:
        """Each namespace's address → ``app/server`` of the process in it."""
        return {room.address: f"{app}/{server}" for (app, server), room in self._rooms.items()}

    def start(self, processes: Fleet, app: str, servers: Sequence[str], distribution: str,
              env: dict[str, str] | None = None) -> None:
        for server in servers:
            room = self.of(app, server)
            processes.start(app, [server], distribution, env=env,
                            prefix=room.prefix if room else ())


def consumed_again(processes: Fleet, producer: LoadProducer, app: str, broker: str,
                   count: int = 3) -> None:
    """Wait until ``app`` processed ``count`` messages sent to ``broker`` from now on."""
    before = set(producer.told)

    def again(f: Fleet) -> bool:
        new = {i for i, b in producer.told.items() if b == broker and i not in before}
        return len(new & f.processed(app)) >= count

    processes.wait(again, f"{app} consuming {broker}'s member again")


class Sender(Protocol):
    """What a fault run's producer remembers: each send a broker confirmed (id → the
    broker's name) and each that raised (id → why)."""

    @property
    def told(self) -> dict[str, str]: ...

    @property
    def raised(self) -> dict[str, str]: ...


class Holder(Protocol):
    """What lets a fault's time pass: a ``Fleet`` (which reads its ledger meanwhile) or a
    ``Pipeline`` of exactly-once stages."""

    def hold(self, seconds: float) -> None: ...


def schedule(rng: random.Random, minutes: float, kinds: Sequence[str], processes: Holder,
             producer: Sender, fault: Callable[[str], None],
             undo: Callable[[], None]) -> tuple[Counter[str], list[str]]:
    """For ``minutes``, a gap of load then a fault of a kind drawn from ``kinds`` (``fault``
    applies it and waits until it is survived), one at a time; the first fault not survived
    (an AssertionError) ends the schedule, after ``undo`` (resume what is paused). Returns
    the faults survived by kind and the one not survived, if any."""
    survived: Counter[str] = Counter()
    end = time.monotonic() + minutes * 60
    while time.monotonic() < end:
        processes.hold(rng.uniform(1.0, 6.0))
        kind = rng.choice(kinds)
        # The monotonic clock of the ledger's ``started``: to place a finding among faults.
        print(f"[{time.strftime('%H:%M:%S')}] {kind} at {time.monotonic():.1f}", flush=True)
        try:
            fault(kind)
        except AssertionError as exc:
            undo()
            return survived, [f"{kind}: {exc}"[:500]]
        survived[kind] += 1
        print(f"[{time.strftime('%H:%M:%S')}] survived {kind} at {time.monotonic():.1f} "
              f"(told {len(producer.told)}, raised {len(producer.raised)})", flush=True)
    return survived, []


def resuming(paused: Sequence[BrokerProcess]) -> Callable[[], None]:
    """A schedule's ``undo`` where its faults pause ``paused``: SIGCONT each of them."""
    def undo() -> None:
        for process in paused:
            process.resume()
    return undo


def wind_down(processes: Fleet, told: Collection[str], drain: float,
              failures: list[str]) -> dict[str, Verdict]:
    """Wait until everything told-sent is processed (after ``drain`` seconds, a failure),
    stop the processes in order, and give the verdicts."""
    if not processes.drain(told, timeout=drain):
        failures.append(f"drain: not everything processed within {drain} s")
    processes.stop()
    return processes.verdicts(told)


def run(minutes: float, seed: int, drain: float, cluster: bool) -> int:
    rng = random.Random(seed)
    topic, shop, audit = unique("soak"), unique("shop"), unique("audit")
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

                def fault(kind: str) -> None:
                    if kind == "master-kill":
                        kill_master(rng, pair, processes, producer, shop)
                    elif kind == "node-kill":
                        assert rabbit is not None
                        kill_cluster_node(rng, rabbit, processes, producer, shop, CLUSTER)
                    elif kind in ("container-kill", "partition"):
                        disturb_container(kind, rng, processes, rooms)
                    else:
                        apply(kind, rng, brokers, processes, producer, shop)

                survived, failures = schedule(rng, minutes, kinds, processes, producer,
                                              fault, resuming(brokers))
            told = producer.told
            verdicts = wind_down(processes, told, drain, failures)
            stored = left_behind([*brokers, pair.master()], processes, told)
            if rabbit is not None:
                stored |= left_on_cluster(rabbit.nodes, [topic], told)
    return print_table(survived, verdicts, len(told), producer.raised, stored, failures, KINDS)


def run_rabbitmq(topology: str, minutes: float, seed: int, drain: float,
                 capture: Path | None = None) -> int:
    """The RabbitMQ-only run (``--rabbitmq``): ``topology`` ``cluster`` or ``node``, a
    two-stage pipeline, faults of ``RABBITMQ_KINDS``; prints the table, returns the exit
    status. With ``capture``, a directory: every STOMP packet to and from the nodes is
    recorded there, with the nodes' logs and each process's (``capture_wire``)."""
    rng = random.Random(seed)
    topic, queue, shop = unique("soak"), unique("sent"), unique("shop")
    with ExitStack() as stack:
        network = stack.enter_context(private_network()) if network_available() else None
        kinds = tuple(k for k in RABBITMQ_KINDS if k != "partition" or network)
        rooms = Rooms(network)
        host = network.address if network else None
        cluster: RabbitMQCluster | None = None
        if topology == "cluster":
            cluster = stack.enter_context(RabbitMQCluster(host=host))
            nodes, settings = cluster.nodes, cluster_settings(cluster, topic)
        else:
            nodes = [stack.enter_context(RabbitMQ(host=host))]
            settings = fault_settings([nodes[0].url], topic)
        settings = settings.model_copy(update={"brokers": {
            name: broker.model_copy(update={"heartbeat_ms": RABBITMQ_HEARTBEAT_MS})
            for name, broker in settings.brokers.items()}})
        with fleet(settings, topic) as processes:
            if capture is not None:
                capture_wire(stack, capture, nodes, network, rooms, processes)
            rooms.start(processes, shop, ["s1", "s2"], PER_APP, env={SEND_TO: queue})
            kills: list[float] = []  # when each kill -9 of the lone node came
            with LoadProducer(settings, topic, pace=0.01) as producer:

                def fault(kind: str) -> None:
                    if kind == "node-kill" and cluster is not None:
                        kill_cluster_node(rng, cluster, processes, producer, shop, NAMES[0])
                    elif kind in ("container-kill", "partition"):
                        disturb_container(kind, rng, processes, rooms)
                    else:
                        if kind == "node-kill":
                            kills.append(time.monotonic())
                        upset_node(kind, rng, rng.choice(nodes), processes, producer, shop)

                survived, failures = schedule(rng, minutes, kinds, processes, producer,
                                              fault, resuming(nodes))
            told = producer.told
            verdicts = wind_down(processes, told, drain, failures)
            # Whatever is left in the second stage's queues was sent on by the first.
            stored = {**left_on_cluster(nodes, [topic], told),
                      **left_on_cluster(nodes, [queue], None)}
            explain(processes, verdicts)
    status = print_table(survived, verdicts, len(told), producer.raised, stored, failures,
                         RABBITMQ_KINDS)
    if status and known_loss(verdicts, stored, failures, in_flight_at(processes.seen, kills)):
        print("known: RabbitMQ's loss of a message in flight at a kill -9 of a lone node "
              "(docs/failover.md, \"Known limits\"); nothing else was found")
        return KNOWN_LOSS
    return status


def in_flight_at(seen: Sequence[dict[str, object]], kills: Sequence[float]) -> set[str]:
    """The ids of first-stage messages handed to the handler once only, unflagged, within
    ``IN_FLIGHT`` seconds of one of ``kills`` (``time.monotonic()``): delivered by the node
    just before it was killed (it delivers nothing while down)."""
    starts = Counter(str(e["id"]) for e in seen if e.get("event") == "start"
                     and "source" not in e)
    return {str(e["id"]) for e in seen
            if e.get("event") == "start" and "source" not in e and starts[str(e["id"])] == 1
            and e.get("redelivered") is False and isinstance(started := e.get("started"), float)
            and any(abs(started - kill) <= IN_FLIGHT for kill in kills)}


def known_loss(verdicts: dict[str, Verdict], stored: dict[str, list[str]],
               failures: list[str], in_flight: set[str]) -> bool:
    """Whether a run's only finding is the loss docs/failover.md lists among its known limits:
    messages lost (by either stage) that were all ``in_flight`` at a kill -9 of the lone
    node, every repeat flagged under one id, nothing left behind, every fault survived (the
    drain, which waits for the lost ones, aside)."""
    lost = {i for v in verdicts.values() for i in v.lost}
    return (bool(lost) and lost <= in_flight and not stored
            and all(not v.unflagged and not v.renamed for v in verdicts.values())
            and all(f.startswith("drain:") for f in failures))


def capture_wire(stack: ExitStack, directory: Path, nodes: Sequence[RabbitMQ],
                 network: Network | None, rooms: Rooms, processes: Fleet) -> None:
    """Record every STOMP packet to and from ``nodes`` in ``directory`` until ``stack``
    closes (``tests.faults.tools.stomp_capture``), keep each process's log there (at INFO; this
    process's, the producer's, too), and, before the nodes are closed, stop them and keep
    their log files (``node-N/``) and the namespaces' addresses (``rooms.json``)."""
    capture = Capture(directory, [node.port for node in nodes],
                      network.bridge if network else None)
    stack.callback(capture.close)
    processes.log_files = capture.log_path
    capture.log_here()

    def keep() -> None:
        (directory / "rooms.json").write_text(json.dumps(rooms.names(), indent=1) + "\n")
        for number, node in enumerate(nodes):
            node.stop()  # its last lines written; ``close`` later finds it stopped
            capture.keep(f"node-{number}", [node.console_path,
                                             *sorted(node.log_dir.glob("*"))])
    stack.callback(keep)


class Pipeline:
    """The exactly-once run's two container processes (``s1``, ``s2``), each running both
    stages, each in its own network namespace where there are any."""

    def __init__(self, stages: Stages, rooms: Rooms, delay: float = 0.0) -> None:
        self.stages, self.rooms = stages, rooms
        self.env = {"EO_DELAY": str(delay)} if delay else {}
        self.processes: dict[str, ContainerProcess] = {}
        self.mark = 0  # the ledger's highest row number when the last fault was survived

    def start(self, server: str) -> None:
        room = self.rooms.of(APP, server)
        self.processes[server] = self.stages.start(server, room.prefix if room else (),
                                                   **self.env)

    def hold(self, seconds: float) -> None:
        time.sleep(seconds)  # the processes' ledger is the database, read when asked

    def resumed(self, server: str | None = None, count: int = 3) -> None:
        """Wait until the second stage recorded ``count`` more rows and, with ``server``, that
        server ``count`` more of the first stage: consumption resumed, the outbox's dispatch
        too. Rows are counted from the ledger's highest number when it could first be read
        after the fault (not from messages sent after it: those may wait behind a backlog the
        fault left); a run in flight through the fault may commit a row numbered before, and
        is not counted."""
        mark: int | None = None

        def again() -> bool:
            nonlocal mark
            if exited := {s: p.process.poll() for s, p in self.processes.items()
                          if p.process.poll() is not None}:
                tails = "\n".join(f"{s}: {line}" for s in exited
                                  for line in self.processes[s].tail)
                raise AssertionError(f"container processes exited: {exited}; their last "
                                     f"lines:\n{tails}")
            top, rows = self.stages.since(self.mark if mark is None else mark)
            if mark is None:
                mark = top
                return False
            second = sum(stage == "second" for stage, _, _ in rows)
            ran = sum(stage == "first" and by == server for stage, _, by in rows)
            if second >= count and (server is None or ran >= count):
                self.mark = top
                return True
            return False
        self.stages.poll(again, "consumption again" + (f" by {server}" if server else ""))

    def stop(self, failures: list[str]) -> dict[str, str]:
        """SIGTERM each process; one that does not exit 0 is a failure. Their ``mdb:
        stopped`` lines (the counters of what they did) per server."""
        for process in self.processes.values():
            process.process.send_signal(signal.SIGTERM)
        codes = {s: p.process.wait(timeout=WAIT) for s, p in self.processes.items()}
        if any(codes.values()):
            failures.append(f"exit statuses {codes}")
        lines = {}
        for server, process in self.processes.items():
            while not process.lines.empty():
                entry = process.lines.get_nowait()
                if entry.get("event") == "stopped":
                    lines[server] = entry["line"].strip()
        return lines


def exactly_once_missing(database: str) -> str | None:
    """What an exactly-once run on ``database`` needs and cannot start here (ActiveMQ Classic,
    or the database's server), or None."""
    if not activemq_available():
        return "ActiveMQ Classic"
    _, name, available = DATABASE_SERVERS[database]
    return None if available() else name


def run_exactly_once(minutes: float, seed: int, drain: float, delay: float = 0.0,
                     database: str = "postgresql") -> int:
    """The exactly-once run (``--exactly-once``): three ActiveMQ brokers, a private
    ``database`` server (PostgreSQL or MariaDB), two container processes of both stages of
    ``tests.harness.apps.exactly_once_app`` partitioned over the brokers, a foreign producer
    sending to the first stage's members, faults of ``DATABASE_KINDS[database]`` and
    ``EXACTLY_ONCE_KINDS``; each run of the first stage holds its transaction open ``delay``
    seconds (more work in flight at a fault). Prints the table, returns the exit status."""
    rng = random.Random(seed)
    all_kinds = DATABASE_KINDS[database] + EXACTLY_ONCE_KINDS
    with ExitStack() as stack:
        network = stack.enter_context(private_network()) if network_available() else None
        kinds = tuple(k for k in all_kinds if k != "partition" or network)
        host = network.address if network else None
        brokers = stack.enter_context(started_together(lambda: ActiveMQ(host=host), 3))
        db = DATABASE_SERVERS[database][0](host=host or "127.0.0.1")
        stack.enter_context(db)
        pipeline = Pipeline(Stages(brokers, db, stack), Rooms(network), delay)
        pipeline.start("s1")
        pipeline.start("s2")
        with ForeignLoad(pipeline.stages.members(), pace=0.02) as producer:

            def fault(kind: str) -> None:
                upset_pipeline(kind, rng, brokers, db, pipeline)

            def undo() -> None:
                db.resume()
                if not db.running:
                    db.start()
                for broker in brokers:
                    broker.resume()
                    if not broker.running:
                        broker.start()
            survived, failures = schedule(rng, minutes, kinds, pipeline, producer, fault,
                                          undo)
        told, raised = producer.told, producer.raised
        try:
            pipeline.stages.drain(told, drain)
        except AssertionError as exc:
            failures.append(f"drain: {exc}")
        stopped = pipeline.stop(failures)
        rows, outbox = pipeline.stages.ledger()
        left = pipeline.stages.left()
        inbox = pipeline.stages.inbox()
    accounts, bad = check_once(rows, told, raised)
    print_faults(survived, all_kinds, len(told), raised)
    for server, line in sorted(stopped.items()):
        print(f"{server} {line}")
    print_rows([("stage", "owed", "once", "missing", "repeated", "extra")] + [
        (stage, str(a.owed), str(a.once), str(len(a.missing)), str(len(a.repeated)),
         str(len(a.extra))) for stage, a in accounts.items()])
    print(f"left in the outbox: {len(outbox)} {sorted(outbox)[:10]}")
    print(f"left in the queues: {sum(len(v) for v in left.values())} {left or ''}")
    for failure in failures:
        print(f"NOT SURVIVED: {failure}")
    if bad:
        print(f"ids breaking the contract ({len(bad)}): {bad[:20]}")
        print(f"inbox rows per (listener, subscription, key): {dict(inbox)}")
    result = bad or outbox or left or failures
    print("result: " + ", ".join(f"{stage} missing {len(a.missing)} repeated "
                                 f"{len(a.repeated)}" for stage, a in accounts.items())
          + " -> " + ("FAIL" if result else "ok"))
    return 1 if result else 0


def upset_pipeline(kind: str, rng: random.Random, brokers: Sequence[BrokerProcess],
                   database: PostgreSQL | MariaDB, pipeline: Pipeline) -> None:
    """One fault of the exactly-once run, then wait until consumption resumed:

    * ``pg-kill``: SIGKILL of the postmaster (its children follow), down 0.5 to 6 s, started
      again (it recovers from its WAL); ``mariadb-kill``: SIGKILL of mariadbd, likewise
      (InnoDB recovers from its redo log);
    * ``pg-pause``, ``mariadb-pause``: SIGSTOP of every server process for 0.5 s to twice
      the databases' ``timeout`` (a hung server: past the timeout or not), then SIGCONT;
    * ``broker-kill``, ``broker-pause``: an ``outage`` of one of ``brokers``, 0.5 to 6 s;
    * ``container-kill``: SIGKILL one process, start it again 0 to 3 s later under its name;
    * ``partition``: one process's link cut for 2 to 6 s (around the broker's tolerance of
      silence, 2.5 s, and the database's ``timeout``), then healed; that process must run
      the first stage again.
    """
    server = None
    if kind in ("pg-kill", "mariadb-kill"):
        database.crash()
        pipeline.hold(rng.uniform(0.5, 6.0))
        database.start()
    elif kind in ("pg-pause", "mariadb-pause"):
        database.pause()
        pipeline.hold(rng.uniform(0.5, 2 * TIMEOUT))
        database.resume()
    elif kind in ("broker-kill", "broker-pause"):
        outage(kind == "broker-kill", rng.choice(brokers), rng.uniform(0.5, 6.0), pipeline)
    elif kind == "container-kill":
        server = rng.choice(sorted(pipeline.processes))
        victim = pipeline.processes[server].process
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=WAIT)
        pipeline.hold(rng.uniform(0.0, 3.0))
        pipeline.start(server)
    else:
        server = rng.choice(sorted(pipeline.processes))
        room = pipeline.rooms.of(APP, server)
        assert room is not None  # partitions are drawn only where there are namespaces
        room.cut()
        try:
            pipeline.hold(rng.uniform(2.0, 6.0))
        finally:
            room.heal()
    pipeline.resumed(server)


def explain(processes: Fleet, verdicts: dict[str, Verdict], most: int = 5) -> None:
    """Print the ledger lines of (up to ``most``) ids lost, unflagged or renamed, at both
    stages, each with its place in the ledger and the events of the processes (connections
    lost, processes ready) within 40 lines before it: what a finding's report needs."""
    bad = sorted({i for v in verdicts.values() for i in [*v.lost, *v.unflagged, *v.renamed]})
    for message_id in bad[:most]:
        print(f"-- {message_id}")
        for place, entry in enumerate(processes.seen):
            if message_id in (entry.get("id"), entry.get("source")):
                events = [e for e in processes.seen[max(0, place - 40):place]
                          if e.get("event") not in ("start", "done")]
                print(f"  #{place} {entry}" + (f"\n    after {events}" if events else ""))


def upset_node(kind: str, rng: random.Random, node: BrokerProcess, processes: Fleet,
               producer: LoadProducer, app: str) -> None:
    """``node-kill`` (a lone node: it cannot be consumed while down) or ``node-pause`` of
    ``node`` for 0.5 to 6 s, then wait until ``app`` consumes again."""
    outage(kind == "node-kill", node, rng.uniform(0.5, 6.0), processes)
    consumed_again(processes, producer, app, NAMES[0])


def outage(kill: bool, broker: BrokerProcess, seconds: float, processes: Holder) -> None:
    """Kill -9 ``broker`` and restart it after ``seconds`` (same ports, same data directory),
    or pause it (SIGSTOP) that long and resume it; the ledger is read meanwhile."""
    if kill:
        broker.kill()
        processes.hold(seconds)
        broker.restart()
    else:
        broker.pause()
        processes.hold(seconds)
        broker.resume()


def disturb_container(kind: str, rng: random.Random, processes: Fleet, rooms: Rooms) -> None:
    """``container-kill`` (SIGKILL a process, start it again under its server name) or
    ``partition`` (cut its link for 2 to 3 heart-beat intervals, heal it, wait until it
    consumes again) of a process drawn from the live ones."""
    victim = rng.choice(processes.alive())
    app = processes.app_of[victim.process.pid]
    if kind == "container-kill":
        processes.kill(victim)
        processes.hold(rng.uniform(0.0, 3.0))
        rooms.start(processes, app, [victim.server], processes.distribution[app],
                    dict(processes.env[app]))
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


def apply(kind: str, rng: random.Random, brokers: Sequence[BrokerProcess], processes: Fleet,
          producer: LoadProducer, shop: str) -> None:
    """``broker-kill`` or ``broker-pause`` of one of the ActiveMQ ``brokers``."""
    index = rng.randrange(len(brokers))
    outage(kind == "broker-kill", brokers[index], rng.uniform(0.5, 6.0), processes)
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
                      producer: LoadProducer, shop: str, broker: str) -> None:
    """``node-kill``: SIGKILL a node of the cluster (the one the processes are connected to,
    or another), wait until ``shop`` consumes the cluster's member (of broker ``broker``)
    again while it is down, then restart it and wait until it is back in the cluster."""
    node = rng.choice(cluster.nodes)
    node.kill()
    processes.hold(rng.uniform(0.0, 3.0))
    consumed_again(processes, producer, shop, broker)
    node.restart()  # it rejoins: its data remembers the cluster
    cluster.wait_members(len(cluster.nodes))


def print_table(survived: Counter[str], verdicts: dict[str, Verdict], told: int,
                raised: dict[str, str], stored: dict[str, list[str]], failures: list[str],
                kinds: Sequence[str]) -> int:
    """Print the run's table and verdict; return the exit status (1: a fault not survived, a
    message lost, a repeat unflagged or under another id, or something left behind)."""
    print_faults(survived, kinds, told, raised)
    header = ("view", "told", "processed", "deliveries", "dup flagged", "dup unflagged",
              "lost", "unconfirmed", "renamed")
    rows = [header] + [
        (re.sub(r"_[0-9a-f]{10}", "", key),  # unique()'s suffix
         str(v.told), str(v.processed), str(v.deliveries), str(v.flagged),
         str(len(v.unflagged)), str(len(v.lost)), str(v.unconfirmed), str(len(v.renamed)))
        for key, v in sorted(verdicts.items())]
    print_rows(rows)
    print(f"left behind on the brokers: {sum(len(v) for v in stored.values())} {stored or ''}")
    for failure in failures:
        print(f"NOT SURVIVED: {failure}")
    for key, verdict in sorted(verdicts.items()):
        if not verdict.ok:
            print(f"{key}: {verdict}")
    lost = sum(len(v.lost) for v in verdicts.values())
    unflagged = sum(len(v.unflagged) for v in verdicts.values())
    bad = not all(v.ok for v in verdicts.values()) or bool(stored or failures)
    print(f"result: lost {lost}, unflagged {unflagged} -> " + ("FAIL" if bad else "ok"))
    return 1 if bad else 0


def print_faults(survived: Counter[str], kinds: Sequence[str], told: int,
                 raised: dict[str, str]) -> None:
    """The head of a run's table: the faults survived, the messages sent."""
    print()
    print("faults survived: " + ", ".join(f"{k} {survived[k]}" for k in kinds)
          + f" (total {sum(survived.values())})")
    print(f"messages told-sent: {told}; sends that raised: {len(raised)} "
          f"{dict(Counter(raised.values()))}")


def print_rows(rows: Sequence[Sequence[str]]) -> None:
    """Columns aligned: the first to the left, the others (numbers) to the right."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.rjust(w) if i else c.ljust(w)
                        for i, (c, w) in enumerate(zip(row, widths, strict=True))))


def main(argv: Sequence[str] | None = None) -> int:
    parser = parser_for("random_faults", __doc__)
    parser.add_argument("--minutes", type=float, default=10.0, help="how long faults go on")
    parser.add_argument("--seed", type=int, default=7, help="seed of the fault schedule")
    parser.add_argument("--drain", type=float, default=120.0,
                        help="seconds to wait at the end for everything to be processed")
    parser.add_argument("--no-cluster", action="store_true",
                        help="leave the RabbitMQ cluster (and its node-kill faults) out")
    parser.add_argument("--rabbitmq", choices=TOPOLOGIES,
                        help="RabbitMQ only, a two-stage pipeline: a three-node cluster with "
                             "quorum queues, or one node with classic queues")
    parser.add_argument("--exactly-once", action="store_true",
                        help="three ActiveMQ brokers and PostgreSQL, two exactly-once stages "
                             "partitioned over the brokers, a foreign (plain stomp.py) "
                             "producer, database faults among the others")
    parser.add_argument("--database", choices=tuple(DATABASE_KINDS), default="postgresql",
                        help="with --exactly-once: the database server the stages keep their "
                             "inbox, outbox and ledger in, and whose faults are drawn")
    parser.add_argument("--delay", type=float, default=0.0,
                        help="with --exactly-once: seconds each run of the first stage holds "
                             "its transaction open (more work in flight at a fault)")
    parser.add_argument("--capture", type=Path, metavar="DIR",
                        help="with --rabbitmq: record every STOMP packet to and from the "
                             "nodes in DIR (tcpdump, root), with the nodes' and processes' "
                             "logs; read it with python -m tests.faults.tools.stomp_capture")
    args = parser.parse_args(argv)
    if args.capture is not None and not args.rabbitmq:
        parser.error("--capture goes with --rabbitmq")
    if args.exactly_once:
        if exactly_once_missing(args.database):
            name = DATABASE_SERVERS[args.database][1]
            print(f"ActiveMQ Classic and {name} are needed", file=sys.stderr)
            return 2
        return run_exactly_once(args.minutes, args.seed, args.drain, args.delay, args.database)
    if args.rabbitmq:
        if not rabbitmq_available():
            return not_installed("RabbitMQ with the STOMP plugin")
        return run_rabbitmq(args.rabbitmq, args.minutes, args.seed, args.drain, args.capture)
    if not activemq_available():
        return not_installed("ActiveMQ Classic")
    return run(args.minutes, args.seed, args.drain,
               cluster=not args.no_cluster and rabbitmq_available())


if __name__ == "__main__":
    sys.exit(main())
