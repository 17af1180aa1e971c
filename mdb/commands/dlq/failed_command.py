"""``mdb dlq list|show|replay|purge``: the failed-message workflow of ``mdb.commands.dlq.failed``
for an operator (docs/failed-messages.md).

Each action takes the error destination as ``queue:NAME``, or ``--module MODULE`` for every
error destination of that module's listeners, and the brokers of ``--config``; ``--module``
also says where a replay may send a message back (the destinations its listeners consume,
``mdb.commands.dlq.replays.replay_target``). Bad input (a destination that is not a queue, a message
id that is not there, a selector mdb cannot read, a file ``show --raw`` cannot write, a purge not
confirmed, the embedded ``memory://`` broker, which lives inside ``mdb run``) is a
configuration error: one line, exit 2. A replay that left selected messages on the error
destination says why for each, and exits 1. Everything printed that a producer may have
written is escaped (``mdb.observability.redaction.printable``, ``printable_json``).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterable
from contextlib import aclosing
from datetime import timedelta
from pathlib import Path

import anyio

from mdb.commands.dlq.failed import Progress
from mdb.commands.dlq.failed_message import Failed
from mdb.commands.dlq.failed_messages import FailedMessages
from mdb.commands.dlq.replays import Left
from mdb.commands.dlq.selection import Selection
from mdb.config.settings import Settings
from mdb.errors import ConfigurationError
from mdb.messages.destinations import Destination
from mdb.messages.headers import ERROR_MESSAGE, ERROR_TRACEBACK
from mdb.observability.redaction import printable, printable_json

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
    async with aclosing(_failed_messages(args, settings).list(_selection(args))) as listed:
        async for failed in listed:
            counts[failed.error_type] += 1
            row = failed.summary()
            if args.json:
                print(printable_json(row), flush=True)
            else:
                print(_line(_cell(row[name], name) for _, name, _ in _TABLE), flush=True)
    if args.json:
        print(printable_json({"counts": dict(counts), "total": sum(counts.values())}),
              flush=True)
    else:
        for error_type, count in counts.most_common():
            print(f"{count:>8}  {printable(error_type)}")
        print(f"{sum(counts.values()):>8}  in all")
    return 0


def _line(cells: Iterable[str]) -> str:
    return "  ".join(cell[:width - 1] + "…" if width and len(cell) > width else
                     cell.ljust(width) for cell, (_, _, width) in zip(cells, _TABLE, strict=True)
                     ).rstrip()


def _cell(value: object, name: str) -> str:
    if value is None:
        return "-"
    text = printable(str(value))
    return text[:19].replace("T", " ") if name == "failed_at" else text


async def show_command(args: argparse.Namespace, settings: Settings) -> int:
    """Print one message whole: its failure, its headers, its body (or write it: ``--raw``)."""
    try:
        failed = await _failed_messages(args, settings).show(args.id)
    except ConfigurationError as exc:
        raise ConfigurationError(f"mdb dlq show: {exc}") from None
    _show(failed, args.raw)
    return 0


def _show(failed: Failed, raw: Path | None) -> None:
    if raw is not None:  # first: a file it cannot write is the whole answer
        try:
            raw.write_bytes(failed.body)
        except OSError as exc:
            raise ConfigurationError(f"mdb dlq show --raw {raw}: {exc.strerror or exc}") \
                from None
    summary = failed.summary()
    for name in ("id", "broker", "original_destination", "listener", "error_type",
                 "delivery_count", "failed_at", "body_bytes"):
        print(f"{name}: {printable(str(summary[name]))}")
    shown = failed.shown_headers()
    for section, header in (("error", ERROR_MESSAGE), ("traceback", ERROR_TRACEBACK)):
        if lines := failed.shown_lines(header):
            print(f"{section}:")
            print("\n".join(f"  {line}" for line in lines))
    print("headers:")
    for name, value in sorted(shown.items()):
        if name not in (ERROR_MESSAGE, ERROR_TRACEBACK):
            print(f"  {name}: {value}")
    if raw is not None:
        print(f"body: {len(failed.body)} bytes written to {raw}")
    else:
        print("body:")
        print("  " + failed.shown_body().replace("\n", "\n  "))


async def replay_command(args: argparse.Namespace, settings: Settings) -> int:
    """Replay the selection, with a progress line on a terminal, a line for each message it
    leaves (exit 1) and a summary line."""
    to = None if args.to is None else Destination.parse(args.to)
    bar = _Bar("replayed")

    def tell(left: Left) -> None:
        bar.end()
        print(f"left {printable(left.id)}: {left.reason}", flush=True)

    done = await _failed_messages(args, settings).replay(
        _selection(args), to=to, dry_run=args.dry_run, rate=args.rate, progress=bar.progress,
        left=tell)
    bar.end()
    verb = "would replay" if args.dry_run else "replayed"
    print(f"{verb} {done.taken} message(s)"
          + (f"; {done.left} left on the error destination (above)" if done.left else "")
          + (f"; {done.moved_back} not replayed went to the back of the error destination"
             if done.moved_back else ""), flush=True)
    return 1 if done.left else 0


async def purge_command(args: argparse.Namespace, settings: Settings) -> int:
    """Purge the selection once confirmed (``--yes``, or an answer on a terminal)."""
    selection = _selection(args)
    failed = _failed_messages(args, settings)
    counted = (await failed.purge(selection, dry_run=True)).taken
    if not counted:
        print("purged 0 message(s)")
        return 0
    if not args.yes:
        names = ", ".join(str(d.destination) for d in failed.destinations)
        if not sys.stdin.isatty():
            raise ConfigurationError(f"mdb dlq purge: {counted} message(s) of {names} "
                                     "selected; confirm with --yes")
        if not await _confirmed(f"purge {counted} message(s) of {names}? [y/N] "):
            raise ConfigurationError("mdb dlq purge: not confirmed, nothing purged")
    bar = _Bar("purged")
    purged = (await failed.purge(selection, progress=bar.progress)).taken
    bar.end()
    print(f"purged {purged} message(s)", flush=True)
    return 0


async def _confirmed(question: str) -> bool:
    """Whether the operator answers ``question`` yes; the end of input is no. The answer is
    awaited, not read at once: Ctrl-C cancels the command at its next await (``mdb:
    interrupted``), which a blocking read never reaches."""
    print(question, end="", flush=True)
    answer = ""
    try:
        await anyio.wait_readable(sys.stdin)
        answer = sys.stdin.readline()
    finally:
        if not answer:  # Ctrl-C or the end of input: the prompt's line ends here
            print(flush=True)
    return answer.strip().lower() in ("y", "yes")


def _failed_messages(args: argparse.Namespace, settings: Settings) -> FailedMessages:
    """The error destinations the action names: DESTINATION, or those of ``--module``'s
    listeners (``FailedMessages.of``)."""
    if not args.destination and not args.module:
        raise ConfigurationError("mdb dlq: name the error destination (queue:NAME) or give "
                                 "--module MODULE (or both: the error destination, and where "
                                 "a replay may send back)")
    return FailedMessages.of(settings, [args.destination] if args.destination else [],
                             args.module or [])


def _selection(args: argparse.Namespace) -> Selection:
    ids = getattr(args, "ids", None) or ()
    return Selection(listener=args.listener, error_type=args.error_type,
                     older_than=args.older_than, newer_than=args.newer_than,
                     selector=args.selector, ids=frozenset(ids))


class _Bar:
    """A progress line on stderr where it is a terminal (``progress``, else None), ended
    (``end``) before any other line is printed and at the end."""

    def __init__(self, verb: str) -> None:
        self._verb = verb
        self._drawn = False
        self.progress: Progress | None = self._draw if sys.stderr.isatty() else None

    def _draw(self, done: int, total: int) -> None:
        width = 30
        filled = width * done // max(total, 1)
        print(f"\r{self._verb} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}",
              end="", file=sys.stderr, flush=True)
        self._drawn = True

    def end(self) -> None:
        if self._drawn:
            print(file=sys.stderr, flush=True)
            self._drawn = False


_AGE = re.compile(r"([0-9]+)([smhd])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def age(text: str) -> timedelta:
    """``30s``, ``15m``, ``2h``, ``7d`` as a duration (argparse type): ASCII digits, at most
    ``timedelta``'s longest (999,999,999 days)."""
    found = _AGE.fullmatch(text)
    if found is None:
        raise argparse.ArgumentTypeError(f"'{printable(text)}': write an age as a number and "
                                         "s, m, h or d (e.g. 15m, 2h)")
    try:
        return timedelta(**{_UNITS[found[2]]: int(found[1])})
    except (OverflowError, ValueError):  # int() refuses thousands of digits too
        raise argparse.ArgumentTypeError(f"'{printable(text)}': an age is at most 999999999d") \
            from None


def rate(text: str) -> float:
    """Messages a second, a finite number above 0 (argparse type)."""
    try:
        found = float(text)
    except ValueError:
        found = math.nan
    if not math.isfinite(found) or found <= 0:
        raise argparse.ArgumentTypeError(f"'{printable(text)}': a rate is a number of messages "
                                         "a second above 0 (e.g. 50, 0.5)")
    return found


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
                       help="the error destinations of this module's listeners (unless "
                            "DESTINATION is given), and where a replay may send back")
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

    p_replay = actions.add_parser("replay", help="send the selected messages back where "
                                                 "they failed, if a listener consumes there")
    target(p_replay)
    p_replay.add_argument("--to", metavar="DESTINATION",
                          help="send them all here instead (queue:NAME or topic:NAME)")
    p_replay.add_argument("--dry-run", action="store_true",
                          help="count what would be replayed; change nothing")
    p_replay.add_argument("--rate", type=rate, metavar="N",
                          help="at most N messages a second")
    p_replay.set_defaults(command=replay_command)

    p_purge = actions.add_parser("purge", help="remove the selected messages")
    target(p_purge)
    p_purge.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    p_purge.set_defaults(command=purge_command)
