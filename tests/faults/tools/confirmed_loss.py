"""Does RabbitMQ itself lose a confirmed, delivered, unacked message at a kill -9 that comes
seconds after a recovery from another kill -9? (docs/failover.md, "Open finding"). Raw STOMP
1.2, no mdb: a measurement, not a CI test.

One node, one durable classic queue declared long before (a clean restart after its
declaration: a queue declared just before a kill is a separate known loss); with ``--topic``
the producer sends to a topic and the consumers take its durable subscription queue, as the
fault run's first stage does. Each round starts as the node came back from the previous
round's kill -9 (the first from a kill made for it):

* a producer sends persistent messages with unique ids at about ``--rate`` a second, each with
  a receipt (RabbitMQ's publisher confirm): the ids whose receipt came are *confirmed*;
* ``--consumers`` consumers, each on its own connection (``ack:client-individual``,
  ``prefetch-count`` 10), record each delivery and ack it, with a receipt, after holding it up
  to 80 ms; one in 50 they hold unacked until the kill. With ``--forward`` a consumer first
  sends the message on to a second durable classic queue (persistent, with a receipt) and acks
  it only once that receipt came, as mdb's first stage settles on RabbitMQ; each consumer's
  connection also takes the second queue, acking each delivery at once (the second stage);
* with ``--pauses N``, 0 to N times a round (drawn), after 0.5 to 2 s of traffic the node is
  stopped (SIGSTOP) for 0.5 to 6 s and continued (SIGCONT); connections have no heart-beats,
  so they live through a pause, unless ``--heartbeat MS`` asks for them (mdb's default is
  4000): then the producer and consumers whose heart-beats stop close their connections
  during a pause, handing back their deliveries, and are not replaced until the next round;
* 2 to 6 s after the node answered (drawn from ``--seed``), or 0.5 to 2 s after the last
  pause if that is later, the node is killed -9, restarted, and the queues drained by a fresh
  consumer that acks everything (with ``--keep-backlog`` not: the next round's consumers take
  what the node recovered, as the fault run's do, and the queues are drained once, after the
  last round, the count made over all rounds). With ``--close-before-kill`` the first
  consumer's connection is closed by the client (a DISCONNECT, not waited for: deliveries
  handed back) 0 to 50 ms before the kill;
* ``--load N`` runs N busy processes (a CPU each) beside it for the whole run.

A confirmed message is **lost** when it is not in the drain and no consumer sent an ACK for
it: ``lost held`` if it was delivered before a kill (the open finding's case), ``lost
queued`` if it never was; ``lost fwd`` counts messages sent on whose SEND was confirmed, not
acked by a second-stage consumer and not in the second queue's drain. A delivered message
whose ACK was sent but not answered (``ack unanswered``) may have been acked before the kill:
gone is not lost there. On a loss the node's log directory is copied to a temporary directory
(printed) with the lost ids and their timings.
"""

from __future__ import annotations

import dataclasses
import queue
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import stomp

from tests.faults.tools.command_line import not_installed, parser_for
from tests.harness.servers.rabbitmq import RabbitMQ, rabbitmq_available

WAIT = 60.0  # bound on a drain or a connect after a restart: a hang guard
PREFETCH = 10
HOLD = 0.08  # the longest a consumer holds a message before its ACK
HOLD_UNTIL_KILL = 50  # one delivery in this many is held unacked until the kill,
HELD_AT_MOST = PREFETCH // 2  # up to this many, so that the prefetch window stays open
STAGE1, STAGE2 = "stage1", "stage2"  # a consumer's subscription ids


@dataclasses.dataclass(frozen=True)
class Route:
    """Where the producer sends and how a consumer subscribes: a queue, or a topic (the
    ``amq.topic`` exchange) with a durable subscription queue named as mdb names it
    (docs/rabbitmq.md#how-destinations-map)."""

    send_to: str
    subscribe_to: str
    subscribe_headers: dict[str, str]

    @classmethod
    def make(cls, topic: bool) -> Route:
        name = f"mdbtest-loss-{uuid.uuid4().hex[:12]}"
        if not topic:
            return cls(f"/queue/{name}", f"/queue/{name}", {})
        return cls(f"/topic/{name}", f"/topic/{name}", {
            "durable": "true", "auto-delete": "false", "x-queue-name": f"Consumer.loss.{name}"})


