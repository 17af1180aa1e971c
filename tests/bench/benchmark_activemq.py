"""Benchmark: the container against hand-written stomp.py consumers on one ActiveMQ, one run.

    .venv/bin/python -m tests.bench.benchmark_activemq [--messages 5000] [--rss-messages 100000]

Starts a private ActiveMQ with the reference config (persistJMSRedelivered on), preloads a queue
for each workload and prints a table:

* W1: an empty transacted handler vs a hand-written BEGIN/ACK/COMMIT loop (bar: >= 0.8x);
* W2: a handler awaiting 2 ms with pool=16 vs a one-at-a-time consumer (bar: >= 8x);
* RSS of this process after 100k messages vs after 10k (bar: growth < 20 MB).

Not a test: CI never times anything.
"""

from __future__ import annotations

import argparse
import socket
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import anyio
import stomp

from mdb import Container, Context, listener
from mdb.broker_settings import BrokerSettings
from mdb.settings import Settings
from tests.harness.activemq import ActiveMQ

Login = tuple[str, str]  # the broker requires one (user, password): the harness's


def preload(port: int, login: Login, queue: str, count: int) -> None:
    conn = stomp.Connection12([("127.0.0.1", port)])
    conn.connect(*login, wait=True)
    for n in range(count):
        conn.send(f"/queue/{queue}", f"message {n}", headers={"persistent": "true"})
    receipt = threading.Event()

    class Done(stomp.ConnectionListener):
        def on_receipt(self, frame: stomp.utils.Frame) -> None:
            receipt.set()

    conn.set_listener("done", Done())
    conn.send(f"/queue/{queue}", "last", headers={"persistent": "true", "receipt": "end"})
    receipt.wait(120)
    conn.disconnect()


def hand_written(port: int, login: Login, queue: str, count: int, *, transacted: bool,
                 send: bool = False,
                 work: Callable[[], None] = lambda: None) -> float:
    """What a user writes with stomp.py alone: handle on the receiver thread, ack each (in a
    transaction without waiting for the commit's receipt: the most favourable baseline), with
    TCP_NODELAY as mdb uses (without it every commit waits ~40 ms for a delayed TCP ACK)."""
    conn = stomp.Connection12([("127.0.0.1", port)])
    finished = threading.Event()
    seen = 0

    class Consumer(stomp.ConnectionListener):
        def on_message(self, frame: stomp.utils.Frame) -> None:
            nonlocal seen
            work()
            ack_id = frame.headers["ack"]
            if transacted:
                tx = conn.begin()
                if send:
                    conn.send(f"/queue/{queue}.out", frame.body, transaction=tx,
                              headers={"persistent": "true"})
                conn.ack(ack_id, transaction=tx)
                conn.commit(tx)
            else:
                conn.ack(ack_id)
            seen += 1
            if seen == count:
                finished.set()

    conn.set_listener("consumer", Consumer())
    conn.connect(*login, wait=True)
    conn.transport.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    start = time.perf_counter()
    conn.subscribe(f"/queue/{queue}", id="1", ack="client",
                   headers={"activemq.prefetchSize": "1"})
    finished.wait(600)
    elapsed = time.perf_counter() - start
    conn.disconnect()
    return count / elapsed


async def container_rate(url: str, queue: str, count: int, pool: int, sleep: float,
                         rss_at: tuple[int, ...] = (), send: bool = False,
                         ) -> tuple[float, dict[int, int]]:
    @listener(f"queue:{queue}", pool=pool, name="bench")
    async def handler(body: bytes, ctx: Context) -> None:
        if sleep:
            await anyio.sleep(sleep)
        if send:
            await ctx.send(f"queue:{queue}.out", body)

    settings = Settings(app="bench", server="s1",
                        brokers={"default": BrokerSettings(url=url)})
    container = Container(settings, [handler.__mdb_listener__])  # type: ignore[attr-defined]
    rss: dict[int, int] = {}
    async with anyio.create_task_group() as tg:
        await tg.start(container.run)
        stats = container.deployed[0].stats
        start = time.perf_counter()
        pending = sorted(rss_at)
        while stats.processed < count:
            await anyio.sleep(0.01)
            while pending and stats.processed >= pending[0]:
                rss[pending.pop(0)] = rss_kib()
        elapsed = time.perf_counter() - start
        container.request_stop()
    return count / elapsed, rss


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--rss-messages", type=int, default=100_000)
    args = parser.parse_args()
    n = args.messages
    rows: list[tuple[str, str, float, str]] = []
    with ActiveMQ(heap_mb=1024) as broker:
        login = (broker.username, broker.password)

        def queue(kind: str) -> str:
            name = f"bench-{kind}-{uuid.uuid4().hex[:6]}"
            preload(broker.port, login, name, n)
            return name

        hand_tx = hand_written(broker.port, login, queue("w1h"), n, transacted=True)
        rows.append(("W1 empty handler, transacted", "hand-written BEGIN/ACK/COMMIT", hand_tx, ""))
        for pool in (1, 4):
            rate, _ = anyio.run(container_rate, broker.url, queue(f"w1c{pool}"), n, pool, 0.0)
            rows.append(("W1 empty handler, transacted", f"mdb pool={pool}", rate,
                         f"{rate / hand_tx:.2f}x (bar 0.8x)"))
        hand_send = hand_written(broker.port, login, queue("w1sh"), n, transacted=True, send=True)
        rows.append(("W1s handler sends 1 message, transacted",
                     "hand-written BEGIN/SEND/ACK/COMMIT", hand_send, ""))
        for pool in (1, 4):
            rate, _ = anyio.run(container_rate, broker.url, queue(f"w1s{pool}"), n, pool, 0.0,
                                (), True)
            rows.append(("W1s handler sends 1 message, transacted", f"mdb pool={pool}", rate,
                         f"{rate / hand_send:.2f}x"))
        m = max(n // 4, 500)
        one = hand_written(broker.port, login, queue("w2h"), m, transacted=False,
                           work=lambda: time.sleep(0.002))
        rows.append(("W2 handler awaits 2 ms", "hand-written one at a time", one, ""))
        rate, _ = anyio.run(container_rate, broker.url, queue("w2c"), n, 16, 0.002)
        rows.append(("W2 handler awaits 2 ms", "mdb pool=16", rate,
                     f"{rate / one:.1f}x (bar 8x)"))
        total = args.rss_messages
        name = f"bench-rss-{uuid.uuid4().hex[:6]}"
        preload(broker.port, login, name, total)
        marks = (total // 10, total)
        rate, rss = anyio.run(container_rate, broker.url, name, total, 4, 0.0, marks)
        growth = (rss[marks[1]] - rss[marks[0]]) / 1024
        rows.append((f"RSS {marks[0]} → {marks[1]} messages", "mdb pool=4", rate,
                     f"{rss[marks[0]] / 1024:.0f} → {rss[marks[1]] / 1024:.0f} MB, "
                     f"+{growth:.1f} MB (bar < 20)"))
    print()
    print("ActiveMQ 5.17 (Debian), reference config: persistJMSRedelivered=true, "
          f"{n} persistent messages per run, STOMP 1.2, stomp.py {stomp.__version__}")
    print("| workload | consumer | msg/s | vs baseline |")
    print("|---|---|---:|---|")
    for workload, consumer, rate, ratio in rows:
        print(f"| {workload} | {consumer} | {rate:,.0f} | {ratio} |")


if __name__ == "__main__":
    main()
