"""Does RabbitMQ itself lose a confirmed, delivered, unacked message at a kill -9 that comes
seconds after a recovery from another kill -9? (docs/failover.md, "Open finding"). Raw STOMP
1.2, no mdb: a measurement, not a CI test.

One node, one durable classic queue declared long before (a clean restart after its
declaration: a queue declared just before a kill is a separate known loss); with ``--topic``
the producer sends to a topic and the consumers take its durable subscription queue, as the
fault run's first stage does. Each round starts
as the node came back from the previous round's kill -9 (the first from a kill made for it):

* a producer sends persistent messages with unique ids at about ``--rate`` a second, each with
  a receipt (RabbitMQ's publisher confirm): the ids whose receipt came are *confirmed*;
* a consumer (``ack:client-individual``, ``prefetch-count`` 10) records each delivery and acks
  it, with a receipt, after holding it up to 80 ms; one in 50 it holds unacked until the kill;
* 2 to 6 s after the node answered (drawn from ``--seed``), the node is killed -9, restarted,
  and the queue drained by a fresh consumer that acks everything.

A confirmed message is **lost** when it is not in the drain and its consumer never sent an
ACK for it: ``lost held`` if it was delivered before the kill (the open finding's case),
``lost queued`` if it never was. A delivered message whose ACK was sent but not answered
(``ack unanswered``) may have been acked before the kill: gone is not lost there.
"""

from __future__ import annotations

import argparse
import dataclasses
import queue
import random
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any, ClassVar

import stomp

from tests.harness.rabbitmq import RabbitMQ, rabbitmq_available

WAIT = 60.0  # bound on a drain or a connect after a restart: a hang guard
PREFETCH = 10
HOLD = 0.08  # the longest a consumer holds a message before its ACK
HOLD_UNTIL_KILL = 50  # one delivery in this many is held unacked until the kill,
HELD_AT_MOST = PREFETCH // 2  # up to this many, so that the prefetch window stays open


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


def _connect(node: RabbitMQ, listener: stomp.ConnectionListener) -> stomp.Connection12:
    connection = stomp.Connection12([(node.host, node.port)], vhost="/",
                                    reconnect_attempts_max=1)
    connection.set_listener("measure", listener)
    connection.connect(node.username, node.password, wait=True)
    return connection


class _Producer(stomp.ConnectionListener):  # type: ignore[misc]
    """Sends ``ROUND-N`` ids at a steady rate from its own thread until stopped or cut off."""

    def __init__(self, node: RabbitMQ, route: Route, round_id: str, rate: float) -> None:
        self.sent: set[str] = set()
        self.confirmed: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.connection = _connect(node, self)
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
            except stomp.exception.StompException:
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
    """Acks each delivery after a short hold (its own thread); one in ``HOLD_UNTIL_KILL``
    (at most ``HELD_AT_MOST``) never."""

    def __init__(self, node: RabbitMQ, route: Route, rng: random.Random) -> None:
        self.delivered: set[str] = set()
        self.ack_sent: set[str] = set()
        self.ack_confirmed: set[str] = set()
        self.held: set[str] = set()
        self._rng = rng
        self._lock = threading.Lock()
        self._due: queue.Queue[tuple[float, str, str] | None] = queue.Queue()
        self.connection = _connect(node, self)
        self._thread = threading.Thread(target=self._ack, daemon=True)
        self._thread.start()
        self.connection.subscribe(route.subscribe_to, id="measure", ack="client-individual",
                                   headers={**route.subscribe_headers,
                                            "prefetch-count": str(PREFETCH)})

    def on_message(self, frame: Any) -> None:
        message_id = frame.headers["mid"]
        with self._lock:
            self.delivered.add(message_id)
            if len(self.held) < HELD_AT_MOST and self._rng.randrange(HOLD_UNTIL_KILL) == 0:
                self.held.add(message_id)
                return
            hold = self._rng.uniform(0, HOLD)
        self._due.put((time.monotonic() + hold, message_id, frame.headers["ack"]))

    def _ack(self) -> None:
        while (due := self._due.get()) is not None:
            at, message_id, ack_id = due
            time.sleep(max(0.0, at - time.monotonic()))
            with self._lock:
                self.ack_sent.add(message_id)
            try:
                self.connection.ack(ack_id, receipt=f"ack-{message_id}")
            except stomp.exception.StompException:
                return

    def on_receipt(self, frame: Any) -> None:
        with self._lock:
            self.ack_confirmed.add(frame.headers["receipt-id"].removeprefix("ack-"))

    def stop(self) -> None:
        self._due.put(None)
        self._thread.join()


