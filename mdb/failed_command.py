"""``mdb dlq list|show|replay|purge``: the failed-message workflow of ``mdb.failed`` for an
operator (docs/failed-messages.md).

Each action takes the error destination as ``queue:NAME``, or ``--module MODULE`` for every
error destination of that module's listeners, and the brokers of ``--config``. Bad input (a
destination that is not a queue, a message id that is not there, a selector mdb cannot read,
a purge not confirmed, the embedded ``memory://`` broker, which lives inside ``mdb run``) is a
configuration error: one line, exit 2.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from collections.abc import AsyncGenerator, Callable, Iterable
from contextlib import aclosing
from datetime import timedelta
from pathlib import Path

from mdb import message as m
from mdb.brokers import Brokers, refuse_embedded
from mdb.destinations import Destination
from mdb.errors import ConfigurationError
from mdb.failed import Done, ErrorDestination, Failed, Progress, Selection
from mdb.planning import plan_listeners
from mdb.settings import Settings
from mdb.wiring import find_listeners, import_modules

# The table of ``list``: a heading, the summary's field and a width (0: the rest of the
# line). Fixed, so that rows print as they stream in.
_TABLE = (("ID", "id", 32), ("FROM", "original_destination", 20), ("TYPE", "error_type", 20),
          ("COUNT", "delivery_count", 5), ("FAILED AT (UTC)", "failed_at", 19),
          ("BYTES", "body_bytes", 8), ("ERROR", "error", 0))


async def list_command(args: argparse.Namespace, settings: Settings) -> int:
    """Print the selected messages as they stream in, then the counts per failure type."""
    counts: Counter[str] = Counter()
    if not args.json:
        print(_line(heading for heading, _, _ in _TABLE), flush=True)
    # Closed here, not by the loop's finaliser, when the reader of stdout leaves (`| head`).
    async with aclosing(_listed(args, settings)) as listed:
        async for failed in listed:
            counts[failed.error_type] += 1
            row = failed.summary()
            if args.json:
                print(json.dumps(row, ensure_ascii=False), flush=True)
            else:
                print(_line(_cell(row[name], name) for _, name, _ in _TABLE), flush=True)
    if args.json:
        print(json.dumps({"counts": dict(counts), "total": sum(counts.values())}), flush=True)
    else:
        for error_type, count in counts.most_common():
            print(f"{count:>8}  {error_type}")
        print(f"{sum(counts.values()):>8}  in all")
    return 0


def _line(cells: Iterable[str]) -> str:
    return "  ".join(cell[:width - 1] + "…" if width and len(cell) > width else
                     cell.ljust(width) for cell, (_, _, width) in zip(cells, _TABLE, strict=True)
                     ).rstrip()


def _cell(value: object, name: str) -> str:
    if value is None:
        return "-"
    text = str(value)
    return text[:19].replace("T", " ") if name == "failed_at" else text


async def show_command(args: argparse.Namespace, settings: Settings) -> int:
    """Print one message whole: its failure, its headers, its body (or write it: ``--raw``)."""
    destinations = _destinations(args, settings)
    for destination in destinations:
        try:
            failed = await destination.show(args.id)
        except ConfigurationError:
            continue
        _show(failed, args.raw)
        return 0
    names = ", ".join(str(d.destination) for d in destinations)
    raise ConfigurationError(f"mdb dlq show: no message {args.id!r} on {names}")


def _show(failed: Failed, raw: Path | None) -> None:
    summary = failed.summary()
    for name in ("id", "broker", "original_destination", "listener", "error_type",
                 "delivery_count", "failed_at", "body_bytes"):
        print(f"{name}: {summary[name]}")
    shown = failed.shown_headers()
    for section, header in (("error", m.ERROR_MESSAGE), ("traceback", m.ERROR_TRACEBACK)):
        if lines := failed.shown_lines(header):
            print(f"{section}:")
            print("\n".join(f"  {line}" for line in lines))
    print("headers:")
    for name, value in sorted(shown.items()):
        if name not in (m.ERROR_MESSAGE, m.ERROR_TRACEBACK):
            print(f"  {name}: {value}")
    if raw is not None:
        raw.write_bytes(failed.body)
        print(f"body: {len(failed.body)} bytes written to {raw}")
    else:
        print("body:")
        print("  " + failed.shown_body().replace("\n", "\n  "))


async def replay_command(args: argparse.Namespace, settings: Settings) -> int:
    """Replay the selection, with a progress line on a terminal and a summary line."""
    to = None if args.to is None else Destination.parse(args.to)
    done = Done()
    for destination in _destinations(args, settings):
        found = await destination.replay(_selection(args), to=to, dry_run=args.dry_run,
                                         rate=args.rate, progress=_progress("replayed"))
        done.taken += found.taken
        done.moved_back += found.moved_back
    _end_progress()
    verb = "would replay" if args.dry_run else "replayed"
    print(f"{verb} {done.taken} message(s)"
          + (f"; {done.moved_back} not selected went to the back of the error destination"
             if done.moved_back else ""), flush=True)
    return 0


async def purge_command(args: argparse.Namespace, settings: Settings) -> int:
    """Purge the selection once confirmed (``--yes``, or an answer on a terminal)."""
    selection = _selection(args)
    destinations = _destinations(args, settings)
    counted = 0
    for destination in destinations:
        counted += (await destination.purge(selection, dry_run=True)).taken
    if not counted:
        print("purged 0 message(s)")
        return 0
    if not args.yes:
        names = ", ".join(str(d.destination) for d in destinations)
        if not sys.stdin.isatty():
            raise ConfigurationError(f"mdb dlq purge: {counted} message(s) of {names} "
                                     "selected; confirm with --yes")
        answer = input(f"purge {counted} message(s) of {names}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            raise ConfigurationError("mdb dlq purge: not confirmed, nothing purged")
    purged = 0
    for destination in destinations:
        purged += (await destination.purge(selection, progress=_progress("purged"))).taken
    _end_progress()
    print(f"purged {purged} message(s)", flush=True)
    return 0


async def _listed(args: argparse.Namespace, settings: Settings) -> AsyncGenerator[Failed, None]:
    selection = _selection(args)
    for destination in _destinations(args, settings):
        async with aclosing(destination.list(selection)) as listed:
            async for failed in listed:
                yield failed


def _destinations(args: argparse.Namespace, settings: Settings) -> list[ErrorDestination]:
    """The error destinations the action names: DESTINATION, or those of ``--module``'s
    listeners, each once."""
    if bool(args.destination) == bool(args.module):
        raise ConfigurationError("mdb dlq: name the error destination (queue:NAME) or give "
                                 "--module MODULE, one of the two")
    if args.destination:
        names = [Destination.parse(args.destination)]
    else:
        plans = plan_listeners(settings, find_listeners(import_modules(args.module)))
        names = list(dict.fromkeys(spec.error_destination for spec, _ in plans))
    brokers = Brokers(settings)
    found = [ErrorDestination(brokers, name, f"{settings.app}.{settings.server}.dlq")
             for name in names]
    for name in names:
        refuse_embedded(settings, name, f"mdb dlq {name}", "its error destinations are "
                        "out of reach from here; set brokers.<name>.url to a real broker "
                        "(docs/activemq.md), or read them in a test (mdb.testing: "
                        "docs/failed-messages.md)")
    return found


def _selection(args: argparse.Namespace) -> Selection:
    ids = getattr(args, "ids", None) or ()
    return Selection(listener=args.listener, error_type=args.error_type,
                     older_than=args.older_than, newer_than=args.newer_than,
                     selector=args.selector, ids=frozenset(ids))


def _progress(verb: str) -> Progress | None:
    """A progress line on stderr when it is a terminal, else nothing."""
    if not sys.stderr.isatty():
        return None

    def told(done: int, total: int) -> None:
        width = 30
        filled = width * done // max(total, 1)
        print(f"\r{verb} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}", end="",
              file=sys.stderr, flush=True)
    return told


def _end_progress() -> None:
    if sys.stderr.isatty():
        print(file=sys.stderr, flush=True)


_AGE = re.compile(r"^(\d+)([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def age(text: str) -> timedelta:
    """``30s``, ``15m``, ``2h``, ``7d`` as a duration (argparse type)."""
    found = _AGE.match(text)
    if found is None:
        raise argparse.ArgumentTypeError(f"{text!r}: write an age as a number and s, m, h or d "
                                         "(e.g. 15m, 2h)")
    return timedelta(**{_UNITS[found[2]]: int(found[1])})


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser],
               common: Callable[[argparse.ArgumentParser], None]) -> None:
    """``mdb dlq`` and its actions, on the ``mdb`` command's subparsers."""
    p_dlq = sub.add_parser("dlq", help="the messages on error destinations: list, show, replay, "
                                       "purge (docs/failed-messages.md)")
    actions = p_dlq.add_subparsers(required=True, metavar="ACTION")

    def target(p: argparse.ArgumentParser, selecting: bool = True) -> None:
        p.add_argument("destination", nargs="?", metavar="DESTINATION",
                       help="the error destination, queue:NAME")
        p.add_argument("--module", action="append", metavar="MODULE",
                       help="the error destinations of this module's listeners instead")
        if selecting:
            p.add_argument("--listener", help="only messages this listener failed on")
            p.add_argument("--error-type", metavar="TYPE",
                           help="only this failure type (e.g. ValueError)")
            p.add_argument("--older-than", type=age, metavar="AGE",
                           help="only messages that failed longer ago (15m, 2h, 7d)")
            p.add_argument("--newer-than", type=age, metavar="AGE",
                           help="only messages that failed more recently")
            p.add_argument("--selector", help="only messages whose headers match this JMS "
                                              "selector (evaluated by mdb)")
            p.add_argument("--id", dest="ids", action="append", metavar="ID",
                           help="only this message (repeat it for more)")
        common(p)

    p_list = actions.add_parser("list", help="the messages waiting, without taking them")
    target(p_list)
    p_list.add_argument("--json", action="store_true",
                        help="one JSON object a line, the counts last")
    p_list.set_defaults(command=list_command)

    p_show = actions.add_parser("show", help="one message whole")
    p_show.add_argument("id", metavar="ID", help="its id (the id column of list)")
    target(p_show, selecting=False)
    p_show.add_argument("--raw", type=Path, metavar="FILE",
                        help="write the body's bytes to FILE instead of printing it")
    p_show.set_defaults(command=show_command)

    p_replay = actions.add_parser("replay", help="send the selected messages back to their "
                                                 "original destination")
    target(p_replay)
    p_replay.add_argument("--to", metavar="DESTINATION",
                          help="send them here instead (queue:NAME or topic:NAME)")
    p_replay.add_argument("--dry-run", action="store_true",
                          help="count what would be replayed; change nothing")
    p_replay.add_argument("--rate", type=float, metavar="N",
                          help="at most N messages a second")
    p_replay.set_defaults(command=replay_command)

    p_purge = actions.add_parser("purge", help="remove the selected messages")
    target(p_purge)
    p_purge.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    p_purge.set_defaults(command=purge_command)