@dataclasses.dataclass(frozen=True)
class Options:
    """What a round does besides the kill (the command line's options)."""

    rate: float
    consumers: int
    forward: Route | None  # the second queue, with --forward
    pauses: int
    close_before_kill: bool
    keep_backlog: bool
    heartbeat_ms: int


def _connect(node: RabbitMQ, listener: stomp.ConnectionListener,
             heartbeat_ms: int = 0) -> stomp.Connection12:
    connection = stomp.Connection12([(node.host, node.port)], vhost="/",
                                    reconnect_attempts_max=1,
                                    heartbeats=(heartbeat_ms, heartbeat_ms))
    connection.set_listener("measure", listener)
    connection.connect(node.username, node.password, wait=True)
    return connection


class _Producer(stomp.ConnectionListener):  # type: ignore[misc]
    """Sends ``ROUND-N`` ids at a steady rate from its own thread until stopped or cut off."""

    def __init__(self, node: RabbitMQ, route: Route, round_id: str, rate: float,
                 heartbeat_ms: int) -> None:
        self.sent: set[str] = set()
        self.confirmed: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.connection = _connect(node, self, heartbeat_ms)
        self._thread = threading.Thread(target=self._run, args=(route.send_to, round_id, rate),
                                        daemon=True)
        self._thread.start()

    def _run(self, destination: str, round_id: str, rate: float) -> None:
        start, number = time.monotonic(), 0
        while not self._stop.is_set():
            message_id = f"{round_id}-{number}"
            with self._lock:
                self.sent.add(message_id)
            try:
                self.connection.send(destination, message_id, headers={
                    "persistent": "true", "mid": message_id, "receipt": message_id})
            except (stomp.exception.StompException, OSError):  # the kill
                return
            number += 1
            self._stop.wait(max(0.0, start + number / rate - time.monotonic()))

    def on_receipt(self, frame: Any) -> None:
        with self._lock:
            self.confirmed.add(frame.headers["receipt-id"])

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


