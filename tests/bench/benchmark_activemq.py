"""Benchmark: the container against hand-written stomp.py consumers on one ActiveMQ, one run.

    .venv/bin/python -m tests.bench.benchmark_activemq [--messages 5000] [--rss-messages 100000]
        [--runs 1]

Starts a private ActiveMQ with the reference config (persistJMSRedelivered on), preloads a queue
for each workload and prints a table, with the consumer's CPU per message (user + system time
of the consuming process). mdb's rows of record run ``mdb run tests.bench.bench_app`` as a user
starts it, with the documented defaults (``tests.bench.mdb_run``: the health endpoint on, the
log at INFO, the status line; its rate and CPU over a window in full flow); beside them the same
listener in a container in this process (``..., in process``), for the hunt of what ``mdb
run`` adds:

* W1: an empty transacted handler vs hand-written client-ack and BEGIN/ACK/COMMIT loops (goals:
  the client-ack loop's rate, at most 1.2x its CPU per message), and with tracing on (the
  application sets the SDK's tracer provider with a batch span processor, spans sampled out,
  then recorded and exported nowhere; goal: at most 1.15x the CPU of tracing off);
* W2: a handler awaiting 2 ms with pool=16 and prefetch=4 vs a one-at-a-time consumer (bar:
  >= 8x) and vs 16 hand-written client-ack connections with a prefetch of 10 (goal: >= 1x);
* W3: a handler burning 2 ms of CPU in pure Python under ``mdb run`` with ``--workers 1`` and
  ``--workers 2`` (goal: 2 workers >= 1.5x one), next to a hand-written one-at-a-time consumer
  doing the same work;
* W1s: a handler sending one message, transacted, vs the hand-written BEGIN/SEND/ACK/COMMIT
  loop (goals: its rate, at most 1.3x its CPU per message) and vs that loop made to give what
  mdb guarantees (the SEND's receipt awaited before the ACK, so that a refused SEND is never
  followed by its ACK, and the COMMIT's before the next message), mdb with pool=1, pool=1 and
  prefetch=2, and pool=4; and last again on a second broker whose STOMP connector lacks
  ``transport.tcpNoDelay=true`` (Nagle on, as in Debian's stock config and managed brokers;
  goal: at least 0.9x mdb's rate with the same settings on the reference config);
* RSS of a container in this process after 100k messages vs after 10k (bar: growth < 20 MB);
* the CPU ``mdb run`` takes to start (to its ready line), printed with each run.

Rates on a shared machine move from run to run: ``--runs N`` repeats every workload on the same
two brokers and prints each run's table, with the load average before and after it, then one
of the medians (each consumer's median rate and median CPU, the ratios of those).

The consumers are ``tests.bench.loops``' (``benchmark_rabbitmq`` measures W1, W1s and W2 on
RabbitMQ with the same loops). Not a test: CI never times anything.
"""

from __future__ import annotations

import os
import sys
from statistics import median
from typing import NamedTuple

import anyio
import stomp

from tests.bench.bench_app import burn
from tests.bench.command_line import counts
from tests.bench.loops import (
    ONE_AT_A_TIME,
    W1S,
    Measured,
    Row,
    container_rate,
    hand_written,
    load,
    medians,
    print_table,
    queue_of,
    table,
    tracing_rows,
    w1_rows,
    w1s_rows,
    w2_rows,
)
from tests.bench.mdb_run import mdb_run
from tests.bench.mdb_run import start_up as mdb_start_up
from tests.harness.servers.activemq import ActiveMQ

STOCK = "W1s, stock config (no tcpNoDelay)"


class Run(NamedTuple):
    rows: list[Row]  # the reference config's
    stock: list[Row]  # the stock connector's W1s rows
    memory: tuple[str, str, Measured, str]  # the RSS line
    start_up: float  # CPU seconds of mdb run to its ready line


