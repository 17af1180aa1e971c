"""``mdb run --workers N`` without a broker: what it refuses, when it gives up, how it keeps a
server serving when one worker cannot be kept up (over stand-in workers,
``tests.unit.stand_in_workers``), and how the supervisor's snapshot of the server is made from
its workers'. (On ActiveMQ: tests/faults/test_workers.py.)"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import IO

from mdb.container.report import status_report
from mdb.observability.health import (
    BrokerHealth,
    DatabaseHealth,
    Health,
    ListenerHealth,
    StuckHandler,
    WorkerHealth,
)
from mdb.serving.process.supervisor import START_ATTEMPTS
from mdb.serving.process.workers import Worker
from mdb.serving.process.workers_health import server_health
from tests.harness.processes.container_process import ROOT
from tests.harness.servers.process import alive, free_port


def mdb_run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {**{k: v for k, v in os.environ.items() if not k.startswith("MDB_")}, **env}
    return subprocess.run([sys.executable, "-m", "mdb.commands.cli", "run", *args], cwd=ROOT,
                          env=environment, capture_output=True, text=True, timeout=300)


def test_workers_on_the_memory_broker_are_refused_in_one_line() -> None:
    done = mdb_run("tests.harness.apps.topic_ledger_app", "--workers", "2")
    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert line.startswith("mdb: configuration error: mdb run --workers 2: broker 'default' "
                           "is memory://")
    assert "brokers.default.url" in line and "--workers 1" in line


def test_a_worker_with_a_configuration_error_stops_the_server_at_once() -> None:
    done = mdb_run("no_such_listener_module", "--workers", "2",
                   MDB_BROKERS__DEFAULT__URL=f"stomp+activemq://127.0.0.1:{free_port()}")
    assert done.returncode == 2, done.stderr
    assert "cannot import listener module 'no_such_listener_module'" in done.stderr
    assert "; restart 1 in" not in done.stderr  # no restart mends it
    assert "before it was ready (a configuration error no restart mends)" in done.stderr


def test_a_worker_that_never_gets_ready_ends_the_server_after_its_start_attempts() -> None:
    done = mdb_run("tests.harness.apps.topic_ledger_app", "--workers", "2",
                   MDB_BROKERS__DEFAULT__URL=f"stomp+activemq://127.0.0.1:{free_port()}")
    assert done.returncode == 3, done.stderr  # the worker's own status: no broker answered
    gave_up = [line for line in done.stderr.splitlines() if "cannot be kept up" in line]
    assert len(gave_up) == 1 and f"({START_ATTEMPTS} times in a row)" in gave_up[0]
    worker = gave_up[0].split()[2]
    restarts = [line for line in done.stderr.splitlines()
                if line.startswith(f"mdb: worker {worker} (pid ")]
    assert len(restarts) == START_ATTEMPTS - 1  # one line per restart, counted
    assert restarts[-1].endswith(f"restart {START_ATTEMPTS - 1} in 4 s")
    assert done.stdout.splitlines()[-1].startswith("mdb: stopped; 2 workers")


NOW = time.time()


def worker(up: bool = True, processed: int = 5) -> Health:
    return Health(
        live=True, ready=up,
        brokers=(BrokerHealth("main", "up" if up else "down", NOW),),
        listeners=(ListenerHealth("on_order", 1, 1 if up else 0, 1, processed),),
        events={"connection-lost": 0 if up else 1})


def test_the_server_is_ready_when_every_worker_is() -> None:
    places = [Worker(1, state="ready"), Worker(2, state="ready", restarts=2)]
    health = server_health(places, {1: worker(processed=3), 2: worker(processed=4)}, False)
    assert health.live and health.ready
    assert health.listeners == (ListenerHealth("on_order", 2, 2, 2, 7),)
    assert [(w.index, w.state, w.restarts) for w in health.workers] == [
        (1, "ready", 0), (2, "ready", 2)]
    assert Health.from_json(health.to_json()) == health

    down = server_health(places, {1: worker(), 2: worker(up=False)}, False)
    assert down.live and not down.ready
    assert [b.state for b in down.brokers] == ["down"]  # as up as its worst worker sees it
    assert down.events == {"connection-lost": 1}
    assert down.unready()["listeners_short"] == [
        {"name": "on_order", "subscribed": 1, "members": 2}]
    assert "worker 2 is not ready" in status_report(down, "http://x")

    stuck = Health(live=True, ready=False, listeners=(
        ListenerHealth("on_order", 1, 1, 1, 0, slots=1, stuck=(StuckHandler("m1", 40.0),)),))
    both = server_health(places, {1: stuck, 2: worker()}, False)
    assert both.listeners[0].slots == 1 and both.listeners[0].stuck == stuck.listeners[0].stuck
    assert Health.from_json(both.to_json()) == both
    assert ["on_order", "m1", "40s"] in [
        line.split() for line in status_report(both, "http://x").splitlines()]

    restarting = server_health([Worker(1, state="ready"), Worker(2, state="restarting")],
                               {1: worker()}, False)
    assert restarting.live and not restarting.ready
    assert restarting.workers[1] == WorkerHealth(2, 0, "restarting", 0)
    assert "worker 2 is restarting" in status_report(restarting, "http://x")

    wedged = server_health(places, {1: worker(), 2: None}, False)
    assert not wedged.live and not wedged.ready
    assert not server_health(places, {1: worker(), 2: worker()}, True).ready  # stopping


def test_the_copies_each_worker_settled_unrun_add_up_and_mdb_status_shows_them() -> None:
    places = [Worker(1, state="ready"), Worker(2, state="ready")]
    copies = [Health(live=True, ready=True, listeners=(
        ListenerHealth("on_order", 1, 1, 0, 3, already_processed=n),)) for n in (1, 2)]
    health = server_health(places, {1: copies[0], 2: copies[1]}, False)
    assert health.listeners[0].already_processed == 3
    assert Health.from_json(health.to_json()) == health
    table = [line.split() for line in status_report(health, "http://x").splitlines()]
    assert ["listener", "subscribed", "in", "flight", "processed", "already", "processed",
            "handler", "p50/p99"] in table
    assert ["on_order", "2/2", "0", "6", "3", "-"] in table
    # None yet: no column, as the status line shows the count only once there is one.
    assert "already" not in status_report(worker(), "http://x")


def test_a_database_is_as_up_as_its_worst_worker_sees_it() -> None:
    places = [Worker(1, state="ready"), Worker(2, state="ready")]

    def seeing(state: str, outbox: int) -> Health:
        # A worker's readiness already counts its databases; the server checks them again.
        return replace(worker(), databases=(DatabaseHealth("main", state, NOW, outbox, None),))

    both_up = server_health(places, {1: seeing("up", 2), 2: seeing("up", 5)}, False)
    assert both_up.ready and both_up.databases[0].outbox == 5  # one outbox, counted twice
    one_down = server_health(places, {1: seeing("up", 2), 2: seeing("down", 1)}, False)
    assert not one_down.ready and one_down.unready()["databases_down"] == ["main"]
    assert Health.from_json(one_down.to_json()) == one_down


WAIT = 60.0  # seconds before a wait fails: a guard against hanging, not a timing


class StandIns:
    """A supervisor over stand-in workers (``tests.unit.stand_in_workers``), its output read
    line by line."""

    def __init__(self, folder: Path, process: subprocess.Popen[str]) -> None:
        self.folder = folder
        self.process = process
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        assert process.stdout is not None and process.stderr is not None
        for stream in (process.stdout, process.stderr):
            threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self.lines.put(line.rstrip("\n"))

    def line(self, text: str) -> str:
        """The next line of the supervisor's output that holds ``text``."""
        while True:
            try:
                line = self.lines.get(timeout=WAIT)
            except queue.Empty:
                raise AssertionError(f"no line with {text!r} in {WAIT} s; "
                                     f"seen: {self.seen}") from None
            self.seen.append(line)
            if text in line:
                return line

    def behave(self, index: int, what: str) -> None:
        (self.folder / str(index)).write_text(what)

    def pids(self, index: int) -> list[int]:
        path = self.folder / f"{index}.pids"
        return [int(pid) for pid in path.read_text().split()] if path.exists() else []

    def started(self, index: int, times: int) -> int:
        """The pid of the worker started ``times``-th in place ``index``, once it is."""
        deadline = time.monotonic() + WAIT
        while len(pids := self.pids(index)) < times:
            assert time.monotonic() < deadline, f"worker {index} started {len(pids)} times"
            time.sleep(0.01)  # a poll interval of a condition with a deadline
        return pids[times - 1]


