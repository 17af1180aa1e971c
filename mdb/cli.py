"""The ``mdb`` command.

``mdb run MODULE... [--config FILE] [--app NAME] [--server NAME] [--container module:Attr]``
runs the container process; ``mdb subscriptions MODULE... [--config FILE]`` prints the
subscriptions it would create, connecting to nothing, and ``mdb subscriptions --delete TOPIC
NAME`` deletes an abandoned one on every member of TOPIC; ``mdb send DESTINATION BODY
[--header k=v]... [--key K]`` sends a message by hand. Exit status: 0 after a clean stop, 2 for a
configuration error, 3 when a broker could not be reached at startup, 128+N after a second
signal N.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import anyio

from mdb.container import Container
from mdb.destinations import Destination, Kind
from mdb.errors import BrokerError, ConfigurationError
from mdb.links import BrokerLink
from mdb.producer import Producer
from mdb.settings import Settings, load_settings
from mdb.wiring import find_container, find_listeners, import_modules, wired

log = logging.getLogger("mdb")


def main(argv: Sequence[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=os.environ.get("MDB_LOG_LEVEL", "INFO").upper(),
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
    )
    try:
        settings = load_settings(args.config, app=args.app, server=args.server)
        try:
            anyio.run(args.command, args, settings)
        except BaseExceptionGroup as group:
            raise _sole(group) from None
    except ConfigurationError as exc:
        print(f"mdb: configuration error: {exc}", file=sys.stderr)
        sys.exit(2)
    except BrokerError as exc:
        print(f"mdb: broker error: {exc}", file=sys.stderr)
        sys.exit(3)


async def run(args: argparse.Namespace, settings: Settings) -> None:
    modules = import_modules(args.modules)
    listeners = find_listeners(modules)
    di = find_container(args.container or settings.container, modules)
    async with wired(di, modules, listeners) as handlers:
        container = Container(settings, handlers)
        print(plan_table(container), flush=True)
        async with anyio.create_task_group() as helpers:
            helpers.start_soon(_stop_on_signals, container)
            async with anyio.create_task_group() as running:
                await running.start(container.run)
                print(f"mdb: ready (app {settings.app}, server {settings.server})", flush=True)
                helpers.start_soon(_print_status, container, settings.status_interval)
            helpers.cancel_scope.cancel()
    print(f"mdb: stopped; {status_line(container)}", flush=True)


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
    modules = import_modules(args.modules)
    print(plan_table(Container(settings, find_listeners(modules))))


async def _delete_subscription(settings: Settings, topic_text: str, name: str) -> None:
    """Delete subscription ``name`` on every member of the topic, one broker at a time."""
    topic = Destination.parse(topic_text)
    if topic.kind is not Kind.TOPIC:
        raise ConfigurationError(f"--delete {topic}: only topics have named subscriptions")
    for member in settings.topology().members(topic):
        link = BrokerLink(member.broker, settings.brokers[member.broker],
                          f"{settings.app}.{settings.server}.admin")
        try:
            connection = await link.connect()
            await connection.delete_subscription(member.destination, name)
        finally:
            await link.close()
        print(f"deleted subscription {name} of {member}", flush=True)


def plan_table(container: Container) -> str:
    """Listeners → members → subscriptions → brokers, as ``mdb run`` and ``mdb subscriptions``
    print it: one row per subscription (every pool slot of the row attaches to it)."""
    rows = [("listener", "destination", "member", "subscription", "kind", "pool", "broker")]
    for d in container.deployed:
        for p in d.planned:
            links = container.links[p.broker]
            kind = ("shared" if p.shared else "own") + (
                ", durable" if p.request.name and p.request.durable else "")
            rows.append((d.spec.name, str(d.spec.destination), str(p.request.destination),
                         p.name, kind, str(d.spec.options.pool),
                         f"{p.broker} ({links[0].settings.url}, {len(links)} connections)"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)
    return "\n".join(line.rstrip() for line in lines)


def status_line(container: Container) -> str:
    stats = [d.stats for d in container.deployed]
    return (f"processed {sum(s.processed for s in stats)}, "
            f"in flight {sum(s.in_flight for s in stats)}, "
            f"redelivered {sum(s.redelivered for s in stats)}, "
            f"to error destination {sum(s.to_error_destination for s in stats)}, "
            f"rolled back {sum(s.rolled_back for s in stats)}")


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
    return parser


if __name__ == "__main__":
    main()