def one_run(broker: ActiveMQ, stock: ActiveMQ, n: int, rss_messages: int) -> Run:
    """One run of every workload."""
    m = max(n // 4, 500)
    start_up = mdb_start_up(broker, queue_of(broker, "start", 1))
    rows = [*w1_rows(broker, n), *tracing_rows(broker, n), *w1s_rows(broker, n),
            *w2_rows(broker, n)]
    w3 = "W3 handler burns 2 ms of CPU"
    rows.append(Row(w3, ONE_AT_A_TIME, hand_written(broker, queue_of(broker, "w3h", m), m,
                                                    "ack", work=burn)))
    single = "mdb run --workers 1 (pool=4)"
    rows.append(Row(w3, single, mdb_run(broker, queue_of(broker, "w3w1", m), m, "W3", 4)))
    rows.append(Row(w3, "mdb run --workers 2 (pool=4)", mdb_run(
        broker, queue_of(broker, "w3w2", m), m, "W3", 4, workers=2), (single,)))
    marks = (rss_messages // 10, rss_messages)
    rate, rss = anyio.run(container_rate, broker.url, queue_of(broker, "rss", rss_messages),
                          rss_messages, 4, 0.0, marks)
    growth = (rss[marks[1]] - rss[marks[0]]) / 1024
    memory = (f"RSS {marks[0]} → {marks[1]} messages", "mdb pool=4", rate,
              f"{rss[marks[0]] / 1024:.0f} → {rss[marks[1]] / 1024:.0f} MB, "
              f"+{growth:.1f} MB (bar < 20)")
    return Run(rows, w1s_rows(stock, n, STOCK), memory, start_up)


def printed(rows: list[Row], stock: list[Row], memory: tuple[str, str, Measured, str] | None,
            ) -> list[tuple[str, str, Measured, str]]:
    """The table of one run (or of the medians): the stock connector's W1s rows last, each of
    mdb's also against mdb's rate with the same settings on the reference config."""
    lines = table(rows)
    if memory is not None:
        lines.insert(next(i for i, line in enumerate(lines) if line[0].startswith("W3")) + 3,
                     memory)
    reference = {row.consumer: row.measured for row in rows if row.workload == W1S}
    lines.extend((workload, consumer, rate, f"{note}; {rate[0] / reference[consumer][0]:.2f}x "
                  "the reference config's rate" if consumer.startswith("mdb") else note)
                 for workload, consumer, rate, note in table(stock))
    return lines


def main() -> None:
    args = counts(__doc__, messages=5000, rss_messages=100_000, runs=1)
    n = args.messages
    runs: list[Run] = []
    about = ("ActiveMQ 5.17 (Debian), reference config: persistJMSRedelivered=true, "
             f"{n} persistent messages per run ({max(n // 4, 500)} for the one-at-a-time and "
             f"W3 runs), STOMP 1.2, stomp.py {stomp.__version__}, {os.cpu_count()} cores shared "
             "with the broker")
    with ActiveMQ(heap_mb=1024) as broker, ActiveMQ(heap_mb=1024, nagle=True) as stock:
        for number in range(1, args.runs + 1):  # each run's table as soon as it is measured
            before = load()
            run = one_run(broker, stock, n, args.rss_messages)
            runs.append(run)
            print(f"\nrun {number} of {args.runs}: {before} before, {load()} after; {about}; "
                  f"mdb run's start-up (to its ready line) {run.start_up:.2f} s of CPU")
            print_table(printed(run.rows, run.stock, run.memory))
            sys.stdout.flush()
    if len(runs) > 1:
        print(f"\nmedians of {len(runs)} runs (each consumer's median rate and median CPU, "
              "the ratios of those); mdb run's start-up "
              f"{median(run.start_up for run in runs):.2f} s of CPU")
        print_table(printed(medians([run.rows for run in runs]),
                            medians([run.stock for run in runs]), None))


if __name__ == "__main__":
    main()
