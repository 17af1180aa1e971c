"""What the broker benchmarks measure, on a private ActiveMQ or RabbitMQ (``tests.harness``):
the hand-written stomp.py consumers, each written once, and mdb's container in this process.

Every hand-written consumer handles messages on stomp.py's receiver thread, one connection
with TCP_NODELAY as mdb uses (without it every commit waits ~40 ms for a delayed TCP ACK),
and subscribes as mdb does on that broker: ``ack:client`` on ActiveMQ (its transacted
``client-individual`` acks degrade, docs/architecture.md "Pools and prefetch"),
``client-individual`` on RabbitMQ. None but the confirmed BEGIN/SEND/ACK/COMMIT loop (the one
that guarantees what mdb does on ActiveMQ) waits for a COMMIT's receipt, the most favourable
case for them: they cannot tell whether a commit happened. ``Measured`` is the rate and the
consuming process's CPU (user + system, all its threads) per message. Not a test: CI never
times anything.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from statistics import median
from typing import Literal, NamedTuple

import anyio
import stomp

from mdb import Container, Context, listener
from mdb.config.broker_settings import BrokerSettings
from mdb.config.settings import Settings
from tests.bench.mdb_run import mdb_run
from tests.harness.servers.process import BrokerProcess

Measured = tuple[float, float]  # msg/s, consumer CPU µs per message
# What the loop does per message: ack it; BEGIN/(SEND)/ACK/COMMIT; SEND with a receipt and
# ACK once the receipt came (a publisher confirm on RabbitMQ, docs/rabbitmq.md); or
# BEGIN/SEND/ACK/COMMIT awaiting the SEND's receipt before the ACK and the COMMIT's before the
# next message (what mdb's settlement guarantees on ActiveMQ, docs/architecture.md).
Mode = Literal["ack", "transaction", "confirm", "confirmed-transaction"]


class Row(NamedTuple):
    """One consumer measured on one workload; ``versus`` names the consumers of the same
    workload (earlier rows) its rate and CPU are compared with."""

    workload: str
    consumer: str
    measured: Measured
    versus: tuple[str, ...] = ()


def connect(broker: BrokerProcess) -> stomp.Connection12:
    conn = stomp.Connection12([(broker.host, broker.port)], vhost=broker.vhost)
    conn.connect(broker.username, broker.password, wait=True)
    conn.transport.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


def subscribe(conn: stomp.Connection12, broker: BrokerProcess, queue: str,
              prefetch: int) -> None:
    if broker.name == "RabbitMQ":
        conn.subscribe(f"/queue/{queue}", id="1", ack="client-individual",
                       headers={"prefetch-count": str(prefetch)})
    else:
        conn.subscribe(f"/queue/{queue}", id="1", ack="client",
                       headers={"activemq.prefetchSize": str(prefetch)})


def preload(broker: BrokerProcess, queue: str, count: int) -> None:
    """``count`` persistent messages on ``queue``, the last one's receipt awaited."""
    conn = connect(broker)
    receipt = threading.Event()

    class Done(stomp.ConnectionListener):  # type: ignore[misc]
        def on_receipt(self, frame: stomp.utils.Frame) -> None:
            receipt.set()

    conn.set_listener("done", Done())
    for n in range(count - 1):
        conn.send(f"/queue/{queue}", f"message {n}", headers={"persistent": "true"})
    conn.send(f"/queue/{queue}", "last", headers={"persistent": "true", "receipt": "end"})
    receipt.wait(120)
    conn.disconnect()


def queue_of(broker: BrokerProcess, kind: str, count: int) -> str:
    """A new queue named after ``kind``, preloaded with ``count`` messages."""
    name = f"bench-{kind}-{uuid.uuid4().hex[:6]}"
    preload(broker, name, count)
    return name


