"""Benchmark: poison messages with a redelivery delay must not hold the pool
(docs/performance.md).

    .venv/bin/python -m tests.bench.benchmark_delays [--good 10000] [--failing 1000] [--runs 3]

On one queue, GOOD messages that succeed and FAILING ones that always raise, interleaved (one
failing after every GOOD/FAILING good ones), preloaded, then consumed by a container with
``pool = 4`` and ``Redelivery(limit=3, delay=2, backoff=1)``: each failing message is delivered
four times, two seconds apart, then moved to the error destination. Printed, per broker (the
embedded memory broker, and a private ActiveMQ with the reference config, its scheduler on):

* the good messages' rate, against a run of the good ones alone (goal: at least 0.9x), and
  against a run whose failing messages are retried at once (delay 0: what the failures cost
  by themselves);
* the time from the start until the last failing message reached the error destination,
  against the time the good ones took plus limit x delay (the goal: about that, not the
  number of failing messages times the delay).

Were the delay held in the pool slots (docs/concepts.md, "Redelivery delays and order"), the
failing messages alone would occupy the four slots for FAILING x limit x delay / pool seconds
(1,500 s with the defaults).
Medians of ``--runs`` runs. Not a test: CI never times anything.
"""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import anyio
import stomp

from mdb import Container, Producer, Redelivery, listener
from mdb.config.broker_settings import BrokerSettings
from mdb.config.settings import Settings
from tests.bench.command_line import counts
from tests.harness.servers.activemq import ActiveMQ

POOL = 4
LIMIT, DELAY = 3, 2.0


@dataclass(frozen=True)
class Run:
    good_seconds: float  # until every good message was processed
    last_failing_seconds: float | None  # until the last failing one reached the error queue


def bodies(good: int, failing: int) -> list[str]:
    """``good`` good and ``failing`` failing bodies, the failing ones spread evenly."""
    every = good // failing if failing else good + 1
    out: list[str] = []
    for n in range(1, good + 1):
        out.append(f"good {n}")
        if n % every == 0 and len(out) - n < failing:
            out.append(f"fail {n}")
    return out


async def preload_memory(url: str, queue: str, texts: list[str]) -> None:
    settings = Settings(app="bench", server="s1", brokers={"default": BrokerSettings(url=url)})
    async with Producer(settings) as producer:
        for text in texts:
            await producer.send(f"queue:{queue}", text)


def preload_activemq(broker: ActiveMQ, queue: str, texts: list[str]) -> None:
    conn = stomp.Connection12([("127.0.0.1", broker.port)])
    done = threading.Event()

    class Receipt(stomp.ConnectionListener):
        def on_receipt(self, frame: stomp.utils.Frame) -> None:
            done.set()

    conn.set_listener("receipt", Receipt())
    conn.connect(broker.username, broker.password, wait=True)
    for n, text in enumerate(texts):
        headers = {"persistent": "true", "amq-msg-type": "text"}
        if n == len(texts) - 1:
            headers["receipt"] = "last"
        conn.send(f"/queue/{queue}", text, headers=headers)
    done.wait(300)
    conn.disconnect()


async def consume(url: str, queue: str, good: int, failing: int, delay: float) -> Run:
    @listener(f"queue:{queue}", pool=POOL, name="bench",
              redelivery=Redelivery(limit=LIMIT, delay=delay, backoff=1.0))
    async def handler(body: str) -> None:
        if body.startswith("fail"):
            raise RuntimeError("poison")

    settings = Settings(app="bench", server="s1", brokers={"default": BrokerSettings(url=url)})
    container = Container(settings, [handler.__mdb_listener__])  # type: ignore[attr-defined]
    good_at = last_at = None
    async with anyio.create_task_group() as tg:
        await tg.start(container.run)
        stats = container.deployed[0].stats
        start = time.perf_counter()
        while good_at is None or (failing and last_at is None):
            await anyio.sleep(0.005)  # a benchmark's sampling, never a test's wait
            now = time.perf_counter() - start
            if good_at is None and stats.processed >= good:
                good_at = now
            if failing and last_at is None and stats.to_error_destination >= failing:
                last_at = now
        container.request_stop()
    assert good_at is not None
    return Run(good_at, last_at)


def measure(name: str, runs: int, good: int, failing: int,
            load: Callable[[str, list[str]], None], url: str) -> list[str]:
    """Table rows for one broker, ``runs`` runs of each: the good messages alone, with the
    failing ones (delay ``DELAY``), and with the failing ones retried at once (delay 0: what
    the failures cost without any delay)."""
    variants = {"alone": (0, DELAY), "delayed": (failing, DELAY), "at once": (failing, 0.0)}
    results: dict[str, list[Run]] = {key: [] for key in variants}
    for _ in range(runs):
        for key, (count, delay) in variants.items():
            queue = f"bench-delay-{uuid.uuid4().hex[:8]}"
            load(queue, bodies(good, count))
            results[key].append(anyio.run(consume, url, queue, good, count, delay))
    base = statistics.median(good / r.good_seconds for r in results["alone"])
    rows = [f"| {name} | {good:,} good alone | {base:,.0f} | | |"]
    for key, delay in (("delayed", DELAY), ("at once", 0.0)):
        rate = statistics.median(good / r.good_seconds for r in results[key])
        run = statistics.median(r.good_seconds for r in results[key])
        last = statistics.median(r.last_failing_seconds or 0.0 for r in results[key])
        goal = run + LIMIT * delay
        rows.append(f"| {name} | {good:,} good + {failing:,} failing, delay {delay:g} s | "
                    f"{rate:,.0f} | {rate / base:.2f}x | {last:.1f} s (run {run:.1f} s + "
                    f"{LIMIT}x{delay:g} s = {goal:.1f} s) |")
    return rows


def main() -> None:
    args = counts(__doc__, good=10_000, failing=1_000, runs=3)
    rows: list[str] = []

    def load_memory(url: str) -> Callable[[str, list[str]], None]:
        return lambda queue, texts: anyio.run(preload_memory, url, queue, texts)

    memory = f"memory://bench-{uuid.uuid4().hex[:6]}"
    rows += measure("memory (embedded)", args.runs, args.good, args.failing,
                    load_memory(memory), memory)
    with ActiveMQ(heap_mb=1024) as broker:
        rows += measure("ActiveMQ 5.17, reference config", args.runs, args.good, args.failing,
                        lambda queue, texts: preload_activemq(broker, queue, texts), broker.url)
    print()
    print(f"pool={POOL}, Redelivery(limit={LIMIT}, delay={DELAY:g}, backoff=1), empty handler, "
          f"medians of {args.runs} runs; ActiveMQ: persistent messages, persistJMSRedelivered "
          "and the scheduler on")
    print("| broker | messages | good msg/s | vs good alone (goal ≥ 0.9x) | last failing one "
          "on the error destination |")
    print("|---|---|---:|---|---|")
    for row in rows:
        print(row)


if __name__ == "__main__":
    main()
