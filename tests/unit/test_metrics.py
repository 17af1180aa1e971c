"""``/metrics`` on the health port: a running ``mdb run`` scraped and read with Prometheus's own
text parser, before, while and after it handles messages (docs/metrics.md)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from mdb.observability.health import Health, ListenerHealth, WorkerHealth
from mdb.serving.http.metrics_page import WorkerMetrics, exposition, health_families
from tests.harness.processes.cli import until_ready
from tests.harness.servers.process import free_port

# A listener whose messages the test starts with SIGUSR1 (three are sent: "hold", "ok", "ok");
# "hold" stays in its handler until SIGUSR2. The signals are the one way into the memory broker,
# which lives in the process. A second listener fails its one message.
APP = '''
import asyncio
import signal

from dependency_injector import containers, providers

from mdb import listener
from mdb.routing.producer import Producer
from mdb.config.settings import load_settings

released = asyncio.Event()
feeds: set[asyncio.Task[None]] = set()


async def feed() -> None:
    async with Producer(load_settings()) as producer:
        for body in ("hold", "ok", "ok"):
            await producer.send("queue:work", body)
        await producer.send("queue:failing", "boom")


async def signals():
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, lambda: feeds.add(loop.create_task(feed())))
    loop.add_signal_handler(signal.SIGUSR2, released.set)
    yield None


class Services(containers.DeclarativeContainer):
    signals = providers.Resource(signals)


@listener("queue:work", pool=2)
async def on_work(body: str) -> None:
    if body == "hold":
        await released.wait()


@listener("queue:failing", redelivery={"limit": 0})
async def on_failing(body: str) -> None:
    raise ValueError(body)
'''

WAIT = 30.0  # seconds before a wait fails: a guard against hanging, not a timing


class Page:
    def __init__(self, text: str) -> None:
        self.text = text
        self.samples: list[Sample] = [
            sample for family in text_string_to_metric_families(text)
            for sample in family.samples]

    def value(self, name: str, **labels: str) -> float:
        """The sum of ``name``'s samples whose labels include ``labels``."""
        found = [s.value for s in self.samples
                 if s.name == name and labels.items() <= s.labels.items()]
        assert found, f"no sample {name} {labels} in:\n{self.text}"
        return sum(found)


def scrape(url: str, accept: str = "") -> Page:
    request = urllib.request.Request(f"{url}/metrics", headers={"Accept": accept})
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 200
        assert answer.headers["Content-Type"].startswith("text/plain")
        return Page(answer.read().decode())


def until(url: str, check: Callable[[Page], bool]) -> Page:
    """Scrape until ``check`` holds (the page has no event to wait on)."""
    deadline = time.monotonic() + WAIT
    while not check(page := scrape(url)):
        assert time.monotonic() < deadline, f"never true:\n{page.text}"
        time.sleep(0.05)
    return page


@contextmanager
def running(tmp_path: Path, **env: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    (tmp_path / "metered_app.py").write_text(APP)
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "mdb.commands.cli", "run", "metered_app"], cwd=tmp_path,
        env={**os.environ, "MDB_HEALTH_PORT": str(port), "MDB_LOG_LEVEL": "WARNING", **env},
        stdout=subprocess.PIPE, text=True)
    try:
        until_ready(process)  # after the plan and the health URL
        yield process, f"http://127.0.0.1:{port}"
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0