def hand_written(broker: BrokerProcess, queue: str, count: int, mode: Mode, *,
                 send: bool = False, work: Callable[[], None] = lambda: None) -> Measured:
    """What a user writes with stomp.py alone, one message at a time (prefetch 1): ``work``,
    then per ``mode`` (``Mode``); ``send`` sends the body on to ``<queue>.out`` (persistent),
    as ``confirm`` always does."""
    out = f"/queue/{queue}.out"
    awaiting = ""  # the ack id of the message whose SEND awaits its receipt
    tx = ""  # confirmed-transaction: that message's transaction

    def handle(conn: stomp.Connection12, frame: stomp.utils.Frame) -> bool:
        nonlocal awaiting, tx
        work()
        ack_id = frame.headers["ack"]
        if mode == "ack":
            conn.ack(ack_id)
        elif mode == "confirm":  # acked by receipt() (prefetch 1: nothing comes meanwhile)
            awaiting = ack_id
            conn.send(out, frame.body, headers={"persistent": "true", "receipt": "s"})
            return False
        elif mode == "confirmed-transaction":  # acked and committed by receipt()
            awaiting, tx = ack_id, conn.begin()
            conn.send(out, frame.body, transaction=tx,
                      headers={"persistent": "true", "receipt": "s"})
            return False
        else:
            tx = conn.begin()
            if send:
                conn.send(out, frame.body, transaction=tx, headers={"persistent": "true"})
            conn.ack(ack_id, transaction=tx)
            conn.commit(tx)
        return True

    def receipt(conn: stomp.Connection12, frame: stomp.utils.Frame) -> bool:
        if mode == "confirm":
            conn.ack(awaiting)
            return True
        if frame.headers["receipt-id"] == "s":
            conn.ack(awaiting, transaction=tx)
            conn.commit(tx, headers={"receipt": "c"})
            return False
        return True  # the COMMIT's

    return consume(broker, queue, count, handle,
                   receipt if mode in ("confirm", "confirmed-transaction") else None)


def consume(broker: BrokerProcess, queue: str, count: int,
            handle: Callable[[stomp.Connection12, stomp.utils.Frame], bool],
            receipt: Callable[[stomp.Connection12, stomp.utils.Frame], bool] | None = None,
            ) -> Measured:
    """``count`` messages of ``queue`` through ``handle`` on stomp.py's receiver thread, one
    connection, prefetch 1; ``handle`` acks and says True, or says False and leaves the ack
    to ``receipt``, called on each RECEIPT frame, which says True once the message is
    settled. The rate and this process's CPU per message, until the last one's ack was
    written (or its settlement's last receipt came)."""
    finished = threading.Event()
    seen = 0

    def settled() -> None:
        nonlocal seen
        seen += 1
        if seen == count:
            finished.set()

    class Consumer(stomp.ConnectionListener):  # type: ignore[misc]
        def on_message(self, frame: stomp.utils.Frame) -> None:
            if handle(conn, frame):
                settled()

        def on_receipt(self, frame: stomp.utils.Frame) -> None:
            if receipt is not None and not finished.is_set() and receipt(conn, frame):
                settled()  # (DISCONNECT's receipt comes once finished)

    conn = connect(broker)
    conn.set_listener("consumer", Consumer())
    start, cpu = time.perf_counter(), time.process_time()
    subscribe(conn, broker, queue, 1)
    finished.wait(600)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    conn.disconnect()
    return count / elapsed, cpu / count * 1e6


def hand_written_pool(broker: BrokerProcess, queue: str, count: int, connections: int,
                      prefetch: int, work: Callable[[], None]) -> Measured:
    """``connections`` hand-written consumers of one queue, each on its own connection with a
    subscription of ``prefetch``, acking each message after ``work`` on its receiver thread
    (in order, so that a cumulative ack covers just that message)."""
    lock = threading.Lock()
    finished = threading.Event()
    seen = 0

    class Consumer(stomp.ConnectionListener):  # type: ignore[misc]
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

    conns = [connect(broker) for _ in range(connections)]
    for conn in conns:
        conn.set_listener("consumer", Consumer(conn))
    start, cpu = time.perf_counter(), time.process_time()
    for conn in conns:
        subscribe(conn, broker, queue, prefetch)
    finished.wait(600)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    for conn in conns:
        conn.disconnect()
    return count / elapsed, cpu / count * 1e6


async def container_rate(url: str, queue: str, count: int, pool: int, sleep: float,
                         rss_at: tuple[int, ...] = (), send: bool = False,
                         prefetch: int | None = None) -> tuple[Measured, dict[int, int]]:
    """``count`` messages of ``queue`` through a container in this process, whose listener
    awaits ``sleep`` seconds and, with ``send``, sends the body on to ``<queue>.out``
    (transacted, the default); with this process's RSS (KiB) once ``rss_at`` were
    processed."""
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