class _Consumer(stomp.ConnectionListener):  # type: ignore[misc]
    """Acks each first-stage delivery after a short hold (its own thread), with ``forward``
    once it sent the message on there and had the receipt; one in ``HOLD_UNTIL_KILL`` (at most
    ``HELD_AT_MOST``) never. Acks each second-stage delivery at once."""

    def __init__(self, node: RabbitMQ, route: Route, forward: Route | None,
                 rng: random.Random, heartbeat_ms: int) -> None:
        self.delivered: dict[str, float] = {}  # first stage: id -> when (monotonic)
        self.ack_sent: set[str] = set()
        self.ack_confirmed: set[str] = set()
        self.held: set[str] = set()
        self.forward_sent: set[str] = set()
        self.forward_confirmed: set[str] = set()
        self.stage2_ack_sent: set[str] = set()
        self._forward = forward
        self._rng = rng
        self._lock = threading.Condition()
        self._stopped = threading.Event()
        self._due: queue.Queue[tuple[float, str, str, str] | None] = queue.Queue()
        self.connection = _connect(node, self, heartbeat_ms)
        self._thread = threading.Thread(target=self._ack, daemon=True)
        self._thread.start()
        self.connection.subscribe(route.subscribe_to, id=STAGE1, ack="client-individual",
                                  headers={**route.subscribe_headers,
                                           "prefetch-count": str(PREFETCH)})
        if forward is not None:
            self.connection.subscribe(forward.subscribe_to, id=STAGE2,
                                      ack="client-individual",
                                      headers={"prefetch-count": str(PREFETCH)})

    def on_message(self, frame: Any) -> None:
        message_id, ack_id = frame.headers["mid"], frame.headers["ack"]
        if frame.headers["subscription"] == STAGE2:
            self._due.put((0.0, STAGE2, message_id, ack_id))
            return
        with self._lock:
            self.delivered[message_id] = time.monotonic()
            if len(self.held) < HELD_AT_MOST and self._rng.randrange(HOLD_UNTIL_KILL) == 0:
                self.held.add(message_id)
                return
            hold = self._rng.uniform(0, HOLD)
        self._due.put((time.monotonic() + hold, STAGE1, message_id, ack_id))

    def _ack(self) -> None:
        while (due := self._due.get()) is not None:
            at, stage, message_id, ack_id = due
            time.sleep(max(0.0, at - time.monotonic()))
            try:
                if stage == STAGE2:
                    with self._lock:
                        self.stage2_ack_sent.add(message_id)
                    self.connection.ack(ack_id)
                    continue
                if self._forward is not None and not self._send_on(message_id):
                    return
                with self._lock:
                    self.ack_sent.add(message_id)
                self.connection.ack(ack_id, receipt=f"ack-{message_id}")
            except (stomp.exception.StompException, OSError):  # the kill
                return

    def _send_on(self, message_id: str) -> bool:
        """Send ``message_id`` on to the second queue and wait for the receipt; False when
        stopped first."""
        assert self._forward is not None
        with self._lock:
            self.forward_sent.add(message_id)
        self.connection.send(self._forward.send_to, message_id, headers={
            "persistent": "true", "mid": message_id, "receipt": f"fwd-{message_id}"})
        with self._lock:
            while message_id not in self.forward_confirmed:
                if self._stopped.is_set():
                    return False
                self._lock.wait(0.05)
        return True

    def on_receipt(self, frame: Any) -> None:
        receipt = frame.headers["receipt-id"]
        with self._lock:
            if receipt.startswith("fwd-"):
                self.forward_confirmed.add(receipt.removeprefix("fwd-"))
                self._lock.notify_all()
            else:
                self.ack_confirmed.add(receipt.removeprefix("ack-"))

    def stop(self) -> None:
        self._stopped.set()
        self._due.put(None)
        self._thread.join()


class _Drainer(stomp.ConnectionListener):  # type: ignore[misc]
    """Takes a queue up to ``marker``, acking (ack:client, cumulative) every ``ACK_EVERY``
    deliveries so that a backlog longer than its prefetch window still flows."""

    ACK_EVERY: ClassVar[int] = 200

    def __init__(self, marker: str) -> None:
        self.connection: stomp.Connection12 | None = None
        self.ids: list[str] = []
        self.last_ack = ""
        self.marker = marker
        self.done = threading.Event()
        self.receipts: set[str] = set()
        self.receipt = threading.Condition()

    def on_message(self, frame: Any) -> None:
        self.ids.append(frame.headers.get("mid", ""))
        self.last_ack = frame.headers["ack"]
        if self.ids[-1] == self.marker:
            self.done.set()
        elif len(self.ids) % self.ACK_EVERY == 0 and self.connection is not None:
            self.connection.ack(self.last_ack)

    def on_receipt(self, frame: Any) -> None:
        with self.receipt:
            self.receipts.add(frame.headers["receipt-id"])
            self.receipt.notify_all()

    def wait_receipt(self, receipt: str) -> None:
        with self.receipt:
            if not self.receipt.wait_for(lambda: receipt in self.receipts, WAIT):
                raise RuntimeError(f"no receipt {receipt} within {WAIT}s")


