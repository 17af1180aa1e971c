"""The process's log: its format (``MDB_LOG_FORMAT``: ``text`` or ``json``) and level
(``MDB_LOG_LEVEL``), and the broker libraries' own loggers kept quiet and free of secrets.

With ``MDB_LOG_FORMAT=json`` every line on stderr is one JSON object (``JsonLines``), for a log
shipper: the log records, the one-line messages of ``mdb run`` and its supervisor (``tell``),
Python's warnings and an uncaught exception's traceback. Stdout (the subscription plan, the
ready and status lines) stays text.

Whatever a record holds (a producer's message id, an exception's text), a line of the log is
never taken for another record nor drives the terminal: the text format writes control
characters as escapes (``\\x1b``) and indents every line of a record after its first (a
traceback, a text holding a line feed); the JSON format writes them as JSON escapes, U+2028,
U+2029 and the C1 controls included, which JSON leaves raw (docs/security.md, "Control
characters"). Nor does it show a secret mdb can tell (a URL's password, ``password=...``, a
card number: ``mdb.observability.redaction.mask_secrets``), whoever wrote the record: both formats
mask every record, the traceback with it (docs/security.md, "Secrets").

A broker library logs what mdb already says in one line per broker per outage
(``mdb.listeners.events``): stomp.py alone logs a "could not connect" warning per reconnect attempt
per connection and an "established connection" line per ``mdb send``. An adapter therefore hands its
library's loggers to ``quiet_library``: their records are shown only when mdb logs at DEBUG, and
then masked already, for a handler that is not mdb's (an application's own, in which a test runs
a container).
"""

from __future__ import annotations

import logging
import os
import sys
from datetime import UTC, datetime
from types import TracebackType

from mdb.observability import telemetry
from mdb.observability.redaction import mask_secrets, printable, printable_json

FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s%(trace)s"
CONTINUED = "    "
"""Before each line of a text record after its first: a line that starts with its time is
always a record's first."""


def configure() -> None:
    """Log to stderr at ``MDB_LOG_LEVEL`` (default INFO), in ``MDB_LOG_FORMAT``, with trace ids
    on each line. A format it does not know ends the process (exit status 2) in one line."""
    json_lines = _json_asked()
    logging.basicConfig(level=os.environ.get("MDB_LOG_LEVEL", "INFO").upper(), format=FORMAT)
    for handler in logging.getLogger().handlers:
        handler.addFilter(telemetry.TraceIds())
        handler.setFormatter(JsonLines() if json_lines else TextLines(FORMAT))
    if json_lines:
        logging.captureWarnings(True)
        sys.excepthook = _log_uncaught


def _json_asked() -> bool:
    value = os.environ.get("MDB_LOG_FORMAT", "text").strip().lower() or "text"
    if value not in ("text", "json"):
        # The log is not set up yet: this one line is all the process says.
        print(f"mdb: configuration error: MDB_LOG_FORMAT={value!r}: mdb knows 'text' and "
              f"'json'", file=sys.stderr, flush=True)
        sys.exit(2)
    return value == "json"


class TextLines(logging.Formatter):
    """A record in ``FORMAT``, its secrets masked (``mdb.observability.redaction.mask_secrets``),
    its control characters escaped but line feeds and tabs
    (``mdb.observability.redaction.printable``), each line after its first indented by
    ``CONTINUED``."""

    def format(self, record: logging.LogRecord) -> str:
        text = printable(mask_secrets(super().format(record)), lines=True)
        return text.replace("\n", "\n" + CONTINUED)


class JsonLines(logging.Formatter):
    """One JSON object per record: ``timestamp`` (ISO 8601, UTC), ``level``, ``logger``,
    ``message``, ``trace_id`` and ``span_id`` while a span is current (the message being
    handled: ``telemetry.TraceIds``), ``exception`` with the traceback when there is one (the
    record's exception, or the traceback ``with_traceback`` gave it); the message, the
    exception and the stack with their secrets masked
    (``mdb.observability.redaction.mask_secrets``)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "timestamp": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": mask_secrets(record.getMessage()),
        }
        trace_id = getattr(record, "trace_id", "")
        if trace_id:
            line["trace_id"], line["span_id"] = trace_id, getattr(record, "span_id", "")
        if record.exc_info:
            line["exception"] = mask_secrets(self.formatException(record.exc_info))
        elif record.exc_text:
            line["exception"] = mask_secrets(record.exc_text)
        if record.stack_info:
            line["stack"] = mask_secrets(self.formatStack(record.stack_info))
        return printable_json(line)


def with_traceback(logger: logging.Logger, level: int, traceback: str, message: str,
                   *args: object) -> None:
    """Log ``message % args`` with ``traceback``, a traceback mdb formatted itself (a handler's,
    with the failure text of docs/security.md in place of the exception's own), as the
    record's exception: every formatter shows it as it shows a traceback, after the message
    (``JsonLines``: its ``exception``), never inside the message."""
    if logger.isEnabledFor(level):
        path, line, function, _ = logger.findCaller(stacklevel=2)
        record = logger.makeRecord(logger.name, level, path, line, message, args, None,
                                   function)
        record.exc_text = traceback or None
        logger.handle(record)


def tell(text: str, level: int = logging.WARNING) -> None:
    """Say ``text`` on stderr, as ``mdb run`` says what the operator must know at once (a
    signal, a worker's end, why it stops): its secrets masked, its control characters escaped
    but line feeds and tabs, each line after the first indented by ``CONTINUED`` unless it is
    already (the invalid settings' ``  setting ...``), so that no line of it passes for one of
    mdb's own (``mdb: ready``); or a record of logger ``mdb`` at ``level`` in JSON."""
    if any(isinstance(h.formatter, JsonLines) for h in logging.getLogger().handlers):
        logging.getLogger("mdb").log(level, text)
        return
    first, *more = printable(mask_secrets(text), lines=True).split("\n")
    indented = [line if line[:1] in ("", " ", "\t") else CONTINUED + line for line in more]
    print("\n".join([first, *indented]), file=sys.stderr, flush=True)


def _log_uncaught(kind: type[BaseException], exc: BaseException,
                  traceback: TracebackType | None) -> None:
    logging.getLogger("mdb").critical("uncaught %s", kind.__name__,
                                      exc_info=(kind, exc, traceback))


class LibraryRecords(logging.Filter):
    """Lets a library's record through only while the ``mdb`` logger is enabled for DEBUG, with
    its secrets masked."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not logging.getLogger("mdb").isEnabledFor(logging.DEBUG):
            return False
        record.msg = mask_secrets(record.getMessage())
        record.args = None
        return True


def quiet_library(name: str, *rewrites: logging.Filter) -> None:
    """Quiet logger ``name`` (a broker library's) as the module docstring says; idempotent.
    ``rewrites`` are the adapter's own filters for what only it can read in the library's records
    (e.g. where a frame's body is): they see each record as logged, before it is masked."""
    logger = logging.getLogger(name)
    if not any(isinstance(f, LibraryRecords) for f in logger.filters):
        for rewrite in rewrites:
            logger.addFilter(rewrite)
        logger.addFilter(LibraryRecords())