def rss_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def mdb_rate(broker: BrokerProcess, queue: str, count: int, pool: int, sleep: float = 0.0,
             send: bool = False, prefetch: int | None = None) -> Measured:
    rate, _ = anyio.run(container_rate, broker.url, queue, count, pool, sleep, (), send,
                        prefetch)
    return rate


W1 = "W1 empty handler, transacted"
W1S = "W1s handler sends 1 message, transacted"
W2 = "W2 handler awaits 2 ms"
ACK_LOOP = "hand-written client ACK per message, not transacted"
TX_LOOP = "hand-written BEGIN/SEND/ACK/COMMIT"
CONFIRM_LOOP = "hand-written SEND with a receipt, awaited, then ACK"
CONFIRMED_TX_LOOP = ("hand-written BEGIN/SEND/ACK/COMMIT, the SEND's receipt awaited before "
                     "the ACK, the COMMIT's before the next message")
ONE_AT_A_TIME = "hand-written one at a time"
SIXTEEN = "hand-written client acks, 16 connections, prefetch 10"
SHORT = {ACK_LOOP: "client-ack loop", TX_LOOP: "BEGIN/SEND/ACK/COMMIT loop",
         CONFIRM_LOOP: "confirm loop", CONFIRMED_TX_LOOP: "confirmed BEGIN/SEND/ACK/COMMIT loop",
         ONE_AT_A_TIME: "one-at-a-time loop",
         SIXTEEN: "16 connections"}  # in the comparisons


def mdb_rows(broker: BrokerProcess, workload: str, n: int, pool: int,
             prefetch: int | None = None, versus: tuple[str, ...] = (),
             in_process: bool = True) -> list[Row]:
    """mdb on ``workload`` (W1, W1s or W2) with ``pool`` and ``prefetch``: ``mdb run`` as a user
    starts it (``tests.bench.mdb_run``), the benchmark of record, then, with ``in_process``,
    a container in this process with the same listener (``mdb_rate``): what ``mdb run`` adds
    is the difference."""
    label = f"pool={pool}" + (f", prefetch={prefetch}" if prefetch else "")
    app = {W1: "W1", W1S: "W1s", W2: "W2"}[workload]
    kind = f"{app}-{pool}-{prefetch}"
    rows = [Row(workload, f"mdb run {label}", mdb_run(
        broker, queue_of(broker, kind, n), n, app, pool, prefetch), versus)]
    if in_process:
        rows.append(Row(workload, f"mdb {label}, in process", mdb_rate(
            broker, queue_of(broker, kind, n), n, pool, 0.002 if app == "W2" else 0.0,
            send=app == "W1s", prefetch=prefetch), versus))
    return rows


def w1_rows(broker: BrokerProcess, n: int, pools: tuple[int, ...] = (1, 4)) -> list[Row]:
    """W1: the client-ack and BEGIN/ACK/COMMIT loops, then mdb with each of ``pools``."""
    rows = [Row(W1, ACK_LOOP, hand_written(broker, queue_of(broker, "w1a", n), n, "ack")),
            Row(W1, "hand-written BEGIN/ACK/COMMIT",
                hand_written(broker, queue_of(broker, "w1h", n), n, "transaction"))]
    for pool in pools:
        rows += mdb_rows(broker, W1, n, pool, versus=(ACK_LOOP,))
    return rows


def tracing_rows(broker: BrokerProcess, n: int) -> list[Row]:
    """W1 through ``mdb run`` pool=1 with the SDK's tracer provider set by the application:
    spans sampled out, then recorded (and exported nowhere), against ``mdb run pool=1``."""
    return [Row(W1, f"mdb run pool=1, tracing on: spans {how}",
                mdb_run(broker, queue_of(broker, "w1t", n), n, "W1", tracing=tracing),
                ("mdb run pool=1",))
            for tracing, how in (("sampled-out", "sampled out"),
                                 ("recorded", "recorded, nothing exported"))]


