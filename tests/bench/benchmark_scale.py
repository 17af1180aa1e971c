"""Benchmark: how the cost of a container grows with its work (docs/performance.md, "Scale").

    .venv/bin/python -m tests.bench.benchmark_scale [--listeners 10,100,1000] [--idle 20]
                                                    [--messages 10000]

Three private ActiveMQ brokers (``tests.harness.servers``) and, for each count N of
``--listeners``, ``mdb run`` of an application of N listeners with an empty handler, each on
its own queue partitioned over the three brokers (one member on each: 3N subscriptions), with
a user's defaults but ``reconnect_max_delay = 1`` (so that the time to resubscribe is mdb's,
not the back-off's). Measured from outside, in the container process (``/proc``):

* ready: from the start of the process to its ``ready`` line, and its CPU seconds by then;
* RSS once ready, and its CPU over ``--idle`` seconds doing nothing (heart-beats, timers, the
  status line), as a share of one core;
* resubscribe: one broker killed with SIGKILL and restarted on its data: the seconds from its
  restart (its STOMP port answers) until ``/status`` shows every member subscribed again;
* throughput: ``--messages`` persistent messages spread over the N queues' 3N members, sent
  to the running container by one thread per broker: the rate until ``/status`` counts them
  processed, and the container's CPU per message meanwhile, less what the benchmark's
  ``/status`` requests cost it (measured after, on ``ASKED`` more).

``/status`` is asked twice a second while the resubscription is waited for and once a second
while messages are counted: a snapshot costs the container some 40 µs per listener.

Printed: one row per N, and the growth of each figure from one N to the next beside the
growth of N (linear growth: the same factor). Not a test: CI never times anything.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import NamedTuple

import stomp

from mdb.observability.health import Health
from mdb.serving.http.client import Unreachable, fetch_status
from tests.bench.benchmark_activemq import tree_cpu
from tests.bench.loops import load
from tests.harness.servers.activemq import ActiveMQ
from tests.harness.servers.process import free_port, start_all

ROOT = Path(__file__).resolve().parents[2]
BROKERS = ("a", "b", "c")
WAIT = 600.0  # seconds any one step may take before the benchmark gives up
ASKED = 20  # /status requests whose cost is measured


class Step(NamedTuple):
    """The figures of one count of listeners."""

    listeners: int
    ready: float  # seconds from the process's start to its ready line
    ready_cpu: float  # CPU seconds by then
    rss_mb: float
    idle_cpu: float  # share of one core while idle
    resubscribe: float  # seconds from the killed broker's restart to every member subscribed
    rate: float  # messages per second, N listeners sharing the load
    cpu_us: float  # container CPU µs per message


def application(count: int) -> str:
    """The source of an application of ``count`` listeners, ``scale_0`` to ``scale_<count-1>``,
    with an empty handler each: written out as a user writes them."""
    return "from mdb import listener\n" + "".join(
        f'\n\n@listener("queue:scale_{n}")\nasync def on_scale_{n}(body: bytes) -> None:\n'
        "    pass\n" for n in range(count))


def config(count: int, brokers: list[ActiveMQ], health_port: int) -> str:
    """The TOML settings: the three brokers, and each listener's queue partitioned over them."""
    lines = ['app = "scale"', 'server = "s1"', f"health_port = {health_port}", ""]
    for name, broker in zip(BROKERS, brokers, strict=True):
        lines += [f"[brokers.{name}]", f'url = "{broker.url}"', "reconnect_max_delay = 1.0", ""]
    members = ", ".join(f'{{ broker = "{name}" }}' for name in BROKERS)
    for n in range(count):
        lines += [f'[destinations."queue:scale_{n}"]', 'forwarding = "partitioned"',
                  f"members = [{members}]", ""]
    return "\n".join(lines)


def say(line: str) -> None:
    print(f"{line}; {load()}", flush=True)


def rss_mb(pid: int) -> float:
    """Resident memory of process ``pid`` (``/proc``), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def wait_until(what: str, done: object, timeout: float = WAIT, every: float = 0.05) -> float:
    """Poll ``done()`` until it is true; the monotonic time it was. ``what`` names it when it
    never is."""
    assert callable(done)
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise RuntimeError(f"benchmark_scale: {what} not within {timeout:.0f} s")
        time.sleep(every)
    return time.monotonic()


def status(health_url: str) -> Health | None:
    """What ``/status`` says; None when it does not answer within its deadline (a container
    too busy)."""
    try:
        return fetch_status(health_url, 30)
    except Unreachable:
        return None


def all_subscribed(health_url: str) -> bool:
    """Whether ``/status`` shows every member of every listener subscribed."""
    now = status(health_url)
    return now is not None and all(lh.subscribed == lh.members for lh in now.listeners)


def processed(health_url: str) -> int:
    """How many messages ``/status`` counts processed, asked until it answers."""
    while (now := status(health_url)) is None:
        time.sleep(0.2)
    return sum(lh.processed for lh in now.listeners)


def send(broker: ActiveMQ, listeners: int, messages: int) -> None:
    """``messages`` persistent messages to ``broker``, over every listener's queue in turn (no
    receipt but the DISCONNECT's)."""
    conn = stomp.Connection12([(broker.host, broker.port)])
    conn.connect(broker.username, broker.password, wait=True)
    for n in range(messages):
        conn.send(f"/queue/scale_{n % listeners}", f"message {n}", headers={"persistent": "true"})
    conn.disconnect(receipt="sent")


