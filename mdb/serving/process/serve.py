"""``mdb run``: the container process, or with ``--workers N`` the supervisor of N of them
(``mdb.serving.process.supervisor``), each worker being ``mdb run`` again with ``--worker
INDEX:FD``. The command line and exit statuses are ``mdb.commands.cli``'s."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from contextlib import AsyncExitStack
from functools import partial
from types import ModuleType
from typing import NoReturn

import anyio
from dependency_injector import containers

from mdb.config.settings import Settings
from mdb.container.container import Container
from mdb.container.report import plan_table, print_status, status_line
from mdb.container.wiring import (
    find_container,
    find_event_callbacks,
    find_listeners,
    import_modules,
    resources,
    wired,
)
from mdb.delivery.timeouts import HandlerCall
from mdb.listeners.listener import ListenerSpec
from mdb.observability import logs, telemetry
from mdb.serving.http.routes import HealthServer, MetricsSource
from mdb.serving.process import code_watch, lifeline
from mdb.serving.process.signals import stop_then_kill
from mdb.serving.process.supervisor import Supervisor
from mdb.serving.process.topology_watch import reload_on_change
from mdb.serving.process.worker_channel import WorkerAssignment, WorkerChannel


async def run(args: argparse.Namespace, settings: Settings) -> int:
    if args.reload:
        return await code_watch.run_reloading(
            partial(_reloaded_command, args), code_watch.directories(args.modules),
            settings.shutdown_grace_period)
    if args.workers > 1:
        return await Supervisor(settings, args.workers, partial(_worker_command, args),
                                args.lifeline).run()
    modules = import_modules(args.modules)
    listeners = find_listeners(modules)
    di = find_container(args.container or settings.container, modules)
    flush_telemetry = telemetry.configure(settings.app)
    try:
        container = await _run(settings, args, modules, listeners, di)
    finally:
        flush_telemetry()
    abandoned = [(d.spec.name, call) for d in container.deployed for call in d.threads.running()]
    if abandoned:
        _exit_abandoning(_label(args), abandoned)
    return 0 if container.stopping else 1


def _exit_abandoning(label: str, abandoned: list[tuple[str, HandlerCall]]) -> NoReturn:
    """End the stopped process at once, though handler threads still run.

    A plain def handler runs on a worker thread, which nothing can stop, and the interpreter
    waits for every non-daemon thread before it exits (anyio's worker threads are not daemons):
    a handler stuck for ever would keep a stopped process alive for ever. By now the container
    has stopped: its connections are closed, telemetry is flushed, and the messages of these
    handlers were never acknowledged, so the broker delivers them again, in doubt. Ending here
    loses nothing but the handlers' unfinished work, which that delivery repeats. (Daemon
    threads would need a thread pool of mdb's own instead of anyio's.) The application's
    ``atexit`` functions do not run.
    """
    now = time.monotonic()
    what = "; ".join(f"listener {name}, message {call.message_id}, running for "
                     f"{now - call.started:.0f} s" for name, call in abandoned)
    print(f"{label}: exiting without waiting for handler threads still running ({what}): "
          "their messages were not acknowledged and come back in doubt", file=sys.stderr,
          flush=True)
    logging.shutdown()  # flushes the log's handlers
    sys.stdout.flush()
    os._exit(0)


def _label(args: argparse.Namespace) -> str:
    """How ``mdb run`` names itself in the lines it prints."""
    if args.worker is None:
        return "mdb"
    return f"mdb: worker {WorkerAssignment.parse(args.worker).index}"


def _worker_command(args: argparse.Namespace, place: WorkerAssignment) -> list[str]:
    """``mdb run`` as the worker in ``place`` of ``args``' supervisor: the same modules and
    options."""
    return [*_command(args), "--worker", str(place)]


def _reloaded_command(args: argparse.Namespace, lifeline: int) -> list[str]:
    """``mdb run`` as the container of ``args``' ``--reload`` watcher, holding ``lifeline``."""
    return [*_command(args), "--lifeline", str(lifeline)]


def _command(args: argparse.Namespace) -> list[str]:
    """``mdb run`` of ``args``' modules and options, as a child process: a worker, or the
    container ``--reload`` restarts (with ``--workers N``, a supervisor)."""
    command = [sys.executable, "-m", "mdb.commands.cli", "run", *args.modules]
    for option in ("config", "app", "server", "container"):
        if getattr(args, option) is not None:
            command += [f"--{option}", str(getattr(args, option))]
    if args.reload and args.workers > 1:
        command += ["--workers", str(args.workers)]
    return command