def w1s_rows(broker: BrokerProcess, n: int, workload: str = W1S,
             guaranteed: Mode = "confirmed-transaction") -> list[Row]:
    """W1s: the BEGIN/SEND/ACK/COMMIT loop, the loop that gives what mdb guarantees on the
    broker (``guaranteed``: ``confirmed-transaction`` on ActiveMQ, ``confirm`` on RabbitMQ,
    where a settlement lasts only so), then mdb with pool=1 (also in process), pool=1 and
    prefetch=2 (what docs/concepts.md recommends for a sending listener of one slot on a
    broker with Nagle's algorithm on) and pool=4 against them."""
    rows = [Row(workload, TX_LOOP, hand_written(broker, queue_of(broker, "w1sh", n), n,
                                                "transaction", send=True))]
    safe = CONFIRM_LOOP if guaranteed == "confirm" else CONFIRMED_TX_LOOP
    rows.append(Row(workload, safe, hand_written(broker, queue_of(broker, "w1sc", n), n,
                                                 guaranteed)))
    for pool, prefetch in ((1, None), (1, 2), (4, None)):
        rows += mdb_rows(broker, W1S, n, pool, prefetch, (safe, TX_LOOP),
                         in_process=(pool, prefetch) == (1, None))
    return [row._replace(workload=workload) for row in rows]


def w2_rows(broker: BrokerProcess, n: int, pools: tuple[int, ...] = ()) -> list[Row]:
    """W2 (a 2 ms wait per message): a one-at-a-time loop on ``max(n // 4, 500)`` messages,
    sixteen connections with a prefetch of 10, mdb with each of ``pools`` (prefetch 1; on the
    slow one-at-a-time count for pool=1) and with pool=16 and prefetch=4, what a user sets for
    a handler that waits on I/O (docs/concepts.md)."""
    m = max(n // 4, 500)
    rows = [Row(W2, ONE_AT_A_TIME, hand_written(broker, queue_of(broker, "w2h", m), m, "ack",
                                                work=lambda: time.sleep(0.002))),
            Row(W2, SIXTEEN, hand_written_pool(broker, queue_of(broker, "w2p", n), n, 16, 10,
                                               lambda: time.sleep(0.002)))]
    for pool in pools:
        rows += mdb_rows(broker, W2, m if pool == 1 else n, pool,
                         versus=(ONE_AT_A_TIME, SIXTEEN), in_process=False)
    return rows + mdb_rows(broker, W2, n, 16, 4, (ONE_AT_A_TIME, SIXTEEN))


def versus(rows: list[Row], row: Row) -> str:
    """``row`` against the consumers it names: "0.52x the rate, 2.1x the CPU of ..."."""
    by_name = {(r.workload, r.consumer): r.measured for r in rows}
    (rate, cpu) = row.measured
    return "; ".join(f"{rate / base[0]:.2f}x the rate, {cpu / base[1]:.2f}x the CPU of the "
                     f"{SHORT.get(name, name)}" for name in row.versus
                     if (base := by_name.get((row.workload, name))) is not None)


def load() -> str:
    """The machine's load average, printed beside each run: rates on a shared machine move."""
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def medians(runs: list[list[Row]]) -> list[Row]:
    """Each row's median rate and median CPU over ``runs`` (the same rows in each)."""
    return [first._replace(measured=(median(run[i].measured[0] for run in runs),
                                     median(run[i].measured[1] for run in runs)))
            for i, first in enumerate(runs[0])]


def print_table(rows: list[tuple[str, str, Measured, str]]) -> None:
    """``rows`` (workload, consumer, (msg/s, CPU µs/msg), against the baseline) as the
    markdown table the docs carry."""
    print("| workload | consumer | msg/s | CPU µs/msg | vs baseline |")
    print("|---|---|---:|---:|---|")
    for workload, consumer, (msgs, cpu), ratio in rows:
        print(f"| {workload} | {consumer} | {msgs:,.0f} | {cpu:,.0f} | {ratio} |")


def table(rows: list[Row]) -> list[tuple[str, str, Measured, str]]:
    """``rows`` as ``print_table`` takes them, each compared with what it names."""
    return [(row.workload, row.consumer, row.measured, versus(rows, row)) for row in rows]