def drain(node: RabbitMQ, route: Route) -> list[str]:
    """Every message ``route``'s queue holds, taken and acked: a marker sent with a receipt and
    taken back says where its content ends (a count asked of the node is not trusted right
    after a restart, nor is an empty receive). The subscription comes first: a topic keeps
    nothing for a subscription queue not made yet."""
    marker = f"marker-{uuid.uuid4().hex}"
    drainer = _Drainer(marker)
    connection = drainer.connection = _connect(node, drainer)
    try:
        connection.subscribe(route.subscribe_to, id="drain", ack="client", headers={
            **route.subscribe_headers, "prefetch-count": "1000", "receipt": "subscribed"})
        drainer.wait_receipt("subscribed")
        connection.send(route.send_to, marker,
                        headers={"persistent": "true", "mid": marker, "receipt": marker})
        if not drainer.done.wait(WAIT):
            raise RuntimeError(f"the drain's marker did not come back within {WAIT}s")
        # ack:client acks the marker and everything delivered before it.
        connection.ack(drainer.last_ack, receipt="drained")
        drainer.wait_receipt("drained")
    finally:
        connection.disconnect()
    return [i for i in drainer.ids if i != marker]


@dataclasses.dataclass
class Round:
    number: int
    kill_after: float  # seconds after the node answered
    pauses: int
    sent: int
    confirmed: int
    delivered: int
    held: int  # delivered, no ACK sent, at the kill
    ack_unanswered: int
    drained: int
    forwarded: int  # sent on, the SEND confirmed
    lost_held: int
    lost_queued: int
    lost_forwarded: int
    gone_ack_unanswered: int
    lost_ids: list[str] = dataclasses.field(default_factory=list)

    HEADER: ClassVar[str] = ("round  kill at  pauses  sent  confirmed  delivered  held"
                             "  ack unanswered  drained  forwarded  lost held  lost queued"
                             "  lost fwd  gone (ack unanswered)")

    def row(self, label: str) -> str:
        return (f"{label:>5}  {self.kill_after:6.2f}s  {self.pauses:6}  {self.sent:4}"
                f"  {self.confirmed:9}  {self.delivered:9}  {self.held:4}"
                f"  {self.ack_unanswered:14}  {self.drained:7}  {self.forwarded:9}"
                f"  {self.lost_held:9}  {self.lost_queued:11}  {self.lost_forwarded:8}"
                f"  {self.gone_ack_unanswered:21}")


def _union(sets: Iterable[Iterable[str]]) -> set[str]:
    return set().union(*sets)


@dataclasses.dataclass
class _Seen:
    """What one round's producer and consumers saw, and when the node was killed."""

    producer: _Producer
    consumers: list[_Consumer]
    killed: float


def _losses(seen: Sequence[_Seen], drained: set[str],
            drained_on: set[str]) -> tuple[list[str], list[str], list[str]]:
    """The confirmed ids nobody acked and no drain found: delivered before (lost held), never
    delivered (lost queued), and the sends on (lost forwarded)."""
    confirmed = _union(s.producer.confirmed for s in seen)
    consumers = [c for s in seen for c in s.consumers]
    delivered = _union(c.delivered for c in consumers)
    unacked = delivered - _union(c.ack_sent for c in consumers)
    forwarded = _union(c.forward_confirmed for c in consumers)
    return (sorted((confirmed & unacked) - drained),
            sorted((confirmed - delivered) - drained),
            sorted(forwarded - _union(c.stage2_ack_sent for c in consumers) - drained_on))


def _pause(node: RabbitMQ, rng: random.Random, count: int) -> None:
    """``count`` times: 0.5 to 2 s of traffic, then the node stopped for 0.5 to 6 s."""
    for _ in range(count):
        time.sleep(rng.uniform(0.5, 2.0))
        node.pause()
        try:
            time.sleep(rng.uniform(0.5, 6.0))
        finally:
            node.resume()