async def _run(settings: Settings, args: argparse.Namespace, modules: list[ModuleType],
               listeners: list[ListenerSpec], di: containers.Container | None) -> Container:
    """Run the container until it stops, and return it; it stopped because it was asked to
    (a signal, the supervisor) when ``stopping``, else of its own accord (a failure)."""
    place = None if args.worker is None else WorkerAssignment.parse(args.worker)
    channel = None if place is None else await WorkerChannel.open(place)
    label = _label(args)
    async with wired(di, modules, listeners) as handlers, AsyncExitStack() as services:
        container = Container(settings, handlers, on_event=find_event_callbacks(modules))
        if place is None or place.index == 1:  # the workers of a server share one plan
            print(plan_table(container.settings,
                             [(d.spec, d.planned) for d in container.deployed]), flush=True)
        health = None
        if settings.health_port is not None:
            health = HealthServer(container.health, settings.health_host, settings.health_port,
                                  metrics=_metrics(container), act=partial(act, container),
                                  token=settings.control_token)
            health.start()
            print(f"{label}: health on http://{settings.health_host}:{health.port}", flush=True)
            if channel is not None:
                await channel.report(health=f"http://{settings.health_host}:{health.port}")
        try:
            async with anyio.create_task_group() as helpers:
                # The container of --reload is stopped by its watcher, which says why, and a
                # worker by its supervisor, which said what a terminal's Ctrl-C does.
                helpers.start_soon(_stop_on_signals, container,
                                   args.lifeline is None and place is None)
                if args.config is None:
                    helpers.start_soon(_hangups_without_config)
                if channel is not None:
                    helpers.start_soon(channel.watch, container.request_stop)
                if args.lifeline is not None:
                    helpers.start_soon(lifeline.watch_descriptor, args.lifeline,
                                       container.request_stop, label)
                async with anyio.create_task_group() as running:
                    await running.start(partial(
                        container.run,
                        before_handlers=lambda: services.enter_async_context(resources(di))))
                    print(f"{label}: ready (app {settings.app}, server {settings.server})",
                          flush=True)
                    if channel is not None:
                        await channel.report(ready=True)
                    helpers.start_soon(
                        print_status, lambda: status_line(d.stats for d in container.deployed),
                        settings.status_interval, sys.stdout, label)
                    if args.config is not None:
                        helpers.start_soon(reload_on_change, container, args.config,
                                           args.app, args.server)
                helpers.cancel_scope.cancel()
        finally:
            if health is not None:
                health.close()
            if channel is not None:
                await channel.aclose()
    print(f"{label}: stopped; {status_line(d.stats for d in container.deployed)}", flush=True)
    if not container.stopping:
        print(f"{label}: the container stopped without being asked to (no signal, no stop "
              "request): a failure, exit status 1", file=sys.stderr, flush=True)
    return container


def act(container: Container, action: str, name: str) -> int:
    """``POST /listeners/NAME/pause`` or ``.../resume`` (``mdb.serving.http.routes.Act``)."""
    (container.pause if action == "pause" else container.resume)(name)
    return 1


def _metrics(container: Container) -> MetricsSource | None:
    """``/metrics`` for the health port, when ``OTEL_METRICS_EXPORTER=prometheus``
    (docs/metrics.md)."""
    if telemetry.metrics_exporter() != "prometheus":
        return None
    from mdb.serving.http.metrics_page import (
        ContainerMetrics,  # the extra: telemetry.configure checked it is there
    )

    return ContainerMetrics(container)


async def _hangups_without_config() -> None:
    # A process manager's SIGHUP means "reload" (a closed terminal sends it too): without
    # --config there is nothing to read again, and Python's default, the process ending at
    # once with its in-flight messages abandoned, is never what was meant.
    with anyio.open_signal_receiver(signal.SIGHUP) as signals:
        async for _ in signals:
            logs.tell("mdb: SIGHUP: nothing to reload without --config; running on")


async def _stop_on_signals(container: Container, say: bool) -> None:
    def stop(signum: signal.Signals) -> None:
        if say:
            logs.tell(f"mdb: {signum.name}: stopping (signal again to exit now)")
        container.request_stop()

    await stop_then_kill(stop, lambda: container.stopping, "mdb: second signal, exiting now")
