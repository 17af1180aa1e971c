"""Benchmark: the container against hand-written stomp.py consumers on one RabbitMQ node.

    .venv/bin/python -m tests.bench.benchmark_rabbitmq [--messages 3000] [--runs 3]

Starts a private RabbitMQ node (``tests.harness.servers.rabbitmq``: one node, classic queues, the
broker's default and what docs/rabbitmq.md recommends for one node) and, in each run, preloads
a queue of persistent messages for each consumer and measures, with the consumer's CPU per
message (user + system time of the consuming process: this one for the hand-written loops and
the ``..., in process`` rows, ``mdb run``'s for mdb's rows of record, ``tests.bench.mdb_run``):

* W1: an empty transacted handler (mdb pool=1 and pool=4) vs the hand-written client-ack loop
  (``client-individual``, one ACK per message) and the BEGIN/ACK/COMMIT loop;
* W1s: a transacted handler sending one message on (pool=1 and pool=4) vs the hand-written
  BEGIN/SEND/ACK/COMMIT loop (what RabbitMQ does not keep durable) and a loop that SENDs with
  a receipt, waits for it, then ACKs: the publisher confirm mdb's settlement on RabbitMQ uses
  (``mdb_stomp.dialects.confirmed``);
* W2: a handler awaiting 2 ms (pool=1, 4, 16 and pool=16 with prefetch=4) vs a one-at-a-time
  loop and sixteen hand-written connections with a prefetch of 10.

The consumers are ``tests.bench.loops``' (the ActiveMQ benchmark's too). Rates on a shared
machine move from run to run: ``--runs`` repeats the whole set on the same node and prints
each run's table, then one of the medians (each consumer's median rate and median CPU, the
ratios of those), with the load average before and after each run. Not a test: CI never
times anything.
"""

from __future__ import annotations

import os

import stomp

from tests.bench.command_line import counts
from tests.bench.loops import (
    Row,
    load,
    medians,
    print_table,
    table,
    w1_rows,
    w1s_rows,
    w2_rows,
)
from tests.harness.servers.rabbitmq import RabbitMQ


def main() -> None:
    args = counts(__doc__, messages=3000, runs=3)
    n = args.messages
    runs: list[list[Row]] = []
    with RabbitMQ() as broker:
        version = broker.ctl("version").strip()
        for run in range(1, args.runs + 1):
            before = load()
            rows = [*w1_rows(broker, n), *w1s_rows(broker, n, guaranteed="confirm"),
                    *w2_rows(broker, n, pools=(1, 4, 16))]
            runs.append(rows)
            print(f"\nrun {run}: {before} before, {load()} after", flush=True)
            print_table(table(rows))
    print(f"\nRabbitMQ {version}, one node, classic queues; {n} persistent messages per run "
          f"({max(n // 4, 500)} for the one-at-a-time loop and W2 pool=1), STOMP 1.2, "
          f"stomp.py {stomp.__version__}, {os.cpu_count()} cores shared with the broker; "
          f"medians of {len(runs)} runs:")
    print_table(table(medians(runs)))


if __name__ == "__main__":
    main()
