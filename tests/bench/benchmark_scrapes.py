"""Benchmark: clients scraping ``/metrics`` must not slow the container (docs/metrics.md).

    .venv/bin/python -m tests.bench.benchmark_scrapes [--scrapers 20] [--destinations 2000]
                                                     [--seconds 10] [--idle]

``mdb run`` on the embedded broker with ``OTEL_METRICS_EXPORTER=prometheus``: a listener that
replies, and a requester in the same process that sends one request after another
(``Producer.request``: the process is always busy) and writes how many were answered, each
second, to a file; with ``--idle``, no requester. At start the
application sends one message to each of ``--destinations`` queues, which gives the page one
series each (a large page, as a large topology's is). Printed, for a quiet phase and one
with ``--scrapers`` clients asking for ``/metrics`` in a loop (threads of a process of their
own): the requests answered per second, the median and worst time ``/health/live`` took to
answer (asked every 0.2 s by another process, whose clock the scrapers do not hold up), and
the pages served and their size. Not a test: CI never times anything.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from tests.harness.servers.process import free_port

APP = '''
import asyncio
import os
import time

from dependency_injector import containers, providers

from mdb import Context, listener
from mdb.routing.producer import Producer
from mdb.config.settings import load_settings


async def requester():
    async with Producer(load_settings()) as producer:
        for n in range(int(os.environ["DESTINATIONS"])):
            await producer.send(f"queue:filler_{n}", "x")

        async def ask() -> None:
            answered, said = 0, time.monotonic()
            while True:
                await producer.request("queue:ask", "ping", timeout=30)
                answered += 1
                if time.monotonic() - said >= 1:
                    with open(os.environ["COUNTS"], "a") as counts:
                        counts.write(f"{time.monotonic()} {answered}\\n")
                    said = time.monotonic()

        asking = asyncio.get_running_loop().create_task(
            ask() if os.environ["REQUESTS"] == "yes" else asyncio.sleep(0))
        yield None
        asking.cancel()


class Services(containers.DeclarativeContainer):
    requester = providers.Resource(requester)


@listener("queue:ask")
async def on_ask(body: str, ctx: Context) -> None:
    await ctx.reply(body)
'''


def rate(counts: Path, start: float, end: float) -> float:
    """Requests answered per second between ``start`` and ``end`` (monotonic)."""
    rows = [tuple(map(float, line.split())) for line in counts.read_text().splitlines()]
    inside = [(t, n) for t, n in rows if start <= t <= end]
    (t0, n0), (t1, n1) = inside[0], inside[-1]
    return (n1 - n0) / (t1 - t0)


def probe(url: str, seconds: float) -> None:
    """Print how long each ``/health/live`` took, asked every 0.2 s for ``seconds``."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        began = time.perf_counter()
        with urllib.request.urlopen(f"{url}/health/live", timeout=60) as answer:
            answer.read()
        print(time.perf_counter() - began, flush=True)
        time.sleep(0.2)


def scrape(url: str, clients: int, seconds: float) -> None:
    """Ask for ``/metrics`` in a loop from ``clients`` threads for ``seconds``; then print the
    size of each page."""
    end = time.monotonic() + seconds
    sizes: list[int] = []

    def client() -> None:
        while time.monotonic() < end:
            try:
                with urllib.request.urlopen(f"{url}/metrics", timeout=60) as answer:
                    sizes.append(len(answer.read()))
            except OSError:
                continue  # past the endpoint's 64 connections: closed, as a flood should be

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print("\n".join(map(str, sizes)), flush=True)


def phase(url: str, counts: Path, seconds: float, scrapers: int) -> tuple[float, list[float],
                                                                          list[int]]:
    def run(*args: object) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "tests.bench.benchmark_scrapes",
                                 *map(str, args)], stdout=subprocess.PIPE, text=True)

    probing = run("--probe", url, "--seconds", seconds + 1)
    scraping = run("--scrape", url, "--scrapers", scrapers, "--seconds", seconds + 1)
    time.sleep(1)  # the load settles
    start = time.monotonic()
    time.sleep(seconds)
    end = time.monotonic()
    times = [float(line) for line in probing.communicate()[0].split()]
    sizes = [int(line) for line in scraping.communicate()[0].split()]
    return rate(counts, start, end) if counts.exists() else 0.0, times, sizes


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scrapers", type=int, default=20)
    parser.add_argument("--destinations", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--idle", action="store_true",
                        help="no requests: the container does nothing but answer the scrapers")
    parser.add_argument("--probe", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--scrape", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        return probe(args.probe, args.seconds)
    if args.scrape:
        return scrape(args.scrape, args.scrapers, args.seconds)
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "scraped_app.py").write_text(APP)
        counts = Path(folder) / "counts"
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        root = Path(__file__).resolve().parents[2]
        env = {**os.environ, "MDB_HEALTH_PORT": str(port), "MDB_LOG_LEVEL": "WARNING",
               "OTEL_METRICS_EXPORTER": "prometheus", "COUNTS": str(counts),
               "DESTINATIONS": str(args.destinations),
               "REQUESTS": "no" if args.idle else "yes",
               "PYTHONPATH": os.pathsep.join([str(root), str(root / "adapters" / "brokers"),
                                              str(root / "adapters" / "integrations")])}
        process = subprocess.Popen([sys.executable, "-m", "mdb.commands.cli", "run", "scraped_app"],
                                   cwd=folder, env=env, stdout=subprocess.PIPE, text=True)
        try:
            assert process.stdout is not None
            for line in process.stdout:
                if line.startswith("mdb: ready"):
                    break
            while not args.idle and (not counts.exists()
                                     or len(counts.read_text().splitlines()) < 2):
                time.sleep(0.2)
            for name, scrapers in (("quiet", 0), (f"{args.scrapers} scrapers", args.scrapers)):
                answered, times, sizes = phase(url, counts, args.seconds, scrapers)
                page = f", {len(sizes)} pages of {max(sizes) // 1000} KB" if sizes else ""
                print(f"{name}: {answered:.0f} requests/s; /health/live answered "
                      f"{len(times)} times, median {statistics.median(times) * 1000:.1f} ms, "
                      f"worst {max(times) * 1000:.0f} ms{page}", flush=True)
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)


if __name__ == "__main__":
    main()