def test_metrics_move_as_messages_are_handled(tmp_path: Path) -> None:
    with running(tmp_path, OTEL_METRICS_EXPORTER="prometheus") as (process, url):
        work = {"listener": "on_work"}
        # Counted once, in the listener's Stats, read by OpenTelemetry (mdb.listener.messages).
        done = {"mdb_listener": "on_work", "mdb_outcome": "processed"}
        before = scrape(url)
        assert before.value("mdb_ready") == 1
        assert before.value("mdb_broker_state", broker="default", state="up") == 1
        assert before.value("mdb_broker_state", broker="default", state="down") == 0
        assert before.value("mdb_listener_slots", **work) == 2
        assert before.value("mdb_listener_slots_busy", **work) == 0
        assert before.value("mdb_listener_messages_total", **done) == 0
        assert before.value("process_resident_memory_bytes") > 0

        process.send_signal(signal.SIGUSR1)
        holding = until(url, lambda page: page.value("mdb_listener_messages_total", **done) == 2
            and page.value("mdb_listener_in_flight", **work) == 1
            and page.value("mdb_listener_messages_total", mdb_listener="on_failing",
                           mdb_outcome="to_error_destination") == 1)
        assert holding.value("mdb_listener_slots_busy", **work) == 1
        assert holding.value("mdb_listener_oldest_unsettled_seconds", **work) > 0
        # The messaging semantic conventions' metrics, through OpenTelemetry's exporter.
        queue = {"messaging_destination_name": "queue:work", "messaging_system": "memory"}
        assert holding.value("messaging_client_sent_messages_total", **queue) == 3
        assert holding.value("messaging_client_consumed_messages_total", **queue) == 2
        assert holding.value("messaging_process_duration_seconds_count", **queue) == 2
        failing = {"messaging_destination_name": "queue:failing", "error_type": "ValueError"}
        assert holding.value("messaging_client_consumed_messages_total", **failing) == 1
        # A message that did not fail has no error_type, not an empty one.
        assert not [s for s in holding.samples if "" in s.labels.values()]
        assert holding.value("mdb_pool_usage", **{"mdb_listener": "on_work"}) == 1
        assert holding.value("mdb_broker_connected", mdb_broker="default") == 1

        process.send_signal(signal.SIGUSR2)
        after = until(url, lambda page: page.value("mdb_listener_messages_total", **done) == 3)
        assert after.value("mdb_listener_in_flight", **work) == 0
        assert after.value("mdb_listener_slots_busy", **work) == 0
        assert after.value("mdb_listener_oldest_unsettled_seconds", **work) == 0
        assert after.value("messaging_client_consumed_messages_total", **queue) == 3

        openmetrics = urllib.request.Request(
            f"{url}/metrics", headers={"Accept": "application/openmetrics-text"})
        with urllib.request.urlopen(openmetrics, timeout=10) as answer:
            assert answer.headers["Content-Type"].startswith("application/openmetrics-text")
            assert answer.read().decode().endswith("# EOF\n")


def test_without_the_prometheus_exporter_there_is_no_metrics_page(tmp_path: Path) -> None:
    with running(tmp_path) as (_, url), pytest.raises(urllib.error.HTTPError) as refused:
        scrape(url)
    assert refused.value.code == 404


def test_the_supervisor_labels_each_workers_samples_with_its_place() -> None:
    class Snapshot(Collector):
        def __init__(self, health: Health) -> None:
            self.health = health

        def collect(self) -> Iterator[Metric]:
            return health_families(self.health)

    def worker(in_flight: int) -> str:
        health = Health(live=True, ready=True, listeners=(
            ListenerHealth("on_work", members=1, subscribed=1, in_flight=in_flight,
                           processed=0, paused=in_flight > 5),),
            events={"connection-lost": in_flight})
        return exposition(Snapshot(health), "")[1].decode()

    server = Health(live=True, ready=False, workers=(
        WorkerHealth(1, 101, "ready", 0), WorkerHealth(2, 0, "restarting", 3)))
    _, body = exposition(WorkerMetrics(server, {1: worker(4), 2: worker(7)}), "")
    page = Page(body.decode())
    assert page.value("mdb_listener_in_flight", listener="on_work", worker="1") == 4
    assert page.value("mdb_listener_in_flight", listener="on_work", worker="2") == 7
    assert page.value("mdb_listener_in_flight", listener="on_work") == 11
    assert page.value("mdb_events_total", kind="connection-lost", worker="2") == 7
    assert page.value("mdb_listener_paused", listener="on_work", worker="1") == 0
    assert page.value("mdb_listener_paused", listener="on_work", worker="2") == 1
    assert page.value("mdb_worker_ready", worker="1") == 1
    assert page.value("mdb_worker_ready", worker="2") == 0
    assert page.value("mdb_worker_restarts_total", worker="2") == 3
    # One family per name, as the format wants: both workers' samples under one TYPE line.
    assert body.decode().count("# TYPE mdb_listener_in_flight gauge") == 1
