"""End-to-end latency at a steady offered load: the ``mdb`` source against a hand-written
stomp.py consumer, side by side in one run on one private ActiveMQ (reference config).

For each RATE an mdb ``Producer`` offers RATE msg/s for SECONDS to a 3-member topic: each
message is due at a fixed point of a monotonic schedule, so one late send does not delay the
rest (SENDERS sends at a time, each waiting for its receipt), and carries its wall-clock send
time in its JSON body. A producer that cannot keep up still stops at SECONDS, and the table
shows the rate it reached. Each consumer has a topic of its own, so the broker does the same
work for both.

* ``stomp.py``: ``bench_source``'s client-ack consumer; a message's latency is from its send
  to the moment it was acked.
* ``mdb source``: the ``mdb`` format → ``foreachBatch`` writing each batch as parquet
  (``batch=<id>``, overwritten, so a replayed batch replaces its rows), default trigger (the
  next micro-batch starts as soon as the previous one ended and data waits); a row's latency
  is from its send to the end of the write that put it in the sink.

The first WARMUP seconds of each rate's sends are left out (connections, the query's first
batches planning and compiling). Wall clocks of one machine: a sender and a consumer agree.

    .venv/bin/python -m tests.spark.bench_latency [SECONDS] [RATE ...]
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from typing import TYPE_CHECKING, Any

import anyio

import mdb_spark
from mdb.config.settings import load_settings
from mdb.routing.producer import Producer
from tests.harness.servers.activemq import ActiveMQ
from tests.spark.bench_source import (
    bench_settings,
    client_ack_consumer,
    local_spark,
    subscription_queues,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

WARMUP = 10.0
PREFETCH = "100"
# Each send waits for the broker's receipt: on this loaded 2-core machine 8 at a time reached
# 350-750 msg/s, 32 somewhat more.
SENDERS = 32
HEADER = "| consumer | offered msg/s | messages | rows/s | p50 ms | p95 ms | p99 ms | max ms |"


class Arrivals:
    """The (send, arrival) wall-clock times of each phase's messages, added from any thread."""

    def __init__(self) -> None:
        self._times: dict[int, list[tuple[float, float]]] = defaultdict(list)
        self._changed = threading.Condition()

    def add(self, body: str, arrived: float) -> None:
        stamp = json.loads(body)
        with self._changed:
            self._times[stamp["phase"]].append((stamp["sent"], arrived))
            self._changed.notify_all()

    def wait(self, phase: int, count: int, timeout: float) -> list[tuple[float, float]]:
        with self._changed:
            if not self._changed.wait_for(lambda: len(self._times[phase]) >= count, timeout):
                raise RuntimeError(f"{len(self._times[phase])} of {count} messages of phase "
                                   f"{phase} arrived in {timeout:.0f} s")
            return list(self._times[phase])


async def offer(settings: dict[str, Any], destination: str, phase: int, rate: float,
                seconds: float) -> tuple[float, int, float]:
    """Send to ``destination`` for ``seconds``, message ``seq`` due ``seq / rate`` s after the
    start (a producer that falls behind sends at once, but never past ``seconds``); return the
    start (wall clock), how many were sent and the rate achieved."""
    async with Producer(load_settings(None, **settings)) as producer:
        began, began_wall = anyio.current_time(), time.time()
        sent = 0

        async def sender(first: int) -> None:
            nonlocal sent
            for seq in range(first, round(rate * seconds), SENDERS):
                await anyio.sleep_until(began + seq / rate)
                if anyio.current_time() >= began + seconds:
                    return
                await producer.send(destination, json.dumps(
                    {"phase": phase, "seq": seq, "sent": time.time(), "note": "x" * 100}))
                sent += 1

        async with anyio.create_task_group() as senders:
            for first in range(SENDERS):
                senders.start_soon(sender, first)
        return began_wall, sent, sent / (anyio.current_time() - began)


def table_row(consumer: str, rate: float, offered: float, times: list[tuple[float, float]],
              measured_from: float) -> str:
    """The table's row for the messages sent from ``measured_from`` (wall clock) on. rows/s:
    those messages over the time from ``measured_from`` to the last one's arrival, so a little
    under the offered rate even for a consumer that keeps up."""
    kept = [(sent, arrived) for sent, arrived in times if sent >= measured_from]
    latencies = sorted((arrived - sent) * 1000 for sent, arrived in kept)
    cuts = statistics.quantiles(latencies, n=100, method="inclusive")
    rows_per_s = len(kept) / (max(arrived for _, arrived in kept) - measured_from)
    late = f" (sent {offered:,.0f}/s)" if offered < 0.98 * rate else ""
    return (f"| {consumer} | {rate:,.0f}{late} | {len(kept)} | {rows_per_s:,.0f} | "
            f"{cuts[49]:.0f} | {cuts[94]:.0f} | {cuts[98]:.0f} | {latencies[-1]:.0f} |")


