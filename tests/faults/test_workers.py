"""``mdb run --workers 2`` on ActiveMQ: the workers of one server share its subscriptions, a
worker killed with SIGKILL is replaced and nothing is lost, SIGHUP restarts them one at a time
and nothing is lost, and SIGTERM stops them all.

The ledger app's lines carry the pid of the worker that processed each message; the supervisor's
``/status`` (its health endpoint, on a free port) names the workers and counts their restarts.
"""

from __future__ import annotations

import os
import signal
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import pytest
from prometheus_client.parser import text_string_to_metric_families

from mdb import Producer, Settings
from mdb.messages import codec
from mdb.messages.destinations import Destination
from mdb.messages.headers import ID
from mdb.observability.health import Health
from mdb.serving.http.client import fetch_status
from tests.harness.apps.in_process import unique
from tests.harness.processes.cli import mdb, one_line
from tests.harness.processes.fleet import (
    WAIT,
    Fleet,
    LedgerProcess,
    fault_settings,
    fleet,
    left_behind,
)
from tests.harness.servers.process import BrokerProcess, alive
from tests.harness.traffic.ledger import PER_SERVER
from tests.harness.traffic.load_producer import LoadProducer

pytestmark = pytest.mark.activemq

WORKERS = ("--workers", "2")
ONE_LISTENER = {"LEDGER_QUEUE": ""}  # the topic's only (no queue listener)


def status(process: LedgerProcess) -> Health:
    assert process.health is not None, "the supervisor printed no health URL"
    return fetch_status(process.health, 10)


def wait_status(process: LedgerProcess, condition: Callable[[Health], bool], what: str
                ) -> Health:
    """Ask the supervisor's /status until ``condition`` holds (fail after ``WAIT``)."""
    deadline = time.monotonic() + WAIT
    while True:
        health = status(process)
        if condition(health):
            return health
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {WAIT} s for {what}; /status says {health}")
        time.sleep(0.1)  # a poll interval of a condition with a deadline, not a wait for time


@pytest.fixture
def processes(activemq: BrokerProcess) -> Iterator[Fleet]:
    """Container processes on a topic of the test's own, on the session's ActiveMQ."""
    topic = unique("workers")
    with fleet(fault_settings([activemq.url], topic), topic) as made:
        yield made


def start_server(processes: Fleet, app: str, delay: str, **env: str) -> LedgerProcess:
    [server] = processes.start(app, ["s1"], PER_SERVER, args=WORKERS,
                               env={"LEDGER_DELAY": delay, "MDB_HEALTH_PORT": "0",
                                    **ONE_LISTENER, **env})
    return server


def processed_per_worker(process: LedgerProcess) -> dict[str, float]:
    """The supervisor's /metrics, read with Prometheus's parser: messages processed by each
    worker (its ``worker`` label)."""
    with urllib.request.urlopen(f"{process.health}/metrics", timeout=10) as answer:
        page = answer.read().decode()
    return {sample.labels["worker"]: sample.value
            for family in text_string_to_metric_families(page) for sample in family.samples
            if sample.name == "mdb_listener_messages_total"
            and sample.labels["mdb_outcome"] == "processed"}


def test_the_workers_of_a_server_share_its_subscription_and_stop_on_sigterm(
        activemq: BrokerProcess, processes: Fleet) -> None:
    app = unique("app")
    server = start_server(processes, app, "0.02", OTEL_METRICS_EXPORTER="prometheus")
    health = wait_status(server, lambda h: h.ready, "a ready server")
    assert [(w.index, w.state, w.restarts) for w in health.workers] == [
        (1, "ready", 0), (2, "ready", 0)]
    assert processed_per_worker(server) == {"1": 0, "2": 0}
    workers = {w.pid for w in health.workers}
    assert len(workers) == 2 and server.process.pid not in workers
    [listener] = health.listeners  # one subscription per worker's pool slot and member
    assert (listener.members, listener.subscribed) == (2, 2)

    told = anyio.run(send, processes.settings, processes.topic, 40)
    assert processes.drain(told)
    deadline = time.monotonic() + WAIT
    while sum((counted := processed_per_worker(server)).values()) < 40:
        assert time.monotonic() < deadline, counted
        time.sleep(0.1)  # a poll interval of a condition with a deadline
    assert all(counted.values()), counted  # both workers took part
    processes.stop()  # SIGTERM to the supervisor: exit status 0 after "mdb: stopped"
    assert not any(alive(pid) for pid in workers)
    done = processes.done(app)
    assert sorted(e["id"] for e in done) == sorted(told)  # each message once by the server
    assert not any(e["redelivered"] for e in done)
    by_worker = Counter(e["pid"] for e in done)
    assert set(by_worker) == workers, by_worker  # by one of its workers, both taking part
    assert left_behind([activemq], processes, told) == {}


