"""Benchmark: W1s (a transacted handler that sends one message on) on one RabbitMQ, against
hand-written stomp.py loops in the same run.

    .venv/bin/python -m tests.bench.benchmark_rabbitmq_w1s [--messages 2000]

The loops: BEGIN/SEND/ACK/COMMIT without waiting for the commit's receipt (the most favourable
baseline, and what RabbitMQ does not keep: docs/rabbitmq.md), and SEND with a receipt, awaited,
then ACK (the publisher confirm a settlement that lasts needs). Each handles one message at a
time (``prefetch-count:1``, TCP_NODELAY as mdb uses). Not a test: CI never times anything; the
ratios mean more than the rates on a shared machine.
"""

from __future__ import annotations

import argparse
import socket
import threading
import time
import uuid

import anyio
import stomp

from tests.bench.benchmark_activemq import Measured, container_rate
from tests.harness.rabbitmq import RabbitMQ


def connect(broker: RabbitMQ) -> stomp.Connection12:
    conn = stomp.Connection12([("127.0.0.1", broker.port)], vhost="/")
    conn.connect(broker.username, broker.password, wait=True)
    conn.transport.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


def preload(broker: RabbitMQ, queue: str, count: int) -> None:
    conn = connect(broker)
    done = threading.Event()

    class Done(stomp.ConnectionListener):  # type: ignore[misc]
        def on_receipt(self, frame: stomp.utils.Frame) -> None:
            done.set()

    conn.set_listener("done", Done())
    for n in range(count - 1):
        conn.send(f"/queue/{queue}", f"message {n}", headers={"persistent": "true"})
    conn.send(f"/queue/{queue}", "last", headers={"persistent": "true", "receipt": "end"})
    done.wait(120)
    conn.disconnect()


def hand_written(broker: RabbitMQ, queue: str, count: int, confirmed: bool) -> Measured:
    conn = connect(broker)
    finished = threading.Event()
    seen = 0
    pending = ""  # the ack id of the message whose send awaits its receipt

    def done() -> None:
        nonlocal seen
        seen += 1
        if seen == count:
            finished.set()

    class Consumer(stomp.ConnectionListener):  # type: ignore[misc]
        def on_receipt(self, frame: stomp.utils.Frame) -> None:
            conn.ack(pending)
            done()

        def on_message(self, frame: stomp.utils.Frame) -> None:
            nonlocal pending
            ack_id = frame.headers["ack"]
            out = f"/queue/{queue}.out"
            if confirmed:  # acked by on_receipt (prefetch 1: nothing comes meanwhile)
                pending = ack_id
                conn.send(out, frame.body, headers={"persistent": "true", "receipt": "s"})
                return
            tx = conn.begin()
            conn.send(out, frame.body, transaction=tx, headers={"persistent": "true"})
            conn.ack(ack_id, transaction=tx)
            conn.commit(tx)
            done()

    conn.set_listener("consumer", Consumer())
    start, cpu = time.perf_counter(), time.process_time()
    conn.subscribe(f"/queue/{queue}", id="1", ack="client-individual",
                   headers={"prefetch-count": "1"})
    finished.wait(600)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    conn.disconnect()
    return count / elapsed, cpu / count * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=2000)
    n = parser.parse_args().messages
    rows: list[tuple[str, Measured]] = []
    with RabbitMQ() as broker:

        def queue(kind: str) -> str:
            name = f"bench-{kind}-{uuid.uuid4().hex[:6]}"
            preload(broker, name, n)
            return name

        rows.append(("hand-written BEGIN/SEND/ACK/COMMIT",
                     hand_written(broker, queue("tx"), n, confirmed=False)))
        rows.append(("hand-written SEND+receipt, then ACK",
                     hand_written(broker, queue("confirm"), n, confirmed=True)))
        for pool in (1, 4):
            measured, _ = anyio.run(container_rate, broker.url, queue(f"mdb{pool}"), n, pool,
                                    0.0, (), True)
            rows.append((f"mdb pool={pool}", measured))
    base = rows[0][1][0]
    for what, (rate, cpu) in rows:
        print(f"| W1s | {what} | {rate:,.0f} msg/s | {rate / base:.2f}x | {cpu:,.0f} µs CPU/msg |")


if __name__ == "__main__":
    main()
