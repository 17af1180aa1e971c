"""``mdb run --workers N`` without a broker: what it refuses, when it gives up, and how the
supervisor's snapshot of the server is made from its workers'. (On ActiveMQ:
tests/faults/test_workers.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import replace

from mdb.health import (
    BrokerHealth,
    DatabaseHealth,
    Health,
    ListenerHealth,
    StuckHandler,
    WorkerHealth,
)
from mdb.report import status_report
from mdb.supervisor import START_ATTEMPTS, Place, server_health
from tests.contract.test_crash import ROOT
from tests.harness.process import free_port


def mdb_run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {**{k: v for k, v in os.environ.items() if not k.startswith("MDB_")}, **env}
    return subprocess.run([sys.executable, "-m", "mdb.cli", "run", *args], cwd=ROOT,
                          env=environment, capture_output=True, text=True, timeout=300)


def test_workers_on_the_memory_broker_are_refused_in_one_line() -> None:
    done = mdb_run("tests.faults.ledger_app", "--workers", "2")
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
    done = mdb_run("tests.faults.ledger_app", "--workers", "2",
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
    places = [Place(1, state="ready"), Place(2, state="ready", restarts=2)]
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

    restarting = server_health([Place(1, state="ready"), Place(2, state="restarting")],
                               {1: worker()}, False)
    assert restarting.live and not restarting.ready
    assert restarting.workers[1] == WorkerHealth(2, 0, "restarting", 0)
    assert "worker 2 is restarting" in status_report(restarting, "http://x")

    wedged = server_health(places, {1: worker(), 2: None}, False)
    assert not wedged.live and not wedged.ready
    assert not server_health(places, {1: worker(), 2: worker()}, True).ready  # stopping


def test_a_database_is_as_up_as_its_worst_worker_sees_it() -> None:
    places = [Place(1, state="ready"), Place(2, state="ready")]

    def seeing(state: str, outbox: int) -> Health:
        # A worker's readiness already counts its databases; the server checks them again.
        return replace(worker(), databases=(DatabaseHealth("main", state, NOW, outbox, None),))

    both_up = server_health(places, {1: seeing("up", 2), 2: seeing("up", 5)}, False)
    assert both_up.ready and both_up.databases[0].outbox == 5  # one outbox, counted twice
    one_down = server_health(places, {1: seeing("up", 2), 2: seeing("down", 1)}, False)
    assert not one_down.ready and one_down.unready()["databases_down"] == ["main"]
    assert Health.from_json(one_down.to_json()) == one_down
