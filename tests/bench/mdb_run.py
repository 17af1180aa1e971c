"""mdb's rows of the broker benchmarks as a user gets them: ``mdb run tests.bench.bench_app`` in
a process of its own with the documented defaults (the health endpoint on, as
docs/quickstart.md sets it, for ``mdb status``; the log at INFO on stderr, the status line
every 5 s on stdout, both read by this process as a log collector would; ``OTEL_*`` unset, so
no tracing set up, unless the workload sets the SDK's providers itself; mdb's ``prefetch``).

The rate and CPU per message are the process's (and its workers', ``--workers N``) over a
window in full flow: from the first ``/status`` read after the ready line to the first that
counts 90% of the queue's messages processed, the CPU read from ``/proc`` beside each
``/status``. ``/status`` is read rarely (about ten times a run: each read is an HTTP request
the process answers, on the container's loop), more often as the window's end nears.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, NamedTuple

from mdb.serving.http.client import fetch_status
from tests.harness.servers.process import BrokerProcess, free_port

ROOT = Path(__file__).resolve().parents[2]


class Reading(NamedTuple):
    at: float  # perf_counter
    processed: int
    cpu: float  # seconds, the process and its children


def mdb_run(broker: BrokerProcess, queue: str, count: int, workload: str, pool: int = 1,
            prefetch: int | None = None, workers: int = 1, tracing: str = "",
            ) -> tuple[float, float]:
    """``mdb run tests.bench.bench_app`` on ``queue`` (preloaded with ``count`` messages) doing
    ``workload`` with ``pool`` and ``prefetch``, ``--workers``; ``tracing``: ``sampled-out`` or
    ``recorded`` sets the SDK's tracer provider (``tests.bench.bench_app``). Msg/s and CPU µs
    per message, as ``tests.bench.loops.Measured``."""
    port = free_port()
    with _started(broker, queue, workload, port, tracing, {
            "BENCH_POOL": str(pool), "BENCH_PREFETCH": str(prefetch or "")}, workers) as said:
        return _window(f"http://127.0.0.1:{port}", said.pid, count, said.lines)


def start_up(broker: BrokerProcess, queue: str) -> float:
    """The CPU seconds ``mdb run tests.bench.bench_app`` (W1, ``queue`` empty) takes from its
    start to its ready line: the imports, the settings, the plan, the connections."""
    with _started(broker, queue, "W1", free_port(), "", {}) as said:
        return tree_cpu(said.pid)


def profiled(broker: BrokerProcess, queue: str, count: int, workload: str, tracing: str,
             path: Path) -> None:
    """``mdb run tests.bench.bench_app`` with pool 1 until its profile of ``count`` messages
    is written to ``path`` (``$BENCH_PROFILE``)."""
    with _started(broker, queue, workload, free_port(), tracing,
                  {"BENCH_PROFILE": f"{count}:{path}"}) as said:
        deadline = time.monotonic() + 600
        while not path.exists():
            if time.monotonic() > deadline or said.process.poll() is not None:
                raise RuntimeError("no profile from mdb run:\n" + "".join(said.lines))
            time.sleep(0.1)


def stopped(broker: BrokerProcess, queue: str, count: int, workload: str, tracing: str,
            wrapper: list[str]) -> None:
    """``wrapper`` (valgrind and its options) running ``mdb run tests.bench.bench_app`` with
    pool 1 until it stops by itself, after ``count`` messages (``$BENCH_STOP_AFTER``)."""
    with _started(broker, queue, workload, free_port(), tracing,
                  {"BENCH_STOP_AFTER": str(count)}, wrapper=wrapper) as said:
        if said.process.wait(1800) != 0:
            raise RuntimeError("mdb run failed:\n" + "".join(said.lines))


class Started(NamedTuple):
    process: subprocess.Popen[str]
    lines: list[str]  # what it said before its ready line

    @property
    def pid(self) -> int:
        return self.process.pid


@contextmanager
def _started(broker: BrokerProcess, queue: str, workload: str, port: int, tracing: str,
             bench: dict[str, str], workers: int = 1, wrapper: tuple[str, ...] | list[str] = (),
             ) -> Iterator[Started]:
    """``mdb run`` of the benchmark's app (run by ``wrapper``), ready, its health endpoint on
    ``port``; ``bench``: more of the app's ``BENCH_*`` variables. Ended (SIGTERM) at the end
    of the block."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("MDB_", "OTEL_"))},
           "MDB_BROKERS__DEFAULT__URL": broker.url, "MDB_APP": "bench",
           "MDB_SERVER": f"s{port}", "MDB_HEALTH_PORT": str(port), "BENCH_QUEUE": queue,
           "BENCH_WORKLOAD": workload, "BENCH_TRACING": tracing, **bench}
    process = subprocess.Popen(
        [*wrapper, sys.executable, "-m", "mdb.commands.cli", "run", "tests.bench.bench_app",
         "--workers", str(workers)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    try:
        assert process.stdout is not None
        said = _ready(process.stdout)
        threading.Thread(target=_drain, args=(process.stdout,), daemon=True).start()
        yield Started(process, said)
    finally:
        if process.poll() is None:
            process.terminate()
            process.wait(60)


def _ready(out: IO[str]) -> list[str]:
    said: list[str] = []
    for line in out:
        if line.startswith("mdb: ready"):
            return said
        said.append(line)
    raise RuntimeError("mdb run ended before it was ready:\n" + "".join(said))


def _drain(out: IO[str]) -> None:
    for _ in out:
        pass


def _window(health: str, pid: int, count: int, said: list[str]) -> tuple[float, float]:
    end = int(count * 0.9)
    first = last = _reading(health, pid)
    while last.processed < end:
        rate = (last.processed - first.processed) / (last.at - first.at or 1)
        left = (end - last.processed) / rate if rate else 0.1
        time.sleep(min(max(left / 2, 0.005), 1.0))
        last = _reading(health, pid)
        if last.at - first.at > 600:
            raise RuntimeError(f"mdb run processed {last.processed} of {count} in 10 min:\n"
                               + "".join(said))
    done = last.processed - first.processed
    return done / (last.at - first.at), (last.cpu - first.cpu) / done * 1e6


def _reading(health: str, pid: int) -> Reading:
    at = time.perf_counter()
    processed = sum(lh.processed for lh in fetch_status(health, 10).listeners)
    return Reading(at, processed, tree_cpu(pid))


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
