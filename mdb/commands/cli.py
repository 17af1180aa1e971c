"""The ``mdb`` command.

``mdb run MODULE... [--config FILE] [--app NAME] [--server NAME] [--container module:Attr]
[--workers N] [--reload]`` runs the container process (``mdb.serving.process.serve``; N of them
under a supervisor, ``mdb.serving.process.supervisor``; restarted when the code changes with
``--reload``, ``mdb.serving.process.code_watch``); ``mdb subscriptions MODULE... [--config FILE]``
prints the subscriptions it would create, connecting to nothing, and ``mdb subscriptions --delete
TOPIC NAME`` deletes an abandoned one on every member of TOPIC; ``mdb send DESTINATION (BODY |
--file PATH) [--header k=v]... [--json | --content-type TYPE] [--key K] [--reply-to DEST]
[--correlation-id ID]`` sends a message by hand (BODY as text; ``--file`` sends the bytes of PATH,
``-`` for stdin; ``--json`` labels a body that parses as JSON ``application/json``), traced as every
send is (``OTEL_*`` variables, as ``mdb run``); ``mdb status [--config FILE] [--url URL]`` asks a
running container's health endpoint (setting ``health_port``) how it is, and ``mdb pause|resume
LISTENER [--url URL] [--token-file FILE]`` pauses or resumes one of its listeners
(``mdb.commands.pausing``); ``mdb console [--config FILE]`` serves the operator's web page of the
containers its ``[console]`` settings list (``mdb.commands.console``); ``mdb asyncapi MODULE...
[--config FILE] [--output FILE]`` writes the listeners' AsyncAPI 3.0 document
(``mdb.commands.asyncapi``); ``mdb db upgrade [--config FILE]`` creates the tables of exactly-once
listeners in every database of ``databases`` (docs/exactly-once.md); ``mdb dlq
list|show|replay|purge (DESTINATION | --module MODULE)`` lists, shows, replays or purges the
messages on error destinations (``mdb.commands.dlq.failed_command``); ``mdb migrate weblogic
INPUT...`` turns an application's message-driven beans into listeners (``mdb.commands.migrate``);
``mdb deploy-files DIRECTORY MODULE [--app NAME] [--force]`` writes an image, compose files and
Kubernetes manifests of the application into DIRECTORY (``mdb.commands.deployment``). ``mdb run``
re-applies the topology of its ``--config`` file when the file changes or on SIGHUP (with
``--workers N``, SIGHUP restarts the workers one at a time).

Exit status (a failure is one line on stderr, ``mdb: configuration error: ...`` or ``mdb: broker
error: ...``, never a traceback):

- 0: a clean stop; ``mdb status``: the container is ready;
- 1: ``mdb status``: the container answered and is not ready (or not live); ``mdb pause``,
  ``mdb resume``: the container refused (no or a wrong token, no such listener); ``mdb run``: the
  container stopped without a signal or a requested stop; ``mdb run --workers N``: a worker
  could not be kept up (its status, when 2 or 3, is the supervisor's); ``mdb dlq replay``: it
  left selected messages on the error destination, each said why (docs/failed-messages.md);
- 2: the configuration cannot be used: a bad setting or argument (argparse's usage errors too),
  a listener module that does not import or raises at import, an invalid selector, a message
  ``mdb dlq show`` does not find or cannot write (``--raw``), a purge not confirmed (the end
  of input at its prompt too), a ``health_port`` that cannot be bound, a ``--file`` that
  cannot be read or holds over 64 MiB, ``mdb send`` to the embedded ``memory://`` broker (it
  lives inside ``mdb run``), a database whose mdb tables are missing, that cannot be reached
  or that refuses the login, a message ``mdb send`` cannot send (a ``--json`` body that is not
  JSON, a NUL byte in a header, headers beyond the bounds of docs/security.md), input ``mdb
  migrate`` cannot migrate, files ``mdb deploy-files`` would write over without ``--force``;
- 3: a broker error: no broker could be reached at startup, or a broker refused what mdb asked
  (a subscription, ``mdb send``'s message, ...); ``mdb status``, ``mdb pause``, ``mdb resume``:
  the health endpoint could not be reached;
- 128+N: a second signal N; 130 (128 + SIGINT): Ctrl-C in any other command (``mdb:
  interrupted``; at ``mdb dlq purge``'s prompt, a no);
- 141 (128 + SIGPIPE): the reader of stdout left (``mdb status | head -1``): no traceback,
  as a command that SIGPIPE ends.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import anyio

from mdb.commands import asyncapi, deployment, migrate, pausing
from mdb.commands.dlq import failed_command
from mdb.commands.subscriptions import delete_subscription
from mdb.config.settings import Settings, command_settings
from mdb.container.report import plan_table, status_report
from mdb.container.wiring import (
    find_listeners,
    import_modules,
)
from mdb.errors import BrokerError, ConfigurationError, EncodeError, sole
from mdb.messages import codec
from mdb.messages.destinations import Destination, Kind
from mdb.messages.headers import CONTENT_TYPE, ID
from mdb.messages.message import MAX_BODY_BYTES, addressed
from mdb.observability import logs, telemetry
from mdb.routing.brokers import Brokers, refuse_embedded
from mdb.routing.links import adapters
from mdb.routing.planning import plan_listeners, slots_per_broker
from mdb.routing.producer import Producer
from mdb.serving.http.client import NotLive, Unreachable, fetch_status, health_url
from mdb.serving.process import serve


def main(argv: Sequence[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    logs.configure()
    try:
        settings = command_settings(args.config, app=args.app, server=args.server)
        try:
            code = anyio.run(args.command, args, settings)
        except BaseExceptionGroup as group:
            raise sole(group) from None
        sys.stdout.flush()  # here, where a reader gone is caught, not as the interpreter ends
    except BrokenPipeError:
        # The reader of stdout left (`mdb status | head -1`, once head has its line): it has
        # what it wanted. End as a command SIGPIPE ends, with no traceback; stdout goes to
        # /dev/null, so that the interpreter's last flush does not fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(128 + signal.SIGPIPE)
    except KeyboardInterrupt:
        # Ctrl-C in a command (``mdb run`` stops in order on its own: mdb.serving.process.signals):
        # the event loop cancelled it at its next await, which aborted its open transactions and
        # closed its connections on the way out.
        logs.tell("mdb: interrupted", logging.ERROR)
        sys.exit(128 + signal.SIGINT)
    except ConfigurationError as exc:
        logs.tell(f"mdb: configuration error: {exc}", logging.ERROR)
        sys.exit(2)
    except EncodeError as exc:
        logs.tell(f"mdb: cannot send: {exc}", logging.ERROR)
        sys.exit(2)
    except BrokerError as exc:
        logs.tell(f"mdb: broker error: {exc}", logging.ERROR)
        sys.exit(3)
    sys.exit(code)


async def send(args: argparse.Namespace, settings: Settings) -> None:
    headers = dict(_header(h) for h in args.header)
    body = _body(args.body, args.file)
    if args.json:
        _check_json(body)
    content_type = codec.JSON if args.json else args.content_type
    if content_type is not None:
        headers[CONTENT_TYPE] = content_type
    destination = Destination.parse(args.destination)
    producer = Producer(settings)  # connects on its first send
    message = addressed(codec.outgoing(body, headers, limits=producer.brokers.header_limits),
                        args.reply_to, args.correlation_id)
    refuse_embedded(settings, destination, f"mdb send {destination}", "a message sent from "
                    "here would reach no container; set brokers.<name>.url to a real broker "
                    "(docs/activemq.md), or send from a handler (ctx.send) or a test "
                    "(mdb.testing: docs/testing.md)")
    flush_telemetry = telemetry.configure(settings.app)
    try:
        async with producer:
            await producer.send_message(destination, message, key=args.key)
    finally:
        flush_telemetry()
    print(f"sent {message.headers[ID]} to {args.destination}")


def _check_json(body: str | bytes) -> None:
    """EncodeError unless ``body`` is a JSON document (``mdb send --json``)."""
    try:
        json.loads(body)
    except UnicodeDecodeError:
        raise EncodeError("mdb send --json: the body is not JSON (not UTF-8)") from None
    except json.JSONDecodeError as exc:  # its text says where, never what the body holds
        raise EncodeError(f"mdb send --json: the body is not JSON ({exc})") from None
    except RecursionError:
        raise EncodeError("mdb send --json: the body is JSON nested too deeply to be read "
                          "(a handler could not decode it either)") from None


async def subscriptions(args: argparse.Namespace, settings: Settings) -> None:
    if args.delete:
        await _delete_subscription(settings, *args.delete)
        return
    if not args.modules:
        raise ConfigurationError("mdb subscriptions: name the MODULE(s) whose subscriptions to "
                                 "print, or give --delete TOPIC NAME")
    plans = plan_listeners(settings, find_listeners(import_modules(args.modules)))
    # Refuse what a container would refuse: a broker address no adapter serves (nothing
    # connects).
    for name in slots_per_broker((spec, p) for spec, planned in plans for p in planned):
        adapters(name, settings.brokers[name], f"{settings.app}.{settings.server}")
    print(plan_table(settings, plans))


async def _delete_subscription(settings: Settings, topic_text: str, name: str) -> None:
    """Delete subscription ``name`` on every member of the topic, one broker at a time."""
    topic = Destination.parse(topic_text)
    if topic.kind is not Kind.TOPIC:
        raise ConfigurationError(f"--delete {topic}: only topics have named subscriptions")
    brokers = Brokers(settings)
    for member in brokers.topology.members(topic):
        await delete_subscription(brokers, f"{settings.app}.{settings.server}.admin", member,
                                  name)
        print(f"deleted subscription {name} of {member}", flush=True)


async def status(args: argparse.Namespace, settings: Settings) -> int:
    """Print what the container's ``/status`` says; 0 when it is ready, 1 when not, 3 when the
    endpoint cannot be reached (or is not an mdb health endpoint)."""
    url = args.url or health_url(settings)
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


async def console(args: argparse.Namespace, settings: Settings) -> int:
    """``mdb console``, whose page and its server are imported by it alone: every other
    command starts without them."""
    from mdb.commands.console import console_command

    return await console_command.command(args, settings)


async def db_upgrade(args: argparse.Namespace, settings: Settings) -> int:
    """Create mdb's tables where they are missing, in each database of the settings."""
    if not settings.databases:
        raise ConfigurationError("no database to upgrade: add [databases.NAME] with its url "
                                 "(docs/exactly-once.md)")
    # Imported by the one command that needs them: every other one starts without SQLAlchemy.
    from mdb.exactly_once import tables
    from mdb.exactly_once.database.database import Database
    from mdb.exactly_once.database.startup import at_startup

    for name, database_settings in settings.databases.items():
        database = Database(name, database_settings)
        try:
            async with at_startup(database):
                created = await tables.upgrade(database.engine)
        finally:
            await database.close()
        print(f"database {name} ({database.shown}): "
              f"{'created ' + ', '.join(created) if created else 'up to date'}")
    return 0