class Run:
    """``mdb run`` of the application in ``folder`` (``scale_app``, ``scale.toml``), as a user
    starts it; ``ready`` is the seconds from its start to its ready line."""

    def __init__(self, folder: str) -> None:
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("MDB_")},
               "PYTHONPATH": os.pathsep.join([folder, str(ROOT), str(ROOT / "adapters/brokers"),
                                              str(ROOT / "adapters/integrations")])}
        began = time.monotonic()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "mdb.commands.cli", "run", "scale_app", "--config",
             "scale.toml"], cwd=folder, env=env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True)
        self.pid = self.process.pid
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        while not (line := self.lines.get(timeout=WAIT)).startswith("mdb: ready"):
            if self.process.poll() is not None:
                raise RuntimeError(f"mdb run ended: {line}")
        self.ready = time.monotonic() - began

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(WAIT)


def step(brokers: list[ActiveMQ], count: int, idle: float, messages: int) -> Step:
    """Run the application of ``count`` listeners and measure it (module docstring)."""
    with tempfile.TemporaryDirectory(prefix="mdb-scale-") as folder:
        port = free_port()
        health = f"http://127.0.0.1:{port}"
        (Path(folder) / "scale_app.py").write_text(application(count))
        (Path(folder) / "scale.toml").write_text(config(count, brokers, port))
        run = Run(folder)
        try:
            ready, ready_cpu = run.ready, tree_cpu(run.pid)
            wait_until("every member subscribed", lambda: all_subscribed(health))
            time.sleep(2)  # what the start left behind settles
            cpu = tree_cpu(run.pid)
            time.sleep(idle)
            idle_cpu = (tree_cpu(run.pid) - cpu) / idle
            memory = rss_mb(run.pid)
            say(f"{count} listeners: ready in {ready:.1f} s ({ready_cpu:.1f} s CPU), "
                f"{memory:.0f} MB, idle {idle_cpu:.1%} of a core")
            killed = brokers[1]
            killed.kill()
            wait_until("the kill noticed", lambda: not all_subscribed(health), every=0.2)
            killed.restart()
            restarted = time.monotonic()
            resubscribe = wait_until("every member subscribed again",
                                     lambda: all_subscribed(health), every=0.5) - restarted
            say(f"{count} listeners: resubscribed in {resubscribe:.2f} s")
            # Sent to the running container, whose slots are all started: what one message
            # costs, not what starting a slot does. One sender per broker, so that the brokers'
            # disk writes go on side by side and the container is what the rate waits for.
            total = messages // len(brokers) * len(brokers)
            before = processed(health)
            cpu, started = tree_cpu(run.pid), time.monotonic()
            senders = [threading.Thread(target=send, args=(b, count, total // len(brokers)))
                       for b in brokers]
            for sender in senders:
                sender.start()
            asked = []

            def done() -> bool:
                asked.append(processed(health))
                return asked[-1] - before >= total

            finished = wait_until(f"{total} messages processed", done, every=1.0)
            cpu = tree_cpu(run.pid) - cpu
            for sender in senders:
                sender.join()
            # Less what the benchmark's own questions cost the container: a snapshot of 1,000
            # listeners is some 40 ms of its CPU.
            asking = tree_cpu(run.pid)
            for _ in range(ASKED):
                processed(health)
            asking = (tree_cpu(run.pid) - asking) / ASKED
            say(f"{count} listeners: one /status costs {asking * 1000:.0f} ms of CPU")
            rate = total / (finished - started)
            cpu_us = (cpu - len(asked) * asking) / total * 1e6
        finally:
            run.stop()
    return Step(count, ready, ready_cpu, memory, idle_cpu, resubscribe, rate, cpu_us)


def growth(steps: list[Step]) -> list[str]:
    """Each step's figures, then the factor each grew by since the step before."""
    rows = ["| listeners (subscriptions) | ready s (CPU s) | RSS MB | idle CPU "
            "| resubscribe s | msg/s (CPU µs/msg) |", "|---|---:|---:|---:|---:|---:|"]
    for before, now in zip([None, *steps], steps, strict=False):
        rows.append(
            f"| {now.listeners:,} ({3 * now.listeners:,}) | {now.ready:.1f} ({now.ready_cpu:.1f})"
            f" | {now.rss_mb:.0f} | "
            f"{now.idle_cpu:.1%} | {now.resubscribe:.2f} | {now.rate:,.0f} ({now.cpu_us:.0f}) |")
        if before is not None:
            added_kb = (now.rss_mb - before.rss_mb) * 1024 / (now.listeners - before.listeners)
            rows.append(
                f"| growth: {now.listeners / before.listeners:g}x | {now.ready / before.ready:.1f}x"
                f" ({now.ready_cpu / before.ready_cpu:.1f}x) | "
                f"{now.rss_mb / before.rss_mb:.1f}x, {added_kb:.0f} KB an added listener | "
                f"{now.idle_cpu / before.idle_cpu:.1f}x | "
                f"{now.resubscribe / before.resubscribe:.1f}x | {now.rate / before.rate:.2f}x "
                f"({now.cpu_us / before.cpu_us:.2f}x) |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--listeners", default="10,100,1000",
                        help="the counts of listeners, comma-separated")
    parser.add_argument("--idle", type=float, default=20.0,
                        help="seconds the idle CPU is measured over")
    parser.add_argument("--messages", type=int, default=10000)
    args = parser.parse_args()
    counts = [int(n) for n in args.listeners.split(",")]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("benchmark_scale: terminated"))  # closes
    brokers = [ActiveMQ(heap_mb=512) for _ in BROKERS]
    try:
        start_all(brokers)
        say("3 ActiveMQ brokers")
        steps = []
        for count in counts:
            steps.append(step(brokers, count, args.idle, args.messages))
            say(json.dumps(steps[-1]._asdict()))
        print("\n".join(growth(steps)))
    finally:
        for broker in brokers:
            broker.close()


if __name__ == "__main__":
    main()
