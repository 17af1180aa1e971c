"""``mdb run``: the container process, or with ``--workers N`` the supervisor of N of them
(``mdb.supervisor``), each worker being ``mdb run`` again with ``--worker INDEX:FD``. The
command line and exit statuses are ``mdb.cli``'s."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Callable
from functools import partial
from types import ModuleType

import anyio
from dependency_injector import containers

from mdb import code_reload, logs, tracing
from mdb.container import Container
from mdb.health import HealthServer, Page
from mdb.listener import ListenerSpec
from mdb.reload import reload_on_change
from mdb.report import plan_table, print_status, status_line
from mdb.settings import Settings
from mdb.supervisor import Supervisor
from mdb.wiring import (
    find_container,
    find_event_callbacks,
    find_listeners,
    import_modules,
    wired,
)
from mdb.worker_channel import WorkerChannel, WorkerPlace


async def run(args: argparse.Namespace, settings: Settings) -> int:
    if args.reload:
        return await code_reload.run_reloading(
            _command(args), code_reload.directories(args.modules),
            settings.shutdown_grace_period)
    if args.workers > 1:
        return await Supervisor(settings, args.workers, partial(_worker_command, args)).run()
    modules = import_modules(args.modules)
    listeners = find_listeners(modules)
    di = find_container(args.container or settings.container, modules)
    flush_telemetry = tracing.configure(settings.app)
    try:
        await _run(settings, args, modules, listeners, di)
    finally:
        flush_telemetry()
    return 0


def _worker_command(args: argparse.Namespace, place: WorkerPlace) -> list[str]:
    """``mdb run`` as the worker in ``place`` of ``args``' supervisor: the same modules and
    options."""
    return [*_command(args), "--worker", str(place)]


def _command(args: argparse.Namespace) -> list[str]:
    """``mdb run`` of ``args``' modules and options, as a child process: a worker, or the
    container ``--reload`` restarts (with ``--workers N``, a supervisor)."""
    command = [sys.executable, "-m", "mdb.cli", "run", *args.modules]
    for option in ("config", "app", "server", "container"):
        if getattr(args, option) is not None:
            command += [f"--{option}", str(getattr(args, option))]
    if args.reload and args.workers > 1:
        command += ["--workers", str(args.workers)]
    return command


async def _run(settings: Settings, args: argparse.Namespace, modules: list[ModuleType],
               listeners: list[ListenerSpec], di: containers.Container | None) -> None:
    place = None if args.worker is None else WorkerPlace.parse(args.worker)
    channel = None if place is None else await WorkerChannel.open(place)
    label = "mdb" if place is None else f"mdb: worker {place.index}"
    async with wired(di, modules, listeners) as handlers:
        container = Container(settings, handlers, on_event=find_event_callbacks(modules))
        if place is None or place.index == 1:  # the workers of a server share one plan
            print(plan_table(container.settings,
                             [(d.spec, d.planned) for d in container.deployed]), flush=True)
        health = None
        if settings.health_port is not None:
            health = HealthServer(container.health, settings.health_host, settings.health_port,
                                  metrics=_metrics(container))
            health.start()
            print(f"{label}: health on http://{settings.health_host}:{health.port}", flush=True)
            if channel is not None:
                await channel.tell(health=f"http://{settings.health_host}:{health.port}")
        try:
            async with anyio.create_task_group() as helpers:
                helpers.start_soon(_stop_on_signals, container)
                async with anyio.create_task_group() as running:
                    await running.start(container.run)
                    print(f"{label}: ready (app {settings.app}, server {settings.server})",
                          flush=True)
                    if channel is not None:
                        await channel.tell(ready=True)
                        helpers.start_soon(channel.watch, container.request_stop)
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


def _metrics(container: Container) -> Callable[[str], Page] | None:
    """``/metrics`` for the health port, when ``OTEL_METRICS_EXPORTER=prometheus``
    (docs/metrics.md)."""
    if tracing.metrics_exporter() != "prometheus":
        return None
    from mdb.metrics import ContainerMetrics  # the extra: tracing.configure checked it is there

    return ContainerMetrics(container)


async def _stop_on_signals(container: Container) -> None:
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            if container.stopping:
                logs.tell("mdb: second signal, exiting now", logging.ERROR)
                os._exit(128 + signum)
            logs.tell(f"mdb: {signal.Signals(signum).name}: stopping (signal again to exit now)")
            container.request_stop()
