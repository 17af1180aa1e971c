"""The ``mdb`` command.

``mdb run MODULE... [--config FILE] [--app NAME] [--server NAME] [--container module:Attr]``
runs the container process; ``mdb subscriptions MODULE... [--config FILE]`` prints the
subscriptions it would create, connecting to nothing, and ``mdb subscriptions --delete TOPIC
NAME`` deletes an abandoned one on every member of TOPIC; ``mdb send DESTINATION BODY
[--header k=v]... [--key K]`` sends a message by hand; ``mdb status [--config FILE] [--url URL]``
asks a running container's health endpoint (setting ``health_port``) how it is. ``mdb run``
re-applies the topology of its ``--config`` file when the file changes or on SIGHUP.

Exit status: 0 after a clean stop (``mdb status``: the container is ready), 1 when ``mdb
status`` found the container not ready, 2 for a configuration error, 3 when no broker could be
reached at startup (``mdb status``: when the health endpoint could not be reached), 128+N after
a second signal N.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import anyio
from dependency_injector import containers

from mdb import tracing
from mdb.brokers import Brokers
from mdb.container import Container
from mdb.destinations import Destination, Kind
from mdb.errors import BrokerError, ConfigurationError
from mdb.health import HealthServer, NotLive, Unreachable, fetch_status
from mdb.links import adapter
from mdb.listener import ListenerSpec
from mdb.planning import plan_listeners, slots_per_broker
from mdb.producer import Producer
from mdb.report import plan_table, status_report
from mdb.settings import Settings, load_settings
from mdb.wiring import (
    find_container,
    find_event_callbacks,
    find_listeners,
    import_modules,
    wired,
)

log = logging.getLogger("mdb")


def main(argv: Sequence[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=os.environ.get("MDB_LOG_LEVEL", "INFO").upper(),
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s%(trace)s",
    )
    for handler in logging.getLogger().handlers:
        handler.addFilter(tracing.TraceIds())
    try:
        settings = load_settings(args.config, app=args.app, server=args.server)
        try:
            code = anyio.run(args.command, args, settings)
        except BaseExceptionGroup as group:
            raise _sole(group) from None
    except ConfigurationError as exc:
        print(f"mdb: configuration error: {exc}", file=sys.stderr)
        sys.exit(2)
    except BrokerError as exc:
        print(f"mdb: broker error: {exc}", file=sys.stderr)
        sys.exit(3)
    sys.exit(code)


async def run(args: argparse.Namespace, settings: Settings) -> None:
    modules = import_modules(args.modules)
    listeners = find_listeners(modules)
    di = find_container(args.container or settings.container, modules)
    flush_telemetry = tracing.configure(settings.app)
    try:
        await _run(settings, args, modules, listeners, di)
    finally:
        flush_telemetry()


async def _run(settings: Settings, args: argparse.Namespace, modules: list[ModuleType],
               listeners: list[ListenerSpec], di: containers.Container | None) -> None:
    async with wired(di, modules, listeners) as handlers:
        container = Container(settings, handlers, on_event=find_event_callbacks(modules))
        print(plan_table(container.settings, [(d.spec, d.planned) for d in container.deployed]),
              flush=True)
        health = None
        if settings.health_port is not None:
            health = HealthServer(container.health, settings.health_host, settings.health_port)
            health.start()
            print(f"mdb: health on http://{settings.health_host}:{health.port}", flush=True)
        try:
            async with anyio.create_task_group() as helpers:
                helpers.start_soon(_stop_on_signals, container)
                async with anyio.create_task_group() as running:
                    await running.start(container.run)
                    print(f"mdb: ready (app {settings.app}, server {settings.server})",
                          flush=True)
                    helpers.start_soon(_print_status, container, settings.status_interval)
                    if args.config is not None:
                        helpers.start_soon(_reload_on_change, container, args)
                helpers.cancel_scope.cancel()
        finally:
            if health is not None:
                health.close()
    print(f"mdb: stopped; {status_line(container)}", flush=True)


# How often ``mdb run`` looks at its --config file for a changed topology.
CONFIG_POLL_INTERVAL = 2.0


async def _reload_on_change(container: Container, args: argparse.Namespace) -> None:
    """Apply the --config file's topology when it changes (polled) or on SIGHUP; a bad one is
    rejected with a message and the running one stays."""
    path: Path = args.config
    seen = _mtime(path)

    async def reload(why: str) -> None:
        try:
            settings = load_settings(path, app=args.app, server=args.server)
            await container.apply(settings)
        except ConfigurationError as exc:
            log.error("%s: topology change rejected, the running one stays: %s", why, exc)

    async def on_sighup() -> None:
        with anyio.open_signal_receiver(signal.SIGHUP) as signals:
            async for _ in signals:
                await reload("SIGHUP")

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(on_sighup)
        while True:
            await anyio.sleep(CONFIG_POLL_INTERVAL)
            if (now := _mtime(path)) != seen:
                seen = now
                await reload(f"{path} changed")


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


async def send(args: argparse.Namespace, settings: Settings) -> None:
    headers = dict(_header(h) for h in args.header)
    async with Producer(settings) as producer:
        message_id = await producer.send(args.destination, args.body, headers, key=args.key)
    print(f"sent {message_id} to {args.destination}")


async def subscriptions(args: argparse.Namespace, settings: Settings) -> None:
    if args.delete:
        await _delete_subscription(settings, *args.delete)
        return
    if not args.modules:
        raise ConfigurationError("mdb subscriptions: name the MODULE(s) whose subscriptions to "
                                 "print, or give --delete TOPIC NAME")
    plans = plan_listeners(settings, find_listeners(import_modules(args.modules)))
    # Refuse what a container would refuse: a broker URL no adapter serves (nothing connects).
    for name in slots_per_broker((spec, p) for spec, planned in plans for p in planned):
        adapter(name, settings.brokers[name], f"{settings.app}.{settings.server}")
    print(plan_table(settings, plans))


async def _delete_subscription(settings: Settings, topic_text: str, name: str) -> None:
    """Delete subscription ``name`` on every member of the topic, one broker at a time."""
    topic = Destination.parse(topic_text)
    if topic.kind is not Kind.TOPIC:
        raise ConfigurationError(f"--delete {topic}: only topics have named subscriptions")
    brokers = Brokers(settings)
    for member in brokers.topology.members(topic):
        link = brokers.link(member.broker, f"{settings.app}.{settings.server}.admin")
        try:
            connection = await link.connect()
            await connection.delete_subscription(member.destination, name)
        finally:
            await link.close()
        print(f"deleted subscription {name} of {member}", flush=True)


async def status(args: argparse.Namespace, settings: Settings) -> int:
    """Print what the container's ``/status`` says; 0 when it is ready, 1 when not, 3 when the
    endpoint cannot be reached (or is not an mdb health endpoint)."""
    url = args.url or _health_url(settings)
    if "://" not in url:
        url = f"http://{url}"
    try:
        health = await anyio.to_thread.run_sync(fetch_status, url, args.timeout)
    except NotLive as exc:
        print(f"mdb at {url}: not live: {exc}", flush=True)
        return 1
    except Unreachable as exc:
        print(f"mdb: {exc}", file=sys.stderr)
        return 3
    print(status_report(health, url), flush=True)
    return 0 if health.ready else 1


def _health_url(settings: Settings) -> str:
    if settings.health_port is None:
        raise ConfigurationError("mdb status: set `health_port` (the container's health "
                                 "endpoint) in the settings, or give --url http://HOST:PORT")
    if settings.health_port == 0:
        raise ConfigurationError("mdb status: `health_port` is 0 (any free port), so the port "
                                 "is not known here; give --url http://HOST:PORT")
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(
        settings.health_host, settings.health_host)
    return f"http://{f'[{host}]' if ':' in host else host}:{settings.health_port}"


def status_line(container: Container) -> str:
    stats = [d.stats for d in container.deployed]
    return (f"processed {sum(s.processed for s in stats)}, "
            f"in flight {sum(s.in_flight for s in stats)}, "
            f"redelivered {sum(s.redelivered for s in stats)}, "
            f"to error destination {sum(s.to_error_destination for s in stats)}, "
            f"rolled back {sum(s.rolled_back for s in stats)}, "
            f"filtered {sum(s.filtered for s in stats)}")


async def _print_status(container: Container, interval: float) -> None:
    while True:
        await anyio.sleep(interval)
        print(f"mdb: {status_line(container)}", flush=True)


async def _stop_on_signals(container: Container) -> None:
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            if container.stopping:
                print("mdb: second signal, exiting now", file=sys.stderr, flush=True)
                os._exit(128 + signum)
            print(f"mdb: {signal.Signals(signum).name}: stopping (signal again to exit now)",
                  file=sys.stderr, flush=True)
            container.request_stop()


def _sole(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one exception a task group wrapped; the group itself when there are several."""
    while isinstance(group, BaseExceptionGroup) and len(group.exceptions) == 1:
        group = group.exceptions[0]  # type: ignore[assignment]
    return group