def one_round(node: RabbitMQ, route: Route, options: Options, number: int, ready: float,
              kill_after: float, rng: random.Random) -> tuple[Round, _Seen, float]:
    """A round on the node that answered at ``ready`` (monotonic): load, pauses, the kill -9
    ``kill_after`` seconds after it answered (or later, after the pauses), the restart and
    (unless ``options.keep_backlog``) the drain; the round, what it saw, and when the node
    answered again."""
    round_id = f"r{number}-{uuid.uuid4().hex[:8]}"
    consumers = [_Consumer(node, route, options.forward, random.Random(rng.random()),
                           options.heartbeat_ms) for _ in range(options.consumers)]
    producer = _Producer(node, route, round_id, options.rate, options.heartbeat_ms)
    pauses = rng.randint(0, options.pauses)
    _pause(node, rng, pauses)
    kill_at = max(ready + kill_after, time.monotonic() + (rng.uniform(0.5, 2.0) if pauses else 0))
    close_gap = rng.uniform(0.0, 0.05)
    if options.close_before_kill:
        time.sleep(max(0.0, kill_at - close_gap - time.monotonic()))
        consumers[0].connection.disconnect()  # DISCONNECT sent, its receipt not waited for
    time.sleep(max(0.0, kill_at - time.monotonic()))
    killed = time.monotonic()
    node.kill()
    producer.stop()
    for consumer in consumers:
        consumer.stop()
    # Receipts read before the socket closed are still being handed over: wait for the close.
    for connection in (producer.connection, *(c.connection for c in consumers)):
        deadline = time.monotonic() + WAIT
        while connection.is_connected() and time.monotonic() < deadline:
            time.sleep(0.01)
    node.restart()
    answered = time.monotonic()
    seen = _Seen(producer, consumers, killed)
    drained: set[str] = set()
    drained_on: set[str] = set()
    if not options.keep_backlog:
        drained = set(drain(node, route))
        if options.forward is not None:
            drained_on = set(drain(node, options.forward))
    lost_held, lost_queued, lost_forwarded = (
        _losses([seen], drained, drained_on) if not options.keep_backlog else ([], [], []))
    delivered = _union(c.delivered for c in consumers)
    ack_sent = _union(c.ack_sent for c in consumers)
    ack_unanswered = ack_sent - _union(c.ack_confirmed for c in consumers)
    done = Round(number, killed - ready, pauses, len(producer.sent), len(producer.confirmed),
                 len(delivered), len(delivered - ack_sent), len(ack_unanswered),
                 len(drained & producer.sent),
                 len(_union(c.forward_confirmed for c in consumers)), len(lost_held),
                 len(lost_queued), len(lost_forwarded),
                 0 if options.keep_backlog
                 else len((producer.confirmed & ack_unanswered) - drained),
                 lost_held + lost_queued + [f"fwd:{i}" for i in lost_forwarded])
    if done.lost_ids:
        _keep_evidence(node, done, [seen])
    return done, seen, answered


def settle_backlog(node: RabbitMQ, route: Route, options: Options,
                   seen: Sequence[_Seen]) -> Round:
    """``--keep-backlog``'s count once the last round's node answered: both queues drained,
    and every round's confirmed ids checked against every round's ACKs and the drains."""
    drained = set(drain(node, route))
    drained_on = set(drain(node, options.forward)) if options.forward is not None else set()
    lost_held, lost_queued, lost_forwarded = _losses(seen, drained, drained_on)
    consumers = [c for s in seen for c in s.consumers]
    ack_unanswered = (_union(c.ack_sent for c in consumers)
                      - _union(c.ack_confirmed for c in consumers))
    confirmed = _union(s.producer.confirmed for s in seen)
    done = Round(0, 0.0, 0, 0, 0, 0, 0, 0, len(drained), 0, len(lost_held), len(lost_queued),
                 len(lost_forwarded), len((confirmed & ack_unanswered) - drained),
                 lost_held + lost_queued + [f"fwd:{i}" for i in lost_forwarded])
    if done.lost_ids:
        _keep_evidence(node, done, seen)
    return done


