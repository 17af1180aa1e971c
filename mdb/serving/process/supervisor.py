"""``mdb run --workers N``: one server run as N container processes under one supervisor.

The workers are ``mdb run`` processes of the same app and server: their listeners attach to the
same subscriptions, so a per-server subscription is shared by the workers as a per-app one is
shared by the servers (each message once per server, by one of its workers). The embedded
memory broker lives in one process, so it cannot be shared: ``check_workers`` refuses it.

The supervisor:

* starts the workers, each in its own session (a terminal's Ctrl-C reaches only the
  supervisor, which forwards it once), with a channel (``mdb.serving.process.worker_channel``) on
  which a worker says where its health endpoint is and when it is ready;
* restarts a worker whose process ended, after a pause of 0.5 s that doubles with each further
  end of that worker within a minute (at most 30 s); each restart is one log line, counted, and
  shown in ``/status``;
* stops, in order, a worker not ready ``READY_TIMEOUT`` seconds after its start, in a line that
  says why (what its health endpoint says is missing): it has ended before it was ready;
* until the server was first ready, gives up, stopping the others and exiting with the worker's
  status, when a worker cannot be started: it ended before it was ready ``START_ATTEMPTS``
  times in a row (a broker that never answers: 3), or once with a configuration error (2,
  which no restart mends);
* once the server was ready, never stops the others for one worker (docs/deployment.md): a
  worker that ends is restarted after its pause whatever its status, and one that ended before
  it was ready ``START_ATTEMPTS`` times in a row is given up, in one line, until the next
  SIGHUP; the server is not ready meanwhile. When every worker is given up, it stops;
* on SIGTERM or SIGINT stops restarting and forwards the signal to every worker, each of which
  stops in the container's order (docs/concepts.md) at the same time; it exits 0 once all have
  ended. A second signal kills the workers (SIGKILL) and exits 128+N at once;
* on SIGHUP restarts the workers one at a time, each stopped in order and started again (which
  reads the settings and the code anew) before the next is stopped, as gunicorn does: to a
  process manager SIGHUP means "reload", which a one-process ``mdb run --config`` does too,
  and one at a time keeps the server taking messages on the other workers meanwhile. A
  worker that does not get ready with the new settings (a bad deploy) ends the round there:
  the workers not yet restarted keep running as they were started. A worker waiting out its
  pause, or given up, is started at once;
* with ``--lifeline FD`` (it is the container of ``mdb run --reload --workers N``), stops as on
  SIGTERM when its watcher is gone (``mdb.serving.process.lifeline``);
* serves the health endpoint (``health_port``) for the whole server: live while every worker
  that runs answers live, ready while every worker runs and is ready (a server short of a
  worker is short of the pool slots its settings promise); ``/metrics`` there holds every
  worker's, labelled ``worker`` (docs/metrics.md).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from functools import partial

import anyio
import anyio.to_thread
from anyio.abc import UNIXSocketStream

from mdb.config.settings import Settings
from mdb.container.report import unready_reasons
from mdb.errors import ConfigurationError
from mdb.observability import logs, telemetry
from mdb.observability.health import ContainerIdentity, Health
from mdb.serving.http.client import NotLive, Unreachable, fetch_pages, fetch_status
from mdb.serving.http.routes import HealthServer, MetricsSource
from mdb.serving.process import lifeline, worker_controls
from mdb.serving.process.children import stop_in_order
from mdb.serving.process.signals import stop_then_kill
from mdb.serving.process.worker_channel import WorkerAssignment, reports
from mdb.serving.process.workers import Worker, named, settle
from mdb.serving.process.workers_health import server_health

log = logging.getLogger("mdb.process.supervisor")

START_ATTEMPTS = 5  # ends before ready, in a row, after which a worker cannot be kept up
READY_TIMEOUT = 300.0  # seconds a worker may take to get ready: the startup probe's five minutes
FIRST_PAUSE, LONGEST_PAUSE, PAUSE_MEMORY = 0.5, 30.0, 60.0  # seconds
ASK_TIMEOUT = 2.0  # seconds a worker's health endpoint may take to answer the supervisor
_CONFIGURATION_ERROR = 2


def check_workers(settings: Settings, workers: int) -> None:
    """ConfigurationError when ``workers`` processes cannot share ``settings``' brokers."""
    for name, broker in settings.brokers.items():
        if workers > 1 and broker.embedded:
            raise ConfigurationError(
                f"mdb run --workers {workers}: broker {name!r} is memory://, which lives in one "
                f"process and cannot be shared by workers; set brokers.{name}.url to a real "
                f"broker, or run one process (--workers 1)")