def run_phase(consumer: str, settings: dict[str, Any], destination: str, arrivals: Arrivals,
              phase: int, rate: float, seconds: float) -> str:
    """Offer ``rate`` for ``seconds`` and wait for all those messages to arrive."""
    began, count, offered = anyio.run(offer, settings, destination, phase, rate, seconds)
    times = arrivals.wait(phase, count, timeout=120)
    return table_row(consumer, rate, offered, times, began + WARMUP)


def stomp_side(broker: ActiveMQ, settings: dict[str, Any], rates: list[float],
               seconds: float) -> list[str]:
    arrivals = Arrivals()
    connection = client_ack_consumer(broker, subscription_queues("plain", "stomppy"), PREFETCH,
                                     lambda frame: arrivals.add(frame.body, time.time()))
    try:
        return [run_phase("stomp.py client-ack", settings, "topic:plain", arrivals, phase, rate,
                          seconds) for phase, rate in enumerate(rates)]
    finally:
        connection.disconnect()


def batch_times(progress: list[dict[str, Any]]) -> str:
    """Mean ms per micro-batch that read rows, and of its parts Spark reports."""
    batches = [p for p in progress if p["numInputRows"]]
    parts = ("triggerExecution", "latestOffset", "walCommit", "queryPlanning", "getBatch",
             "addBatch", "commitOffsets")
    means = ", ".join(f"{part} {statistics.mean(p['durationMs'].get(part, 0) for p in batches):.0f}"
                      for part in parts)
    rows = statistics.mean(p["numInputRows"] for p in batches)
    return f"{len(batches)} batches of {rows:.0f} rows, mean ms: {means}"


def mdb_side(options: dict[str, str], settings: dict[str, Any], rates: list[float],
             seconds: float, work: str) -> tuple[list[str], list[str]]:
    """The table's rows, and per rate where the micro-batches' time went."""
    import pyarrow.parquet as pq

    arrivals = Arrivals()

    def land(batch: DataFrame, batch_id: int) -> None:
        path = f"{work}/sink/batch={batch_id}"
        batch.write.mode("overwrite").parquet(path)
        landed = time.time()
        # Read back from the sink, after the clock stopped: the rows counted are those there.
        for body in pq.read_table(path, columns=["body_string"])["body_string"].to_pylist():
            arrivals.add(body, landed)

    spark = local_spark()
    # Enough progress kept for every batch of a phase.
    spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "10000")
    query = (spark.readStream.format("mdb").options(**options).load()
             .writeStream.foreachBatch(land).option("checkpointLocation", f"{work}/cp").start())
    rows, notes = [], []
    try:
        # The first trigger has asked the source for offsets: its receivers are running.
        while query.lastProgress is None:
            query.awaitTermination(0.2)
        for phase, rate in enumerate(rates):
            seen = query.lastProgress["batchId"]
            rows.append(run_phase("mdb source → parquet", settings, "topic:orders", arrivals,
                                  phase, rate, seconds))
            notes.append(f"{rate:,.0f} msg/s: " + batch_times(
                [p for p in query.recentProgress if p["batchId"] > seen]))
    finally:
        query.stop()
        spark.stop()
    return rows, notes


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 40.0
    rates = [float(rate) for rate in sys.argv[2:]] or [200.0, 1000.0]
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    work = tempfile.mkdtemp(prefix="mdb-spark-latency-")
    with ActiveMQ() as broker:
        settings = bench_settings(broker, "plain", "orders")
        options = {"settings": json.dumps(settings), "destination": "topic:orders",
                   "journal": f"{work}/journal", "prefetch": PREFETCH, "name": "spark"}
        mdb_spark.create_subscriptions(options)
        mdb_spark.create_subscriptions({**options, "destination": "topic:plain",
                                        "name": "stomppy"})
        plain = stomp_side(broker, settings, rates, seconds)
        source, notes = mdb_side(options, settings, rates, seconds, work)
    print(f"{HEADER}\n|---|---|---|---|---|---|---|---|")
    print("\n".join(plain + source))
    print(f"{seconds:.0f} s at each rate; the first {WARMUP:.0f} s of sends left out; "
          f"prefetch {PREFETCH}, mdb source in local[2] with the default trigger")
    print("\n".join(notes))


if __name__ == "__main__":
    main()