def _keep_evidence(node: RabbitMQ, done: Round, seen: Sequence[_Seen]) -> None:
    """Copy the node's logs aside and print, for each lost id, where it was at each kill."""
    kept = Path(tempfile.mkdtemp(prefix=f"confirmed-loss-r{done.number}-"))
    shutil.copytree(node.log_dir, kept / "log")
    lines = []
    for message_id in done.lost_ids:
        plain = message_id.removeprefix("fwd:")
        for number, one in enumerate(seen):
            for index, consumer in enumerate(one.consumers):
                if plain in consumer.delivered:
                    lines.append(
                        f"{message_id}: seen {number}, consumer {index}, delivered"
                        f" {one.killed - consumer.delivered[plain]:.3f}s before the kill,"
                        f" held {plain in consumer.held},"
                        f" sent on {plain in consumer.forward_sent},"
                        f" send on confirmed {plain in consumer.forward_confirmed},"
                        f" ack sent {plain in consumer.ack_sent}")
    (kept / "lost.txt").write_text("\n".join([done.row(str(done.number)), *lines, ""]))
    print("\n".join(lines) + f"\n  evidence kept in {kept}", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = parser_for("confirmed_loss", __doc__)
    parser.add_argument("--rounds", type=int, default=40, help="node kills")
    parser.add_argument("--rate", type=float, default=100.0, help="messages a second")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--topic", action="store_true",
                        help="send to a topic, consume its durable subscription queue (as the "
                             "fault run's first stage does), instead of a queue")
    parser.add_argument("--consumers", type=int, default=1,
                        help="consumers, each on its own connection")
    parser.add_argument("--forward", action="store_true",
                        help="each consumer sends a delivery on to a second queue (with a "
                             "receipt) before its ACK, and takes that queue too")
    parser.add_argument("--pauses", type=int, default=0,
                        help="at most this many SIGSTOPs (0.5 to 6 s) of the node a round")
    parser.add_argument("--close-before-kill", action="store_true",
                        help="the first consumer's connection closed by the client 0 to 50 ms "
                             "before each kill")
    parser.add_argument("--keep-backlog", action="store_true",
                        help="no drain after a kill: the next round's consumers take what the "
                             "node recovered, as the fault run's do; both queues drained and "
                             "counted once, after the last round")
    parser.add_argument("--heartbeat", type=int, default=0, metavar="MS",
                        help="heart-beats of the producer's and consumers' connections (0: none)")
    parser.add_argument("--load", type=int, default=0,
                        help="busy processes run beside (one CPU each)")
    args = parser.parse_args(argv)
    if not rabbitmq_available():
        return not_installed("RabbitMQ with the STOMP plugin")
    rng = random.Random(args.seed)
    route = Route.make(args.topic)
    options = Options(args.rate, max(1, args.consumers),
                      Route.make(False) if args.forward else None, args.pauses,
                      args.close_before_kill, args.keep_backlog, args.heartbeat)
    rounds, seen = [], []
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(args.load)]
    try:
        with RabbitMQ() as node:
            drain(node, route)  # declares the queues (durable, classic)
            if options.forward is not None:
                drain(node, options.forward)
            node.restart()  # a clean restart writes them down; then a kill -9 to recover from
            node.kill()
            node.restart()
            ready = time.monotonic()
            print(Round.HEADER, flush=True)
            for number in range(1, args.rounds + 1):
                done, saw, ready = one_round(node, route, options, number, ready,
                                             rng.uniform(2.0, 6.0), rng)
                print(done.row(str(number)) + (f"  {done.lost_ids}" if done.lost_ids else ""),
                      flush=True)
                rounds.append(done)
                seen.append(saw)
            if options.keep_backlog:
                settled = settle_backlog(node, route, options, seen)
                print(settled.row("drain") + "  (the backlog, drained after the last round)"
                      + (f"  {settled.lost_ids}" if settled.lost_ids else ""), flush=True)
                rounds.append(settled)
    finally:
        for process in busy:
            process.kill()
            process.wait()
    kills = [r for r in rounds if r.number]
    counts = (sum(getattr(r, f.name) for r in rounds) for f in dataclasses.fields(Round)[2:-1])
    total = Round(len(kills), sum(r.kill_after for r in kills) / max(1, len(kills)), *counts)
    print(total.row("total") + "  (kill at: the mean)")
    return 1 if total.lost_held or total.lost_queued or total.lost_forwarded else 0


if __name__ == "__main__":
    sys.exit(main())