def test_a_worker_killed_with_sigkill_is_replaced_and_nothing_is_lost(
        activemq: BrokerProcess, processes: Fleet) -> None:
    app = unique("app")
    server = start_server(processes, app, "0.1")
    health = wait_status(server, lambda h: h.ready, "a ready server")
    victim = health.workers[0].pid
    # Sent once the server subscribed: a topic keeps nothing for a subscription to come.
    producer = processes.stack.enter_context(LoadProducer(processes.settings, processes.topic))
    producer.wait_told(10)
    # Kill the worker while it has a message in hand (started, not done).
    processes.wait(lambda f: any(e["pid"] == victim for e in f.events("start")),
                   "the first worker at work")
    os.kill(victim, signal.SIGKILL)
    health = wait_status(
        server, lambda h: h.ready and h.workers[0].pid not in (0, victim),
        "the killed worker replaced")
    assert [(w.index, w.state, w.restarts) for w in health.workers] == [
        (1, "ready", 1), (2, "ready", 0)]
    replacement = health.workers[0].pid
    producer.wait_told(10)
    processes.wait(lambda f: any(e["pid"] == replacement for e in f.events("done")),
                   "the replacement at work")
    producer.stop()
    told = producer.told
    assert processes.drain(told), processes.verdicts(told)
    processes.stop()
    [verdict] = processes.verdicts(told).values()
    assert verdict.ok, verdict  # nothing lost, every repeat flagged redelivered
    in_hand = ({e["id"] for e in processes.events("start") if e["pid"] == victim}
               - {e["id"] for e in processes.done(app) if e["pid"] == victim})
    assert in_hand  # the kill took work with it, which came back flagged:
    assert all(e["redelivered"] for e in processes.done(app) if e["id"] in in_hand)
    assert left_behind([activemq], processes, told) == {}


def test_sighup_restarts_the_workers_one_at_a_time_and_nothing_is_lost(
        activemq: BrokerProcess, processes: Fleet) -> None:
    app = unique("app")
    server = start_server(processes, app, "0.05")
    before = {w.pid for w in wait_status(server, lambda h: h.ready, "ready").workers}
    producer = processes.stack.enter_context(LoadProducer(processes.settings, processes.topic))
    producer.wait_told(10)
    processes.wait(lambda f: {e["pid"] for e in f.events("done")} >= before,
                   "both workers at work")
    server.process.send_signal(signal.SIGHUP)
    health = wait_status(
        server, lambda h: h.ready and all(w.restarts == 1 for w in h.workers),
        "each worker restarted once")
    after = {w.pid for w in health.workers}
    assert not after & before and 0 not in after
    assert not any(alive(pid) for pid in before)
    producer.wait_told(10)
    processes.wait(lambda f: {e["pid"] for e in f.events("done")} >= after,
                   "both new workers at work")
    producer.stop()
    told = producer.told
    assert processes.drain(told), processes.verdicts(told)
    processes.stop()  # the supervisor outlived its SIGHUP and still stops with status 0
    [verdict] = processes.verdicts(told).values()
    assert verdict.ok, verdict  # each worker stopped in order: nothing lost, repeats flagged
    assert left_behind([activemq], processes, told) == {}


async def send(settings: Settings, topic: str, count: int) -> list[str]:
    sent = []
    async with Producer(settings) as producer:
        for n in range(count):
            message = codec.outgoing(f"m{n}", None)
            await producer.send_message(Destination.parse(f"topic:{topic}"), message)
            sent.append(message.headers[ID])
    return sent


