"""Lines a producer, a handler or a file name cannot forge (docs/security.md, "Control
characters"): an ``mdb_id`` and an exception's text holding line breaks, ANSI escapes and
Unicode line separators, in the text log and the JSON log of ``mdb run``, in ``mdb status``,
and in the names of the files ``mdb run --reload`` saw change."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from mdb.observability import logs
from mdb.observability.health import Health, ListenerHealth, StuckHandler
from mdb.observability.redaction import printable
from mdb.serving.http.routes import HealthServer

# A forged record, then ANSI's "clear the screen", then what str.splitlines, JavaScript and
# some log viewers take for line breaks.
FORGED = ("\n2026-01-01 00:00:00,000 ERROR   mdb.container: FORGED \x1b[2J\x1b[31m"
          "\r\u2028FORGED\u2029FORGED\x85FORGED\x9b31m")
RAW = ("\x1b", "\r", "\u2028", "\u2029", "\x85", "\x9b")

APP = f'''
from dependency_injector import containers, providers

from mdb import listener
from mdb.seam.registry import broker_for
from mdb.seam.broker import ConnectionOptions
from mdb.messages.destinations import Destination
from mdb.messages.headers import ID
from mdb.messages.message import OutgoingMessage

FORGED = {FORGED!r}


async def messages():
    connection = await broker_for(ConnectionOptions(url="memory://", client_id="p")).connect()
    await connection.send(Destination.parse("queue:work"),
                          OutgoingMessage(b"boom", {{ID: "id" + FORGED}}))
    await connection.close()
    yield None


class Services(containers.DeclarativeContainer):
    messages = providers.Resource(messages)


@listener("queue:work", redelivery={{"limit": 1, "delay": 0}})
async def on_work(body: str) -> None:
    raise ValueError("text" + FORGED)
'''

RECORD_START = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ")


def test_each_formatter_keeps_a_record_to_its_own_lines() -> None:
    record = logging.LogRecord("mdb.delivery", logging.WARNING, __file__, 1,
                               "listener %s: message %s failed", ("on_work", "id" + FORGED), None)
    record.trace = ""
    text = logs.TextLines(logs.FORMAT).format(record)
    first, *further = text.split("\n")
    assert RECORD_START.match(first) and further
    assert all(line.startswith(logs.CONTINUED) for line in further)
    json_line = logs.JsonLines().format(record)
    assert len(json_line.splitlines()) == 1 and not any(raw in json_line for raw in RAW)
    assert json.loads(json_line)["message"] == record.getMessage()
    assert printable(FORGED).isprintable()


def run_until_moved(tmp_path: Path, **env: str) -> tuple[str, str]:
    """``mdb run`` of ``APP`` until its message was moved to the error destination: its
    stdout and stderr, as bytes decoded (no line break of any kind taken for another)."""
    (tmp_path / "forging_app.py").write_text(APP)
    process = subprocess.Popen([sys.executable, "-m", "mdb.commands.cli", "run", "forging_app"],
                               cwd=tmp_path, env={**os.environ, **env},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    seen = b""
    try:
        assert process.stderr is not None
        for line in process.stderr:
            seen += line
            if b"moved to" in line:
                break
    finally:
        process.send_signal(signal.SIGTERM)
        out, rest = process.communicate(timeout=60)
    assert process.returncode == 0, (seen + rest).decode()
    return out.decode(), (seen + rest).decode()


def test_the_text_log_has_no_line_a_message_id_or_an_exception_forged(tmp_path: Path) -> None:
    out, err = run_until_moved(tmp_path, MDB_LOG_LEVEL="DEBUG")
    assert "moved to queue:work.DLQ" in err and "Traceback" in err
    for raw in RAW:
        assert raw not in out + err, repr(raw)
    for line in err.split("\n"):
        # A record's first line starts with its time; any other line of it is indented.
        assert RECORD_START.match(line) or line.startswith(" ") or line.startswith("mdb:") \
            or not line, repr(line)
        assert not line.startswith("2026-01-01"), repr(line)
    assert r"FORGED \x1b[2J\x1b[31m\r\u2028FORGED\u2029FORGED\x85FORGED\x9b31m" in err


def test_the_json_log_has_one_record_per_line_whatever_the_text(tmp_path: Path) -> None:
    _, err = run_until_moved(tmp_path, MDB_LOG_FORMAT="json", MDB_LOG_LEVEL="DEBUG")
    for raw in RAW:
        assert raw not in err, repr(raw)
    lines = err.splitlines()  # as any tool splits them: U+2028, U+0085... included
    records = [json.loads(line) for line in lines]
    [moved] = [r for r in records if "moved to" in r["message"]]
    assert FORGED in moved["message"]  # the JSON string holds the text as it was


@pytest.mark.anyio
async def test_mdb_status_shows_a_message_id_without_its_control_characters() -> None:
    stuck = StuckHandler("id" + FORGED, 12.0)
    health = Health(live=True, ready=False, listeners=(
        ListenerHealth("on_work" + FORGED, 1, 1, 1, 0, slots=1, stuck=(stuck,)),))
    server = HealthServer(lambda: health)
    server.start()
    try:
        done = await anyio.run_process(
            [sys.executable, "-m", "mdb.commands.cli", "status", "--url",
             f"127.0.0.1:{server.port}"],
            check=False)
    finally:
        server.close()
    out = done.stdout.decode()
    assert done.returncode == 1 and "stuck handler" in out
    for raw in (*RAW, "\n2026"):
        assert raw not in out, repr(raw)
    assert r"id\n2026-01-01 00:00:00,000 ERROR   mdb.container: FORGED \x1b[2J" in out


def until(lines: Iterator[bytes], wanted: bytes, seen: list[bytes]) -> bytes:
    """Read the process's output until a line starts with ``wanted``; that line."""
    for line in lines:
        seen.append(line)
        if line.startswith(wanted):
            return line
    raise AssertionError(f"the output ended before {wanted!r}:\n{b''.join(seen)!r}")


def test_mdb_run_reload_names_new_files_in_one_bounded_line(tmp_path: Path) -> None:
    (tmp_path / "reloading_app.py").write_text(
        "from mdb import listener\n\n@listener('queue:work')\n"
        "async def on_work(body: bytes) -> None:\n    pass\n")
    process = subprocess.Popen(
        [sys.executable, "-m", "mdb.commands.cli", "run", "reloading_app", "--reload"],
        cwd=tmp_path,
        env={**os.environ, "MDB_LOG_LEVEL": "WARNING"}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT)
    assert process.stdout is not None
    lines, seen = iter(process.stdout), list[bytes]()
    try:
        until(lines, b"mdb: ready", seen)
        (tmp_path / "x\nmdb: ready (app FORGED)\x1b[2J.py").write_text("")
        forged = until(lines, b"mdb: --reload: ", seen)
        until(lines, b"mdb: ready", seen)
        for n in range(3000):
            (tmp_path / f"generated_{n:04d}.py").write_text("")
        many = until(lines, b"mdb: --reload: generated_", seen)
        until(lines, b"mdb: ready", seen)
    finally:
        process.send_signal(signal.SIGTERM)
        rest, _ = process.communicate(timeout=60)
    output = b"".join(seen) + rest
    assert process.returncode == 0, output.decode()
    assert not any(line.startswith(b"mdb: ready (app FORGED") for line in output.split(b"\n"))
    assert b"\x1b" not in output
    assert forged.startswith(br"mdb: --reload: x\nmdb: ready (app FORGED)\x1b[2J.py changed")
    assert len(many) < 300 and re.search(rb" and \d+ more changed", many), many