class _Drainer(stomp.ConnectionListener):  # type: ignore[misc]
    def __init__(self, marker: str) -> None:
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
    connection = _connect(node, drainer)
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
    sent: int
    confirmed: int
    delivered: int
    held: int  # delivered, no ACK sent, at the kill
    ack_unanswered: int
    drained: int
    lost_held: int
    lost_queued: int
    gone_ack_unanswered: int
    lost_ids: list[str] = dataclasses.field(default_factory=list)

    HEADER: ClassVar[str] = ("round  kill at  sent  confirmed  delivered  held  ack unanswered"
                             "  drained  lost held  lost queued  gone (ack unanswered)")

    def row(self, label: str) -> str:
        return (f"{label:>5}  {self.kill_after:6.2f}s  {self.sent:4}  {self.confirmed:9}"
                f"  {self.delivered:9}  {self.held:4}  {self.ack_unanswered:14}"
                f"  {self.drained:7}  {self.lost_held:9}  {self.lost_queued:11}"
                f"  {self.gone_ack_unanswered:21}")


def one_round(node: RabbitMQ, route: Route, number: int, ready: float, kill_after: float,
              rate: float, rng: random.Random) -> tuple[Round, float]:
    """A round on the node that answered at ``ready`` (monotonic): load, the kill -9
    ``kill_after`` seconds after it answered, the restart and the drain; the round, and when
    the node answered again."""
    round_id = f"r{number}-{uuid.uuid4().hex[:8]}"
    consumer = _Consumer(node, route, rng)
    producer = _Producer(node, route, round_id, rate)
    time.sleep(max(0.0, ready + kill_after - time.monotonic()))
    node.kill()
    producer.stop()
    consumer.stop()
    # Receipts read before the socket closed are still being handed over: wait for the close.
    for connection in (producer.connection, consumer.connection):
        deadline = time.monotonic() + WAIT
        while connection.is_connected() and time.monotonic() < deadline:
            time.sleep(0.01)
    node.restart()
    answered = time.monotonic()
    drained = set(drain(node, route))
    confirmed, delivered = producer.confirmed, consumer.delivered
    unacked = delivered - consumer.ack_sent
    lost_held = sorted((confirmed & unacked) - drained)
    lost_queued = sorted((confirmed - delivered) - drained)
    ack_unanswered = consumer.ack_sent - consumer.ack_confirmed
    return Round(number, kill_after, len(producer.sent), len(confirmed), len(delivered),
                 len(unacked), len(ack_unanswered), len(drained & producer.sent),
                 len(lost_held), len(lost_queued),
                 len((confirmed & ack_unanswered) - drained), lost_held + lost_queued), answered


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults.confirmed_loss",
                                     description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=40, help="node kills")
    parser.add_argument("--rate", type=float, default=100.0, help="messages a second")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--topic", action="store_true",
                        help="send to a topic, consume its durable subscription queue (as the "
                             "fault run's first stage does), instead of a queue")
    args = parser.parse_args(argv)
    if not rabbitmq_available():
        print("RabbitMQ with the STOMP plugin is not installed here", file=sys.stderr)
        return 2
    rng = random.Random(args.seed)
    route = Route.make(args.topic)
    rounds = []
    with RabbitMQ() as node:
        drain(node, route)  # declares the queue (durable, classic)
        node.restart()  # a clean restart writes it down; then a first kill -9 to recover from
        node.kill()
        node.restart()
        ready = time.monotonic()
        print(Round.HEADER, flush=True)
        for number in range(1, args.rounds + 1):
            done, ready = one_round(node, route, number, ready, rng.uniform(2.0, 6.0),
                                    args.rate, rng)
            print(done.row(str(number)) + (f"  {done.lost_ids}" if done.lost_ids else ""),
                  flush=True)
            rounds.append(done)
    counts = (sum(getattr(r, f.name) for r in rounds) for f in dataclasses.fields(Round)[2:-1])
    total = Round(len(rounds), sum(r.kill_after for r in rounds) / max(1, len(rounds)),
                  *counts)
    print(total.row("total") + "  (kill at: the mean)")
    return 1 if total.lost_held or total.lost_queued else 0


if __name__ == "__main__":
    sys.exit(main())