@contextmanager
def stand_ins(folder: Path, *behaviours: str, ready_timeout: float | None = None,
              ) -> Iterator[StandIns]:
    """A supervisor over one stand-in worker per ``behaviours``; SIGTERM at the end."""
    for index, what in enumerate(behaviours, 1):
        (folder / str(index)).write_text(what)
    command = [sys.executable, "-m", "tests.unit.stand_in_workers", "supervise", str(folder),
               str(len(behaviours))]
    process = subprocess.Popen(command + ([] if ready_timeout is None else [str(ready_timeout)]),
                               cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    try:
        yield StandIns(folder, process)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        process.wait(timeout=WAIT)


def test_a_bad_deploy_on_sighup_leaves_the_old_workers_serving(tmp_path: Path) -> None:
    with stand_ins(tmp_path, "ready", "ready") as supervised:
        supervised.line("mdb: ready")
        first, second = supervised.started(1, 1), supervised.started(2, 1)
        supervised.behave(1, "exit 2")  # the new settings do not load
        supervised.behave(2, "exit 2")
        supervised.process.send_signal(signal.SIGHUP)
        stopped = supervised.line("the round stops")
        assert stopped.startswith("mdb: SIGHUP: worker 1 (pid ")
        assert "exited with status 2 before it was ready" in stopped
        assert "worker 2 keeps running as it was started" in stopped
        given_up = supervised.line("cannot be kept up")
        assert f"{START_ATTEMPTS} times in a row" in given_up
        assert "worker 2 keeps serving" in given_up and "SIGHUP" in given_up
        assert not alive(first) and alive(second) and supervised.process.poll() is None

        supervised.behave(1, "ready")  # the settings mended: SIGHUP tries again
        supervised.behave(2, "ready")
        supervised.process.send_signal(signal.SIGHUP)
        supervised.line("SIGHUP: the 2 workers restarted")
        assert not alive(second)
        supervised.process.send_signal(signal.SIGTERM)
        assert supervised.process.wait(timeout=WAIT) == 0


def test_a_worker_killed_again_and_again_leaves_the_others_serving(tmp_path: Path) -> None:
    with stand_ins(tmp_path, "ready", "ready") as supervised:
        supervised.line("mdb: ready")
        other = supervised.started(2, 1)
        supervised.behave(1, "hang")  # its replacements never get ready
        for start in range(1, START_ATTEMPTS + 2):  # the ready one, then its replacements
            os.kill(supervised.started(1, start), signal.SIGKILL)
        given_up = supervised.line("cannot be kept up")
        assert given_up.startswith("mdb: worker 1 cannot be kept up: it exited with status -9 "
                                   f"before it was ready ({START_ATTEMPTS} times in a row)")
        assert "worker 2 keeps serving" in given_up
        restarts = [line for line in supervised.seen if line.startswith("mdb: worker 1 (pid ")]
        assert len(restarts) == START_ATTEMPTS  # each end but the last: a restart, counted
        assert alive(other) and supervised.process.poll() is None
        supervised.process.send_signal(signal.SIGTERM)
        assert supervised.process.wait(timeout=WAIT) == 0
        assert not alive(other)


def test_a_worker_that_never_gets_ready_is_stopped_with_a_line_saying_why(
        tmp_path: Path) -> None:
    with stand_ins(tmp_path, "hang", "ready", ready_timeout=5) as supervised:
        waited = supervised.line("not ready after")
        pid = supervised.started(1, 1)
        assert waited == (f"mdb: worker 1 (pid {pid}) not ready after 5 s (broker main is "
                          f"down); stopping it")
        supervised.behave(1, "exit 9")
        assert supervised.line(f"(pid {pid}) exited").endswith("restart 1 in 0.005 s")
        # At startup, it counts as a worker that ended before it was ready: the server cannot
        # start.
        given_up = supervised.line("cannot be kept up")
        assert f"({START_ATTEMPTS} times in a row); stopping the others" in given_up
        assert supervised.process.wait(timeout=WAIT) == 1