def _body(text: str | None, file: str | None) -> str | bytes:
    """The body of ``mdb send``: BODY as text, or the bytes of ``--file`` (``-``: stdin)."""
    if text is not None and file is None:
        return text
    if text is not None or file is None:
        raise ConfigurationError("mdb send: give the BODY or --file PATH (- for stdin), not both")
    try:
        if file == "-":
            body = sys.stdin.buffer.read(MAX_BODY_BYTES + 1)
        else:
            with open(file, "rb") as source:
                body = source.read(MAX_BODY_BYTES + 1)
    except OSError as exc:
        raise ConfigurationError(f"mdb send --file {file}: {exc.strerror or exc}") from None
    if len(body) > MAX_BODY_BYTES:
        raise ConfigurationError(f"mdb send --file {file}: more than "
                                 f"{MAX_BODY_BYTES >> 20} MiB, the largest body mdb send "
                                 "sends")
    return body


def _header(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ConfigurationError(f"--header {text!r}: write it KEY=VALUE")
    return key, value


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return int(text)


_MODULE_HELP = ("a module of @listener functions, by its dotted name, importable from the "
                "current directory (e.g. svc.listeners)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mdb", description="Message-driven beans for Python")
    parser.add_argument("--version", action="version",
                        version=f"mdb {importlib.metadata.version('mdb')}")
    sub = parser.add_subparsers(required=True, metavar="COMMAND")

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--config", type=Path, help="TOML settings file")
        p.add_argument("--app", help="application name (setting: app)")
        p.add_argument("--server", help="this process's stable name (setting: server)")

    p_run = sub.add_parser(
        "run", help="run the listeners of MODULE(s) in a container",
        epilog="Without --config or MDB_BROKERS__* variables the broker is the embedded "
               "memory:// one, which lives in this process only (mdb send cannot reach it). "
               "Setting health_port (MDB_HEALTH_PORT) serves /health/live, /health/ready and "
               "/status for mdb status; MDB_LOG_LEVEL (default INFO) sets the log level. Every "
               "setting: docs/configuration.md.")
    p_run.add_argument("modules", nargs="+", metavar="MODULE", help=_MODULE_HELP)
    p_run.add_argument("--container", help="dependency-injector container, module:Attribute")
    p_run.add_argument("--workers", type=_positive, default=1, metavar="N",
                       help="run the server as N container processes under a supervisor "
                            "that restarts them (default: 1, this process alone)")
    p_run.add_argument("--reload", action="store_true",
                       help="development: restart the container when a .py file under the "
                            "modules' directories changes (needs mdb[reload])")
    p_run.add_argument("--worker", help=argparse.SUPPRESS)  # INDEX:FD, from the supervisor
    p_run.add_argument("--lifeline", type=int, help=argparse.SUPPRESS)  # FD, from --reload
    common(p_run)
    p_run.set_defaults(command=serve.run)

    p_subs = sub.add_parser(
        "subscriptions", help="print the subscriptions the listeners of MODULE(s) would create")
    p_subs.add_argument("modules", nargs="*", metavar="MODULE", help=_MODULE_HELP)
    p_subs.add_argument("--delete", nargs=2, metavar=("TOPIC", "NAME"),
                        help="delete subscription NAME on every member of TOPIC, with its "
                             "messages (an abandoned subscription; not on ActiveMQ)")
    common(p_subs)
    p_subs.set_defaults(command=subscriptions)

    p_send = sub.add_parser("send", help="send one message")
    p_send.add_argument("destination", help="queue:NAME or topic:NAME")
    p_send.add_argument("body", nargs="?", help="the body, as text (or give --file)")
    p_send.add_argument("--file", metavar="PATH",
                        help="send the bytes of PATH as the body (-: read stdin), for a body "
                             "too large or too binary for the command line; at most 64 MiB")
    p_send.add_argument("--header", action="append", default=[], metavar="KEY=VALUE",
                        help="an application header of the message (repeat it for more); "
                             "mdb_id=ID sends it under that id, e.g. again after an unknown "
                             "outcome (default: a new id)")
    label = p_send.add_mutually_exclusive_group()
    label.add_argument("--json", action="store_true",
                       help="the body is JSON: refused unless it parses, sent as "
                            "application/json (a TextMessage for Java)")
    label.add_argument("--content-type", metavar="TYPE",
                       help="the body's content type (default: text/plain for BODY, "
                            "application/octet-stream for --file)")
    p_send.add_argument("--key", help="choose the member of a distributed destination by this "
                                      "key (default: round robin)")
    p_send.add_argument("--reply-to", metavar="DESTINATION",
                        help="where a reply should go, queue:NAME or topic:NAME (JMSReplyTo)")
    p_send.add_argument("--correlation-id", metavar="ID", help="the JMSCorrelationID")
    common(p_send)
    p_send.set_defaults(command=send)

    p_api = sub.add_parser("asyncapi", help="write the AsyncAPI 3.0 document of the listeners of "
                                             "MODULE(s): their channels, payloads and modes")
    p_api.add_argument("modules", nargs="+", metavar="MODULE")
    p_api.add_argument("--output", "-o", metavar="FILE", help="write it here (default: stdout)")
    p_api.add_argument("--api-version", default="1.0.0",
                       help="the document's info.version (default: 1.0.0)")
    common(p_api)
    p_api.set_defaults(command=asyncapi.command)

    p_status = sub.add_parser("status", help="ask a running container how it is (exit 0: "
                                             "ready, 1: not ready, 3: no answer)")
    p_status.add_argument("--config", type=Path, help="TOML settings file")
    p_status.add_argument("--url", help="its health endpoint, http://HOST:PORT (default: from "
                                        "the settings health_host and health_port)")
    p_status.add_argument("--timeout", type=float, default=5.0,
                          help="seconds to wait for the answer (default: 5)")
    p_status.set_defaults(command=status, app=None, server=None)

    p_console = sub.add_parser(
        "console", help="serve the operator's web page of a fleet of containers (the "
                        "[console] settings: docs/console.md)")
    p_console.add_argument("--config", type=Path,
                           help="TOML settings file with a [console] table (an "
                                "application's own will do)")
    p_console.set_defaults(command=console, app=None, server=None)

    pausing.add_parsers(sub)
    failed_command.add_parser(sub, common)
    migrate.add_parser(sub)

    p_deploy = sub.add_parser(
        "deploy-files", help="write the deployment files of MODULE into DIRECTORY: an image, "
                             "compose files and Kubernetes manifests (docs/deployment.md)")
    p_deploy.add_argument("directory", metavar="DIRECTORY",
                          help="where to write them (made if missing)")
    p_deploy.add_argument("module", metavar="MODULE", help=_MODULE_HELP + ", which the image "
                          "runs; the image holds its top-level package")
    p_deploy.add_argument("--app", help="the application's name (default: MODULE's top-level "
                                        "package)")
    p_deploy.add_argument("--force", action="store_true",
                          help="write over files of an earlier run (default: refuse)")
    p_deploy.set_defaults(command=deployment.command, config=None, server=None)

    p_db = sub.add_parser("db", help="the databases of exactly-once listeners")
    db_sub = p_db.add_subparsers(required=True, metavar="ACTION")
    p_upgrade = db_sub.add_parser("upgrade", help="create mdb's tables (mdb_inbox, mdb_outbox, "
                                                  "mdb_secret) where they are missing")
    p_upgrade.add_argument("--config", type=Path, help="TOML settings file")
    p_upgrade.set_defaults(command=db_upgrade, app=None, server=None)
    return parser


if __name__ == "__main__":
    main()