def _header(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ConfigurationError(f"--header {text!r}: write it KEY=VALUE")
    return key, value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mdb", description="Message-driven beans for Python")
    sub = parser.add_subparsers(required=True, metavar="COMMAND")

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--config", type=Path, help="TOML settings file")
        p.add_argument("--app", help="application name (setting: app)")
        p.add_argument("--server", help="this process's stable name (setting: server)")

    p_run = sub.add_parser("run", help="run the listeners of MODULE(s) in a container")
    p_run.add_argument("modules", nargs="+", metavar="MODULE")
    p_run.add_argument("--container", help="dependency-injector container, module:Attribute")
    common(p_run)
    p_run.set_defaults(command=run)

    p_subs = sub.add_parser(
        "subscriptions", help="print the subscriptions the listeners of MODULE(s) would create")
    p_subs.add_argument("modules", nargs="*", metavar="MODULE")
    p_subs.add_argument("--delete", nargs=2, metavar=("TOPIC", "NAME"),
                        help="delete subscription NAME on every member of TOPIC, with its "
                             "messages (an abandoned subscription; not on ActiveMQ)")
    common(p_subs)
    p_subs.set_defaults(command=subscriptions)

    p_send = sub.add_parser("send", help="send one message")
    p_send.add_argument("destination", help="queue:NAME or topic:NAME")
    p_send.add_argument("body")
    p_send.add_argument("--header", action="append", default=[], metavar="KEY=VALUE")
    p_send.add_argument("--key", help="choose the member of a distributed destination by this "
                                      "key (default: round robin)")
    common(p_send)
    p_send.set_defaults(command=send)

    p_status = sub.add_parser("status", help="ask a running container how it is (exit 0: "
                                             "ready, 1: not ready, 3: no answer)")
    p_status.add_argument("--config", type=Path, help="TOML settings file")
    p_status.add_argument("--url", help="its health endpoint, http://HOST:PORT (default: from "
                                        "the settings health_host and health_port)")
    p_status.add_argument("--timeout", type=float, default=5.0,
                          help="seconds to wait for the answer (default: 5)")
    p_status.set_defaults(command=status, app=None, server=None)
    return parser


if __name__ == "__main__":
    main()