def test_ctrl_c_is_told_once_by_the_supervisor(activemq: BrokerProcess,
                                               processes: Fleet) -> None:
    """A terminal's Ctrl-C reaches the supervisor alone, which passes it on to its workers: it
    alone says what happens, and what a second one would do (docs/concepts.md, "Exit
    status")."""
    server = start_server(processes, unique("app"), "0.02")
    wait_status(server, lambda h: h.ready, "a ready server")
    server.process.send_signal(signal.SIGINT)
    assert server.process.wait(timeout=WAIT) == 0
    told = [line for line in server.log if "SIGINT" in line]
    assert told == ["mdb: SIGINT: stopping 2 workers (signal again to kill them)"], told


def test_a_second_signal_kills_the_workers(activemq: BrokerProcess, processes: Fleet) -> None:
    app = unique("app")
    [server] = processes.start(app, ["s1"], PER_SERVER, args=WORKERS, env={
        "LEDGER_DELAY": "600", "MDB_HEALTH_PORT": "0", "MDB_SHUTDOWN_GRACE_PERIOD": "600",
        **ONE_LISTENER})
    workers = {w.pid for w in wait_status(server, lambda h: h.ready, "ready").workers}
    anyio.run(send, processes.settings, processes.topic, 1)
    processes.wait(lambda f: bool(f.events("start")), "a handler at work (for 600 s)")
    server.process.send_signal(signal.SIGTERM)
    # The worker without work stops at once; the other waits for its handler.
    wait_status(server, lambda h: all(w.state in ("stopping", "stopped") for w in h.workers)
                and any(w.state == "stopping" for w in h.workers), "the workers stopping")
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(timeout=WAIT) == 128 + signal.SIGTERM
    assert not any(alive(pid) for pid in workers)


def test_mdb_pause_and_resume_reach_every_worker(activemq: BrokerProcess, processes: Fleet,
                                                 tmp_path: Path) -> None:
    token, secret = tmp_path / "token", tmp_path / "secret"
    token.write_text("a-token-of-32-characters-or-so-1\n")
    secret.write_text("the-application-s-identity-secret")  # its ids, known by the workers
    app = unique("app")
    server = start_server(processes, app, "0.02", MDB_CONTROL_TOKEN_FILE=str(token),
                          MDB_IDENTITY_SECRET_FILE=str(secret))
    wait_status(server, lambda h: h.ready, "a ready server")
    assert server.health is not None
    wrong = tmp_path / "wrong"
    wrong.write_text("a-token-of-32-characters-or-so-2")
    refused = mdb("pause", "on_entry", "--url", server.health, "--token-file", str(wrong),
                  cwd=tmp_path)
    assert refused.returncode == 1 and "token" in one_line(refused.stderr)
    assert not any(lh.paused for lh in status(server).listeners)

    paused = mdb("pause", "on_entry", "--url", server.health, "--token-file", str(token),
                 cwd=tmp_path)
    assert paused.returncode == 0, paused.stderr
    assert paused.stdout.decode().strip() == f"paused on_entry on {app}/s1 (2 workers)"
    # Each worker's slot ended its subscription: none of the two is subscribed.
    health = wait_status(server, lambda h: h.listeners[0].subscribed == 0, "both paused")
    assert health.ready and health.listeners[0].paused
    # A worker started again (after a crash) is paused again as soon as it is ready.
    victim = health.workers[0].pid
    os.kill(victim, signal.SIGKILL)
    health = wait_status(server, lambda h: h.ready and h.workers[0].pid not in (0, victim)
                         and h.listeners[0].subscribed == 0, "the replacement paused")
    assert health.listeners[0].paused
    producing = fault_settings([activemq.url], processes.topic, identity_secret_file=secret)
    told = anyio.run(send, producing, processes.topic, 20)  # kept for the server
    assert processes.done(app) == []

    resumed = mdb("resume", "on_entry", "--url", server.health, "--token-file", str(token),
                  cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.decode().strip() == f"resumed on_entry on {app}/s1 (2 workers)"
    assert processes.drain(told), processes.verdicts(told)
    processes.stop()
    done = processes.done(app)
    assert sorted(e["id"] for e in done) == sorted(told)  # each once
    assert left_behind([activemq], processes, told) == {}
