"""``MDB_LOG_FORMAT=json``: every line ``mdb run`` writes on stderr is a JSON object, and a
handler's log records carry the trace and span ids of the message being handled."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

# Two messages wait on the queue before the container starts: one is handled and logged, the
# other fails for good (its handler raises; one attempt), which mdb logs.
APP = '''
import logging

from dependency_injector import containers, providers

from mdb import listener
from mdb.routing.producer import Producer
from mdb.config.settings import load_settings


async def messages():
    async with Producer(load_settings()) as producer:
        await producer.send("queue:work", "fine")
        await producer.send("queue:work", "boom")
    yield None


class Services(containers.DeclarativeContainer):
    messages = providers.Resource(messages)


@listener("queue:work", redelivery={"limit": 1})
async def on_work(body: str) -> None:
    if body == "boom":
        raise ValueError("boom")
    logging.getLogger("app").warning("handled %s", body)
'''


def test_every_stderr_line_is_json_with_the_trace_of_its_message(tmp_path: Path) -> None:
    (tmp_path / "logged_app.py").write_text(APP)
    env = {**os.environ, "MDB_LOG_FORMAT": "json", "OTEL_TRACES_EXPORTER": "console"}
    process = subprocess.Popen([sys.executable, "-m", "mdb.commands.cli", "run", "logged_app"],
                               cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    lines = []
    try:
        assert process.stderr is not None
        for line in process.stderr:  # until both messages were logged
            lines.append(line)
            if sum("moved to" in x or '"logger": "app"' in x for x in lines) == 2:
                break
    finally:
        process.send_signal(signal.SIGTERM)
        _, rest = process.communicate(timeout=60)
    assert process.returncode == 0
    records = [json.loads(line) for line in lines + rest.splitlines(keepends=True)]
    assert all({"timestamp", "level", "logger", "message"} <= r.keys() for r in records)
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", r["timestamp"])
               for r in records)

    [handled] = [r for r in records if r["logger"] == "app"]
    assert handled["message"] == "handled fine" and handled["level"] == "WARNING"
    assert re.fullmatch(r"[0-9a-f]{32}", handled["trace_id"])
    assert re.fullmatch(r"[0-9a-f]{16}", handled["span_id"])
    [moved] = [r for r in records if "moved to" in r["message"]]
    assert re.fullmatch(r"[0-9a-f]{32}", moved["trace_id"])
    # The handler's traceback is the record's exception, as a log shipper reads it; the
    # message is the one line.
    assert "\n" not in moved["message"] and moved["message"].endswith("(ValueError: boom)")
    assert moved["exception"].startswith("Traceback (most recent call last):\n")
    assert 'raise ValueError("boom")' in moved["exception"]
    assert moved["exception"].endswith("\nValueError: boom")
    assert moved["trace_id"] != handled["trace_id"]  # each message its own trace
    [stopping] = [r for r in records if "SIGTERM: stopping" in r["message"]]
    assert stopping["logger"] == "mdb"
    assert "trace_id" not in stopping  # no message being handled


def test_an_unknown_log_format_is_one_line_exit_2(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "mdb.commands.cli", "run", "nothing"],
                          cwd=tmp_path,
                          env={**os.environ, "MDB_LOG_FORMAT": "xml"}, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr == ("mdb: configuration error: MDB_LOG_FORMAT='xml': mdb knows 'text' "
                           "and 'json'\n")
