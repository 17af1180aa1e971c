"""Benchmark: the container against hand-written stomp.py consumers on one ActiveMQ, one run.

    .venv/bin/python -m tests.bench.benchmark_activemq [--messages 5000] [--rss-messages 100000]
        [--runs 1]

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
  loop (goals: its rate, at most 1.3x its CPU per message) and vs that loop made to give what
  mdb guarantees (the SEND's receipt awaited before the ACK, so that a refused SEND is never
  followed by its ACK, and the COMMIT's before the next message), mdb with pool=1, pool=1 and
  prefetch=2, and pool=4; and last again on a second broker whose STOMP connector lacks
  ``transport.tcpNoDelay=true`` (Nagle on, as in Debian's stock config and managed brokers;
  goal: at least 0.9x mdb's rate with the same settings on the reference config);
* RSS of this process after 100k messages vs after 10k (bar: growth < 20 MB).

Rates on a shared machine move from run to run: ``--runs N`` repeats every workload on the same
two brokers and prints each run's table, with the load average before and after it, then one
of the medians (each consumer's median rate and median CPU, the ratios of those). The tracing
rows of every run are measured after all the others (OpenTelemetry's providers, once set,
stay set), so they are compared with the tracing-off row of their run made minutes earlier.

The consumers are ``tests.bench.loops``' (``benchmark_rabbitmq`` measures W1, W1s and W2 on
RabbitMQ with the same loops). Not a test: CI never times anything.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import stomp
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, Sampler, SamplingResult

from mdb.http.client import fetch_status
from tests.bench.burn_app import BURN
from tests.bench.command_line import counts
from tests.bench.loops import (
    ONE_AT_A_TIME,
    W1,
    W1S,
    Measured,
    Row,
    container_rate,
    hand_written,
    load,
    mdb_rate,
    medians,
    print_table,
    queue_of,
    table,
    w1_rows,
    w1s_rows,
    w2_rows,
)
from tests.harness.activemq import ActiveMQ
from tests.harness.process import free_port

ROOT = Path(__file__).resolve().parents[2]


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


STOCK = "W1s, stock config (no tcpNoDelay)"


def one_run(broker: ActiveMQ, stock: ActiveMQ, n: int, rss_messages: int,
            ) -> tuple[list[Row], list[Row], tuple[str, str, Measured, str]]:
    """One run of every workload but tracing's: the reference config's rows, the stock
    connector's W1s rows and the RSS line."""
    m = max(n // 4, 500)
    rows = [*w1_rows(broker, n), *w1s_rows(broker, n), *w2_rows(broker, n)]
    w3 = "W3 handler burns 2 ms of CPU"
    rows.append(Row(w3, ONE_AT_A_TIME, hand_written(broker, queue_of(broker, "w3h", m), m,
                                                    "ack", work=burn)))
    single = "mdb run --workers 1 (pool=4)"
    rows.append(Row(w3, single, mdb_run(broker.url, queue_of(broker, "w3w1", m), m, 1)))
    rows.append(Row(w3, "mdb run --workers 2 (pool=4)",
                    mdb_run(broker.url, queue_of(broker, "w3w2", m), m, 2), (single,)))
    marks = (rss_messages // 10, rss_messages)
    rate, rss = anyio.run(container_rate, broker.url, queue_of(broker, "rss", rss_messages),
                          rss_messages, 4, 0.0, marks)
    growth = (rss[marks[1]] - rss[marks[0]]) / 1024
    memory = (f"RSS {marks[0]} → {marks[1]} messages", "mdb pool=4", rate,
              f"{rss[marks[0]] / 1024:.0f} → {rss[marks[1]] / 1024:.0f} MB, "
              f"+{growth:.1f} MB (bar < 20)")
    return rows, w1s_rows(stock, n, STOCK), memory


def printed(rows: list[Row], stock: list[Row], memory: tuple[str, str, Measured, str] | None,
            ) -> list[tuple[str, str, Measured, str]]:
    """The table of one run (or of the medians): the stock connector's W1s rows last, each of
    mdb's also against mdb's rate with the same settings on the reference config."""
    lines = table(rows)
    if memory is not None:
        tracing = [i for i, line in enumerate(lines) if "tracing on" in line[1]]
        lines.insert(tracing[0] if tracing else len(lines), memory)
    reference = {row.consumer: row.measured for row in rows if row.workload == W1S}
    lines.extend((workload, consumer, rate, f"{note}; {rate[0] / reference[consumer][0]:.2f}x "
                  "the reference config's rate" if consumer.startswith("mdb") else note)
                 for workload, consumer, rate, note in table(stock))
    return lines


def main() -> None:
    args = counts(__doc__, messages=5000, rss_messages=100_000, runs=1)
    n = args.messages
    runs: list[tuple[list[Row], list[Row], tuple[str, str, Measured, str]]] = []
    with ActiveMQ(heap_mb=1024) as broker, ActiveMQ(heap_mb=1024, nagle=True) as stock:
        for run in range(1, args.runs + 1):
            before = load()
            runs.append(one_run(broker, stock, n, args.rss_messages))
            print(f"run {run}: {before} before, {load()} after", flush=True)
        # Last: a process's OpenTelemetry providers can be set only once; the sampler decides
        # per run whether spans are dropped at their start or recorded (and then dropped, as
        # nothing exports them). Each run's tracing rows join that run's table.
        sampler = Switch()
        trace.set_tracer_provider(TracerProvider(sampler=sampler))
        metrics.set_meter_provider(MeterProvider())
        for rows, _, _ in runs:
            for sampled, how in ((False, "sampled out"), (True, "recorded, nothing exported")):
                sampler.sampled = sampled
                rows.append(Row(W1, f"mdb pool=1, tracing on: SDK providers set, spans {how}",
                                mdb_rate(broker, queue_of(broker, "w1t", n), n, 1),
                                ("mdb pool=1",)))
    about = ("ActiveMQ 5.17 (Debian), reference config: persistJMSRedelivered=true, "
             f"{n} persistent messages per run ({max(n // 4, 500)} for the one-at-a-time and "
             f"W3 runs), STOMP 1.2, stomp.py {stomp.__version__}, {os.cpu_count()} cores shared "
             "with the broker")
    for run, (rows, stock_rows, memory) in enumerate(runs, 1):
        print(f"\nrun {run} of {len(runs)}; {about}")
        print_table(printed(rows, stock_rows, memory))
    if len(runs) > 1:
        print(f"\nmedians of {len(runs)} runs (each consumer's median rate and median CPU, "
              "the ratios of those)")
        print_table(printed(medians([rows for rows, _, _ in runs]),
                            medians([stock_rows for _, stock_rows, _ in runs]), None))


if __name__ == "__main__":
    main()
