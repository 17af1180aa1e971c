"""Work per message that does not depend on the machine's load: Python calls (cProfile) and,
with ``--callgrind``, CPU instructions (valgrind), for W1 (an empty handler, pool=1) and W1s
(a handler sending one message on, pool=1).

    .venv/bin/python -m tests.bench.profile_calls [--messages 2000]
        [--brokers memory activemq rabbitmq] [--workloads W1 W1s] [--ways in-process mdb-run]
        [--callgrind]

Each case runs in a process of its own (OpenTelemetry's providers can be set once per process):
a queue preloaded with ``--messages`` messages, then a container with one listener consumes
them, on the memory broker and/or (``--brokers``) on a private ActiveMQ (reference config) or
RabbitMQ node. The listener (``--workloads``, as the benchmark's) is W1's empty ``async def
handler(body: bytes, ctx: Context)`` and/or W1s's, which ``await ctx.send("queue:<queue>.out",
body)`` (transacted: on ActiveMQ BEGIN, SEND with a receipt, ACK, COMMIT with a receipt; on
RabbitMQ a SEND with a receipt, then an ACK with a receipt, ``mdb_stomp.dialects.confirmed``).
*Tracing off*: no provider set; *tracing on*: the SDK's tracer provider (every span recorded, none
exported) and meter provider (with a reader that is never read) set. The profiler runs from
the container's ready to its last message, on the event loop's thread, which does everything
per message (the STOMP socket is read on the loop). ``--ways mdb-run`` (a real broker only)
counts the same in ``mdb run tests.bench.bench_app`` with the defaults of
``tests.bench.mdb_run``, from its first message to the last, beside the container made in this
process (``in-process``, the default), tracing off: what ``mdb run`` adds is the difference.
Calls are split by where the called function lives: the broker adapter (``adapters/``,
stomp.py), the core (``mdb/`` but ``mdb/observability/telemetry/``), telemetry
(``mdb/observability/telemetry/``, OpenTelemetry), the event loop and the rest of the standard
library, and functions written in C.

``--callgrind`` counts instructions too: each case runs twice more under ``valgrind
--tool=callgrind``, consuming ``--messages`` and then twice as many of the same preloaded
queue, and the difference over the extra messages is the instructions per message (startup,
imports and preloading cancelled out). Slow: about a minute per run on the memory broker.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import anyio

from mdb import Container, Context, Producer, listener
from mdb.config.broker_settings import BrokerSettings
from mdb.config.settings import Settings
from tests.bench import mdb_run
from tests.harness.servers.process import BrokerProcess

ROOT = Path(__file__).resolve().parents[2]
KINDS = ("adapter", "core", "telemetry", "loop/stdlib", "C")
WORKLOADS = ("W1", "W1s")
BROKERS = ("memory", "activemq", "rabbitmq")
WAYS = ("in-process", "mdb-run")
CALLGRIND = ["valgrind", "--tool=callgrind"]
CASES = [(workload, broker, tracing, way) for workload in WORKLOADS
         for broker in BROKERS for way in WAYS for tracing in ("off", "on")
         if (way, tracing) != ("mdb-run", "on")]


def kind_of(filename: str) -> str:
    if filename.startswith("~") or filename.startswith("<"):
        return "C"
    path = filename.replace(os.sep, "/")
    if "/mdb/observability/telemetry/" in path or "/opentelemetry/" in path:
        return "telemetry"
    if "/adapters/" in path or "/stomp/" in path:
        return "adapter"
    if "/mdb/" in path:
        return "core"
    return "loop/stdlib"


def turn_tracing_on() -> None:
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider

    trace.set_tracer_provider(TracerProvider())
    metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))


async def consume(url: str, queue: str, count: int, profile: cProfile.Profile | None,
                  send: bool) -> None:
    done = anyio.Event()
    seen = 0

    @listener(f"queue:{queue}", name="w1")
    async def handler(body: bytes, ctx: Context) -> None:
        nonlocal seen
        if send:
            await ctx.send(f"queue:{queue}.out", body)
        seen += 1
        if seen == count:
            done.set()

    settings = Settings(app="profile", server="s1", brokers={"default": BrokerSettings(url=url)})
    container = Container(settings, [handler.__mdb_listener__])  # type: ignore[attr-defined]
    async with anyio.create_task_group() as tg:
        await tg.start(container.run)
        if profile is not None:
            profile.enable()
        await done.wait()
        if profile is not None:
            profile.disable()
        container.request_stop()


async def preload_memory(url: str, queue: str, count: int) -> None:
    settings = Settings(app="profile", server="s0", brokers={"default": BrokerSettings(url=url)})
    async with Producer(settings) as producer:
        for n in range(count):
            await producer.send(f"queue:{queue}", f"message {n}".encode())


def one(workload: str, broker: str, tracing: str, way: str, count: int, profiled: bool,
        preload_count: int, callgrind_out: str | None = None) -> dict[str, Any]:
    """One case, ``count`` of ``preload_count`` messages consumed in this process or ``mdb
    run``'s (``way``): calls per message by kind (profiled), else nothing (``mdb run`` then
    under callgrind, its output to ``callgrind_out``)."""
    queue = f"profile-{uuid.uuid4().hex[:6]}"
    if way == "mdb-run":  # its profile starts at its first message
        preload_count = max(preload_count, count + 1)
    private: BrokerProcess | None = None
    stats: dict[tuple[str, int, str], tuple[Any, ...]]
    if broker == "memory":
        url = f"memory://{queue}"
        anyio.run(preload_memory, url, queue, preload_count)
    else:
        from tests.bench.loops import preload
        from tests.harness.servers.activemq import ActiveMQ
        from tests.harness.servers.rabbitmq import RabbitMQ

        private = ActiveMQ(heap_mb=1024) if broker == "activemq" else RabbitMQ()
        url = private.start().url
        preload(private, queue, preload_count)
    if way == "mdb-run" and not profiled:
        assert private is not None, "mdb run: a real broker only"
        try:
            mdb_run.stopped(private, queue, count, workload, "",
                            [*CALLGRIND, f"--callgrind-out-file={callgrind_out}"])
        finally:
            private.close()
        return {}
    if way == "mdb-run":
        assert private is not None, "mdb run: a real broker only"
        with tempfile.TemporaryDirectory() as scratch:
            try:
                path = Path(scratch) / "profile"
                mdb_run.profiled(private, queue, count + 1, workload, "", path)
                stats = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]
            finally:
                private.close()
    else:
        if tracing == "on":
            turn_tracing_on()
        profile = cProfile.Profile() if profiled else None
        try:
            anyio.run(consume, url, queue, count, profile, workload == "W1s")
        finally:
            if private is not None:
                private.close()
        if profile is None:
            return {}
        stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    calls = dict.fromkeys(KINDS, 0)
    for (filename, _, _), (_, ncalls, *_) in stats.items():
        calls[kind_of(filename)] += ncalls
    return {kind: n / count for kind, n in calls.items()}


def instructions(workload: str, broker: str, tracing: str, way: str, count: int) -> float:
    """Instructions per message: callgrind's total with ``2 * count`` messages less that with
    ``count``, over ``count``; both preload ``2 * count``, so that the preloading cancels out
    (``mdb run``: its start and stop too, every thread of it counted)."""
    totals = []
    for n in (count, 2 * count):
        with tempfile.TemporaryDirectory() as scratch:
            out = Path(scratch) / "callgrind.out"
            case = ["-m", "tests.bench.profile_calls", "--case", workload, broker, tracing, way,
                    "--messages", str(n), "--preload", str(2 * count), "--unprofiled"]
            subprocess.run(
                [*CALLGRIND, f"--callgrind-out-file={out}", sys.executable, *case]
                if way == "in-process" else [sys.executable, *case, "--callgrind-out", str(out)],
                cwd=ROOT, check=True, capture_output=True,
                env={**os.environ, "PYTHONHASHSEED": "0"})
            totals.append(next(int(line.split()[1]) for line in out.read_text().splitlines()
                               if line.startswith("totals:")))
    return (totals[1] - totals[0]) / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--brokers", nargs="+", choices=BROKERS, default=["memory"],
                        help="memory (default) and/or a private ActiveMQ or RabbitMQ node")
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=["W1"],
                        help="W1 (default: an empty handler) and/or W1s (it sends one message)")
    parser.add_argument("--ways", nargs="+", choices=WAYS, default=["in-process"],
                        help="a container in this process (default) and/or mdb run's")
    parser.add_argument("--callgrind", action="store_true", help="instructions too")
    parser.add_argument("--case", nargs=4, metavar=("WORKLOAD", "BROKER", "TRACING", "WAY"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--unprofiled", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--preload", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--callgrind-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        workload, broker, tracing, way = args.case
        print(json.dumps(one(workload, broker, tracing, way, args.messages, not args.unprofiled,
                             args.preload or args.messages, args.callgrind_out)))
        return
    header = "| workload | broker | way | tracing | " + " | ".join(KINDS) + " | calls/msg |"
    if args.callgrind:
        header += " instructions/msg |"
    print(header)
    print("|---|---|---|---|" + "---:|" * (len(KINDS) + 1 + args.callgrind))
    for workload, broker, tracing, way in CASES:
        if (broker not in args.brokers or workload not in args.workloads
                or way not in args.ways or (way == "mdb-run" and broker == "memory")):
            continue
        child = subprocess.run(
            [sys.executable, "-m", "tests.bench.profile_calls", "--case", workload, broker,
             tracing, way, "--messages", str(args.messages)],
            cwd=ROOT, check=True, capture_output=True, text=True)
        calls = json.loads(child.stdout.strip().splitlines()[-1])
        row = f"| {workload} | {broker} | {way} | {tracing} | "
        row += " | ".join(f"{calls[k]:.1f}" for k in KINDS)
        row += f" | {sum(calls.values()):.1f} |"
        if args.callgrind:
            row += f" {instructions(workload, broker, tracing, way, args.messages):,.0f} |"
        print(row, flush=True)


if __name__ == "__main__":
    main()
