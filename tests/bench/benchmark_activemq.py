"""Benchmark: the container against hand-written stomp.py consumers on one ActiveMQ, one run.

    .venv/bin/python -m tests.bench.benchmark_activemq [--messages 5000] [--rss-messages 100000]

Starts a private ActiveMQ with the reference config (persistJMSRedelivered on), preloads a queue
for each workload and prints a table, with the consumer's CPU per message (user + system time
of the consuming process: this one for the in-process consumers, the ``mdb run`` process and
its workers for W3):

* W1: an empty transacted handler vs hand-written client-ack and BEGIN/ACK/COMMIT loops (goals:
  the client-ack loop's rate, at most 1.2x its CPU per message), and last with tracing on
  (OpenTelemetry SDK providers set, spans sampled out, then recorded and exported nowhere; goal:
  at most 1.15x the CPU of tracing off);
* W2: a handler awaiting 2 ms with pool=16 and prefetch=4 vs a one-at-a-time consumer (bar:
  >= 8x) and vs 16 hand-written client-ack connections with a prefetch of 10 (goal: >= 1x);
* W3: a handler burning 2 ms of CPU in pure Python (``tests.bench.burn_app``) under ``mdb run``
  with ``--workers 1`` and ``--workers 2`` (goal: 2 workers >= 1.5x one), next to a hand-written
  one-at-a-time consumer doing the same work;
* W1s: a handler sending one message, transacted, vs the hand-written BEGIN/SEND/ACK/COMMIT
  loop (goals: its rate, at most 1.3x its CPU per message), and last again on a second broker
  whose STOMP connector lacks ``transport.tcpNoDelay=true`` (Nagle on, as in Debian's stock
  config and managed brokers; goal: at least 0.9x mdb's rate on the reference config);
* RSS of this process after 100k messages vs after 10k (bar: growth < 20 MB).

Not a test: CI never times anything.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import stomp
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, Sampler, SamplingResult

from mdb import Container, Context, listener
from mdb.broker_settings import BrokerSettings
from mdb.health import fetch_status
from mdb.settings import Settings
from tests.bench.burn_app import BURN
from tests.harness.activemq import ActiveMQ
from tests.harness.process import free_port

Login = tuple[str, str]  # the broker requires one (user, password): the harness's
Measured = tuple[float, float]  # msg/s, consumer CPU µs per message
ROOT = Path(__file__).resolve().parents[2]


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
                 work: Callable[[], None] = lambda: None) -> Measured:
    """What a user writes with stomp.py alone: handle on the receiver thread, ack each (in a
    transaction without waiting for the commit's receipt: the most favourable baseline), with
    TCP_NODELAY as mdb uses (without it every commit waits ~40 ms for a delayed TCP ACK)."""

    def handle(conn: stomp.Connection12, frame: stomp.utils.Frame) -> None:
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

    return consume(port, login, queue, count, handle)


def consume(port: int, login: Login, queue: str, count: int,
            handle: Callable[[stomp.Connection12, stomp.utils.Frame], None]) -> Measured:
    """``count`` messages of ``queue`` through ``handle`` on stomp.py's receiver thread, one
    connection with TCP_NODELAY and an ``ack:client`` subscription of prefetch 1 (``handle``
    acks); the rate and this process's CPU per message."""
    conn = stomp.Connection12([("127.0.0.1", port)])
    finished = threading.Event()
    seen = 0

    class Consumer(stomp.ConnectionListener):
        def on_message(self, frame: stomp.utils.Frame) -> None:
            nonlocal seen
            handle(conn, frame)
            seen += 1
            if seen == count:
                finished.set()

    conn.set_listener("consumer", Consumer())
    conn.connect(*login, wait=True)
    conn.transport.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    start, cpu = time.perf_counter(), time.process_time()
    conn.subscribe(f"/queue/{queue}", id="1", ack="client",
                   headers={"activemq.prefetchSize": "1"})
    finished.wait(600)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    conn.disconnect()
    return count / elapsed, cpu / count * 1e6


def w1s_rows(broker: ActiveMQ, count: int, workload: str) -> list[tuple[str, str, Measured,
                                                                        str]]:
    """W1s on ``broker``: the hand-written BEGIN/SEND/ACK/COMMIT loop, then mdb with pool=1
    and pool=4, each with its rate and CPU against the loop's."""
    login = (broker.username, broker.password)
    queues = [f"bench-w1s-{uuid.uuid4().hex[:6]}" for _ in range(3)]
    for name in queues:
        preload(broker.port, login, name, count)
    hand = hand_written(broker.port, login, queues[0], count, transacted=True, send=True)
    rows = [(workload, "hand-written BEGIN/SEND/ACK/COMMIT", hand, "")]
    for pool, name in zip((1, 4), queues[1:], strict=True):
        rate, _ = anyio.run(container_rate, broker.url, name, count, pool, 0.0, (), True)
        rows.append((workload, f"mdb pool={pool}", rate,
                     f"{rate[0] / hand[0]:.2f}x the loop's rate (goal 1x); CPU "
                     f"{rate[1] / hand[1]:.1f}x its (goal 1.3x)"))
    return rows


def hand_written_pool(port: int, login: Login, queue: str, count: int, connections: int,
                      prefetch: int, work: Callable[[], None]) -> Measured:
    """``connections`` hand-written consumers of one queue, each on its own connection with an
    ``ack:client`` subscription of ``prefetch``, acking each message after ``work`` on its
    receiver thread (in order, so each cumulative ack covers just that message)."""
    lock = threading.Lock()
    finished = threading.Event()
    seen = 0
    conns = [stomp.Connection12([("127.0.0.1", port)]) for _ in range(connections)]

    class Consumer(stomp.ConnectionListener):
        def __init__(self, conn: stomp.Connection12) -> None:
            self.conn = conn

        def on_message(self, frame: stomp.utils.Frame) -> None:
            nonlocal seen
            work()
            self.conn.ack(frame.headers["ack"])
            with lock:
                seen += 1
                if seen == count:
                    finished.set()

    for conn in conns:
        conn.set_listener("consumer", Consumer(conn))
        conn.connect(*login, wait=True)
        conn.transport.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    start, cpu = time.perf_counter(), time.process_time()
    for conn in conns:
        conn.subscribe(f"/queue/{queue}", id="1", ack="client",
                       headers={"activemq.prefetchSize": str(prefetch)})
    finished.wait(600)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    for conn in conns:
        conn.disconnect()
    return count / elapsed, cpu / count * 1e6


class Switch(Sampler):
    """Samples every span in or every span out, as ``sampled`` says."""

    sampled = False

    def should_sample(self, *args: Any, **kwargs: Any) -> SamplingResult:
        sampler = ALWAYS_ON if self.sampled else ALWAYS_OFF
        return sampler.should_sample(*args, **kwargs)

    def get_description(self) -> str:
        return "Switch"


def burn() -> None:
    """W3's work on a hand-written consumer: what ``tests.bench.burn_app`` does."""
    end = time.thread_time() + BURN
    while time.thread_time() < end:
        pass


async def container_rate(url: str, queue: str, count: int, pool: int, sleep: float,
                         rss_at: tuple[int, ...] = (), send: bool = False,
                         prefetch: int | None = None) -> tuple[Measured, dict[int, int]]:
    @listener(f"queue:{queue}", pool=pool, prefetch=prefetch, name="bench")
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
        start, cpu = time.perf_counter(), time.process_time()
        pending = sorted(rss_at)
        while stats.processed < count:
            await anyio.sleep(0.01)
            while pending and stats.processed >= pending[0]:
                rss[pending.pop(0)] = rss_kib()
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
        container.request_stop()
    return (count / elapsed, cpu / count * 1e6), rss


def mdb_run(url: str, queue: str, count: int, workers: int) -> Measured:
    """``mdb run tests.bench.burn_app --workers N`` as a user starts it, on a preloaded queue:
    the rate and CPU (the process and its workers, from /proc) from its ready line until
    ``/status`` counts ``count`` processed, less what was processed before the ready line."""
    health = f"http://127.0.0.1:{free_port()}"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("MDB_")},
           "MDB_BROKERS__DEFAULT__URL": url, "MDB_APP": "bench", "MDB_SERVER": "w3",
           "MDB_HEALTH_PORT": health.rsplit(":", 1)[1], "MDB_LOG_LEVEL": "WARNING",
           "MDB_STATUS_INTERVAL": "3600", "BENCH_QUEUE": queue}
    process = subprocess.Popen(
        [sys.executable, "-m", "mdb.cli", "run", "tests.bench.burn_app", "--workers",
         str(workers)], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        for line in process.stdout:
            if line.startswith("mdb: ready"):
                break
        start, cpu = time.perf_counter(), tree_cpu(process.pid)
        before = processed(health)
        while (done := processed(health)) < count:
            time.sleep(0.1)
        elapsed, cpu = time.perf_counter() - start, tree_cpu(process.pid) - cpu
    finally:
        process.terminate()
        process.wait(60)
    return (done - before) / elapsed, cpu / (done - before) * 1e6


def processed(health_url: str) -> int:
    return sum(lh.processed for lh in fetch_status(health_url, 10).listeners)


def tree_cpu(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` and its children (Linux /proc)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        if stat.parent.name == str(pid) or fields[1] == str(pid):  # itself, or its parent
            total += (int(fields[11]) + int(fields[12])) / ticks
    return total


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
    rows: list[tuple[str, str, Measured, str]] = []
    with ActiveMQ(heap_mb=1024) as broker:
        login = (broker.username, broker.password)

        def queue(kind: str, count: int = n) -> str:
            name = f"bench-{kind}-{uuid.uuid4().hex[:6]}"
            preload(broker.port, login, name, count)
            return name

        w1 = "W1 empty handler, transacted"
        hand_ack = hand_written(broker.port, login, queue("w1a"), n, transacted=False)
        rows.append((w1, "hand-written client ACK per message, not transacted", hand_ack, ""))
        hand_tx = hand_written(broker.port, login, queue("w1h"), n, transacted=True)
        rows.append((w1, "hand-written BEGIN/ACK/COMMIT", hand_tx, ""))
        plain: Measured | None = None
        for pool in (1, 4):
            rate, _ = anyio.run(container_rate, broker.url, queue(f"w1c{pool}"), n, pool, 0.0)
            plain = plain or rate
            rows.append((w1, f"mdb pool={pool}", rate,
                         f"{rate[0] / hand_ack[0]:.2f}x the ACK loop (goal 1x); CPU "
                         f"{rate[1] / hand_ack[1]:.1f}x the ACK loop's (goal 1.2x)"))
        w1s = w1s_rows(broker, n, "W1s handler sends 1 message, transacted")
        rows.extend(w1s)
        w2, m = "W2 handler awaits 2 ms", max(n // 4, 500)
        one = hand_written(broker.port, login, queue("w2h", m), m, transacted=False,
                           work=lambda: time.sleep(0.002))
        rows.append((w2, "hand-written one at a time", one, ""))
        sixteen = hand_written_pool(broker.port, login, queue("w2p"), n, 16, 10,
                                    lambda: time.sleep(0.002))
        rows.append((w2, "hand-written client acks, 16 connections, prefetch 10", sixteen, ""))
        # prefetch 4: what a user sets for a handler that waits on I/O (docs/concepts.md).
        rate, _ = anyio.run(container_rate, broker.url, queue("w2c"), n, 16, 0.002, (), False, 4)
        rows.append((w2, "mdb pool=16, prefetch=4", rate, f"{rate[0] / one[0]:.1f}x (bar 8x); "
                                              f"{rate[0] / sixteen[0]:.2f}x 16 connections"))
        w3 = "W3 handler burns 2 ms of CPU"
        burnt = hand_written(broker.port, login, queue("w3h", m), m, transacted=False, work=burn)
        rows.append((w3, "hand-written one at a time", burnt, ""))
        single = mdb_run(broker.url, queue("w3w1", m), m, 1)
        rows.append((w3, "mdb run --workers 1 (pool=4)", single, ""))
        double = mdb_run(broker.url, queue("w3w2", m), m, 2)
        rows.append((w3, "mdb run --workers 2 (pool=4)", double,
                     f"{double[0] / single[0]:.2f}x --workers 1 (goal 1.5x)"))
        total = args.rss_messages
        name = f"bench-rss-{uuid.uuid4().hex[:6]}"
        preload(broker.port, login, name, total)
        marks = (total // 10, total)
        rate, rss = anyio.run(container_rate, broker.url, name, total, 4, 0.0, marks)
        growth = (rss[marks[1]] - rss[marks[0]]) / 1024
        rows.append((f"RSS {marks[0]} → {marks[1]} messages", "mdb pool=4", rate,
                     f"{rss[marks[0]] / 1024:.0f} → {rss[marks[1]] / 1024:.0f} MB, "
                     f"+{growth:.1f} MB (bar < 20)"))
        # Last: a process's OpenTelemetry providers can be set only once; the sampler decides
        # per run whether spans are dropped at their start or recorded (and then dropped, as
        # nothing exports them).
        sampler = Switch()
        trace.set_tracer_provider(TracerProvider(sampler=sampler))
        metrics.set_meter_provider(MeterProvider())
        assert plain is not None
        for sampled, how in ((False, "sampled out"), (True, "recorded, nothing exported")):
            sampler.sampled = sampled
            traced, _ = anyio.run(container_rate, broker.url, queue("w1t"), n, 1, 0.0)
            rows.append((w1, f"mdb pool=1, tracing on: SDK providers set, spans {how}", traced,
                         f"{traced[0] / plain[0]:.2f}x the rate and {traced[1] / plain[1]:.2f}x "
                         "the CPU of tracing off (goal: at most 1.15x the CPU)"))
    with ActiveMQ(heap_mb=1024, nagle=True) as stock:
        stock_rows = w1s_rows(stock, n, "W1s, stock config (no tcpNoDelay)")
        rows.extend((workload, consumer, rate, f"{ratio}; {rate[0] / ref[2][0]:.2f}x the "
                     "reference config's (goal >= 0.9x)" if consumer.startswith("mdb") else "")
                    for (workload, consumer, rate, ratio), ref in zip(stock_rows, w1s,
                                                                      strict=True))
    print()
    print("ActiveMQ 5.17 (Debian), reference config: persistJMSRedelivered=true, "
          f"{n} persistent messages per run ({m} for the one-at-a-time and W3 runs), STOMP 1.2, "
          f"stomp.py {stomp.__version__}, {os.cpu_count()} cores shared with the broker")
    print_table(rows)


def print_table(rows: list[tuple[str, str, Measured, str]]) -> None:
    """``rows`` (workload, consumer, (msg/s, CPU µs/msg), against the baseline) as the
    markdown table the docs carry."""
    print("| workload | consumer | msg/s | CPU µs/msg | vs baseline |")
    print("|---|---|---:|---:|---|")
    for workload, consumer, (msgs, cpu), ratio in rows:
        print(f"| {workload} | {consumer} | {msgs:,.0f} | {cpu:,.0f} | {ratio} |")


if __name__ == "__main__":
    main()