class Supervisor:
    """Keeps ``count`` workers of ``settings``' server up; ``command(place)`` is the command line
    of the worker in ``place`` (``mdb run ... --worker INDEX:FD``)."""

    def __init__(self, settings: Settings, count: int,
                 command: Callable[[WorkerAssignment], Sequence[str]],
                 lifeline_fd: int | None = None) -> None:
        check_workers(settings, count)
        self.settings = settings
        self._command = command
        self._lifeline_fd = lifeline_fd
        self._places = [Worker(index) for index in range(1, count + 1)]
        self._stopping = anyio.Event()
        self._signal: signal.Signals | None = None
        self._failure = 0
        self._announced = False
        self.identity = ContainerIdentity.here(settings.app, settings.server)
        self._controls = worker_controls.Controls(settings.control_token)

    async def run(self) -> int:
        """Run until a signal stops the workers (0) or a worker cannot be kept up (its exit
        status, or 1)."""
        health = None
        if self.settings.health_port is not None:
            health = HealthServer(
                self.health, self.settings.health_host, self.settings.health_port,
                metrics=self.metrics() if telemetry.metrics_exporter() == "prometheus" else None,
                act=partial(self._controls.act, self._places),
                token=self.settings.control_token)
            health.start()
            print(f"mdb: health on http://{self.settings.health_host}:{health.port}",
                  flush=True)
        try:
            async with anyio.create_task_group() as helpers:
                helpers.start_soon(self._stop_on_signals)
                helpers.start_soon(self._restart_on_hangups)
                if self._lifeline_fd is not None:
                    helpers.start_soon(lifeline.watch_descriptor, self._lifeline_fd,
                                       self.request_stop, "mdb")
                async with anyio.create_task_group() as places:
                    for place in self._places:
                        places.start_soon(self._keep_up, place)
                helpers.cancel_scope.cancel()
        finally:
            if health is not None:
                health.close()
        restarts = sum(p.restarts for p in self._places)
        print(f"mdb: stopped; {len(self._places)} workers, {restarts} "
              f"restart{'' if restarts == 1 else 's'}", flush=True)
        return self._failure

    def request_stop(self, signum: signal.Signals = signal.SIGTERM) -> None:
        """Stop restarting and pass ``signum`` to every worker (each stops in order)."""
        if self._stopping.is_set():
            return
        self._signal = signum
        self._stopping.set()
        for place in self._places:
            if place.wake is not None:
                place.wake.set()
            if place.process is not None and place.process.returncode is None:
                place.state = "stopping"
                if not place.renewing:  # that one stops already: a second signal would kill it
                    place.process.send_signal(signum)

    async def health(self) -> Health:
        """The whole server, from every running worker's own snapshot (asked concurrently)."""
        answers: dict[int, Health | None] = {}

        async def ask(place: Worker, url: str) -> None:
            try:
                answers[place.index] = await anyio.to_thread.run_sync(
                    fetch_status, url, ASK_TIMEOUT)
            except (NotLive, Unreachable):
                answers[place.index] = None

        async with anyio.create_task_group() as asking:
            for place in self._places:
                if place.health_url is not None and place.state in ("ready", "starting"):
                    asking.start_soon(ask, place, place.health_url)
        return server_health(self._places, answers, self._stopping.is_set(), self.identity)

    def metrics(self) -> MetricsSource:
        """``/metrics``: every worker's page, each sample labelled with its ``worker``, and
        the state of each (``mdb.serving.http.metrics_page.SupervisorMetrics``, docs/metrics.md)."""
        from mdb.serving.http import (
            metrics_page,  # the prometheus extra, which the workers' setup checks
        )

        async def ask() -> tuple[Health, dict[int, str]]:
            health = await self.health()
            urls = [(place.index, place.health_url) for place in self._places
                    if place.health_url is not None and place.state in ("ready", "starting")]
            return health, await anyio.to_thread.run_sync(fetch_pages, urls,
                                                          ASK_TIMEOUT)

        return metrics_page.SupervisorMetrics(ask)

    async def _keep_up(self, place: Worker) -> None:
        while not self._stopping.is_set():
            code, was_ready = await self._run_once(place)
            if self._stopping.is_set():
                place.state = "stopped"
                if code != 0:
                    log.warning("worker %d exited with status %s while stopping",
                                place.index, code)
                return
            if place.renewing:
                place.renewing = False
                place.restarts += 1
                logs.tell(f"mdb: SIGHUP: worker {place.index} (pid {place.pid}) exited with "
                          f"status {code}; restart {place.restarts} now")
                continue
            place.ends.append(time.monotonic())
            place.failed_starts = 0 if was_ready else place.failed_starts + 1
            if not was_ready:
                settle(place, code)
                if not self._announced and (code == _CONFIGURATION_ERROR
                                            or place.failed_starts >= START_ATTEMPTS):
                    # The server never started: nothing serves that a stop would interrupt.
                    why = ("a configuration error no restart mends"
                           if code == _CONFIGURATION_ERROR
                           else f"{place.failed_starts} times in a row")
                    logs.tell(f"mdb: worker {place.index} cannot be kept up: it exited with "
                              f"status {code} before it was ready ({why}); stopping the others",
                              logging.ERROR)
                    self._fail(code)
                    place.state = "stopped"
                    return
                if place.failed_starts >= START_ATTEMPTS:
                    await self._give_up(place, code)
                    continue
            pause = self._pause(place)
            place.restarts += 1
            place.state = "restarting"
            logs.tell(f"mdb: worker {place.index} (pid {place.pid}) exited with status {code}; "
                      f"restart {place.restarts} in {pause:g} s")
            with anyio.move_on_after(pause):
                await self._until_woken(place)
        place.state = "stopped"

    async def _give_up(self, place: Worker, code: int) -> None:
        """Leave ``place`` empty until SIGHUP (or the stop) wakes it, the other workers serving
        on; stop the server when none is left."""
        place.state = "failed"
        serving = named([p.index for p in self._places if p.state == "ready"],
                           "keeps serving", "keep serving", "no other worker is ready now")
        logs.tell(f"mdb: worker {place.index} cannot be kept up: it exited with status {code} "
                  f"before it was ready ({place.failed_starts} times in a row); {serving}; "
                  f"SIGHUP starts it again", logging.ERROR)
        if all(p.state == "failed" for p in self._places):
            logs.tell("mdb: no worker is left; stopping", logging.ERROR)
            self._fail(code)
        await self._until_woken(place)
        if not self._stopping.is_set():
            place.failed_starts = 0
            place.restarts += 1

    async def _until_woken(self, place: Worker) -> None:
        """Return when SIGHUP or the stop wakes ``place``."""
        place.wake = anyio.Event()
        try:
            if not self._stopping.is_set():
                await place.wake.wait()
        finally:
            place.wake = None

    def _fail(self, code: int) -> None:
        """Stop the server, to exit with ``code`` (a worker's) as ``mdb run`` would."""
        self._failure = code if code in (2, 3) else 1
        self.request_stop()

    async def _run_once(self, place: Worker) -> tuple[int, bool]:
        """Start the worker of ``place`` and wait until it ends: (exit status, was it ready)."""
        ours, theirs = socket.socketpair()
        ready = False
        try:
            worker = WorkerAssignment(place.index, theirs.fileno())
            place.process = await anyio.open_process(
                list(self._command(worker)), stdin=subprocess.DEVNULL, stdout=None,
                stderr=None, pass_fds=[theirs.fileno()], start_new_session=True,
                env=self._environment())
        finally:
            theirs.close()
        if self._signal is not None:  # the stop began while this worker was being started
            place.process.send_signal(self._signal)
        place.state, place.health_url = "starting", None
        channel = await UNIXSocketStream.from_socket(ours)
        async with channel:
            told = reports(channel)
            with anyio.move_on_after(READY_TIMEOUT) as starting:
                async for item in told:
                    if ready := self._take_report(place, item):
                        break
            if starting.cancelled_caught and not self._stopping.is_set():
                why = await self._why_not_ready(place)
                logs.tell(f"mdb: worker {place.index} (pid {place.pid}) not ready after "
                          f"{READY_TIMEOUT:g} s ({why}); stopping it", logging.ERROR)
                await stop_in_order(place.process, self.settings.shutdown_grace_period)
            elif ready:
                await self._controls.again(place)
                async for item in told:
                    self._take_report(place, item)
            code = await place.process.wait()
        return code, ready

    def _take_report(self, place: Worker, item: dict[str, object]) -> bool:
        """Take in what the worker of ``place`` told (``mdb.serving.process.worker_channel``);
        whether it is that it is ready."""
        if isinstance(item.get("health"), str):
            place.health_url = str(item["health"])
        if item.get("ready") is not True:
            return False
        place.state = "stopping" if self._stopping.is_set() else "ready"
        self._announce_ready()
        settle(place, None)
        return True

    async def _why_not_ready(self, place: Worker) -> str:
        """What the health endpoint of ``place``'s worker says it lacks, in words."""
        if place.health_url is None:
            return ("it has not opened its health endpoint: its listener modules are still "
                    "being imported, or its container built" if self.settings.health_port
                    is not None else "set health_port to hear why from its health endpoint")
        try:
            health = await anyio.to_thread.run_sync(fetch_status, place.health_url,
                                                    ASK_TIMEOUT)
        except (NotLive, Unreachable) as exc:
            return f"its health endpoint does not answer: {exc}"
        return "; ".join(unready_reasons(health))

    def _environment(self) -> dict[str, str] | None:
        """The workers' environment: the supervisor's, with a health endpoint of their own on
        any free port of this host when the supervisor serves one (it asks theirs)."""
        if self.settings.health_port is None:
            return None
        return {**os.environ, "MDB_HEALTH_PORT": "0", "MDB_HEALTH_HOST": "127.0.0.1"}

    def _pause(self, place: Worker) -> float:
        """0.5 s, doubled for each further end of this worker within the last minute."""
        now = time.monotonic()
        while place.ends and place.ends[0] < now - PAUSE_MEMORY:
            place.ends.popleft()
        return min(FIRST_PAUSE * 2.0 ** (len(place.ends) - 1), LONGEST_PAUSE)

    def _announce_ready(self) -> None:
        if not self._announced and all(p.state == "ready" for p in self._places):
            self._announced = True
            print(f"mdb: ready (app {self.settings.app}, server {self.settings.server}, "
                  f"{len(self._places)} workers)", flush=True)

    async def _restart_on_hangups(self) -> None:
        with anyio.open_signal_receiver(signal.SIGHUP) as hangups:
            async for _ in hangups:
                if self._stopping.is_set():
                    continue
                logs.tell(f"mdb: SIGHUP: restarting the {len(self._places)} workers one at a "
                          f"time")
                for place in self._places:
                    if not await self._renew(place):
                        break
                else:
                    logs.tell(f"mdb: SIGHUP: the {len(self._places)} workers restarted")

    async def _renew(self, place: Worker) -> bool:
        """Stop the worker of ``place`` in order, or end its pause or its being given up, and
        wait until the one started in its stead is ready: True. False, the round to stop, when
        it ended before it was ready (the line says so), or when the server stops. A worker
        starting now is waited for as it is: it read the settings anew."""
        if self._stopping.is_set():
            return False
        started = place.started = anyio.Event()
        process = place.process
        if place.state == "ready" and process is not None and process.returncode is None:
            place.renewing, place.state = True, "restarting"
            process.terminate()
        elif place.wake is not None:
            place.wake.set()
        await started.wait()  # or for ever, if the server stops first: then cancelled
        if place.start_status is None:
            return True
        later = named([p.index for p in self._places[place.index:]
                          if p.process is not None and p.process.returncode is None],
                         "keeps running as it was started", "keep running as they were started",
                         "no other worker was to be restarted")
        logs.tell(f"mdb: SIGHUP: worker {place.index} (pid {place.pid}) exited with status "
                  f"{place.start_status} before it was ready: the round stops; {later}",
                  logging.ERROR)
        return False

    async def _stop_on_signals(self) -> None:
        def stop(signum: signal.Signals) -> None:
            logs.tell(f"mdb: {signum.name}: stopping {len(self._places)} workers (signal again "
                      "to kill them)")
            self.request_stop(signum)

        async def kill() -> None:
            running = [p.process for p in self._places
                       if p.process is not None and p.process.returncode is None]
            for process in running:
                process.kill()
            with anyio.move_on_after(ASK_TIMEOUT):  # reaped: no zombie outlives us
                for process in running:
                    await process.wait()

        await stop_then_kill(stop, self._stopping.is_set,
                             "mdb: second signal, killing the workers", kill)
