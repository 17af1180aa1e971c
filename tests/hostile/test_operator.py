"""A careless operator's cases on real brokers (docs/security.md, "Secrets"; docs/failover.md;
docs/failed-messages.md): a password never reaches the log, DEBUG included, a broker outage is
one line when it starts and one when it ends, with nothing of the broker library's, Ctrl-C,
the end of input or a reader that leaves ends ``mdb dlq`` in one line or none, nothing lost,
and two `mdb dlq replay` of one error destination at once end, one of them in one line, with
every message replayed once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pty
import queue
import select
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import anyio
import pytest

from mdb.messages.destinations import Destination
from mdb.messages.headers import ID, ORIGINAL_DESTINATION
from mdb.messages.message import OutgoingMessage, new_id
from mdb.seam.broker import ConnectionOptions
from mdb.seam.registry import broker_for
from tests.harness.apps.in_process import unique
from tests.harness.servers.brokers import private_brokers
from tests.harness.servers.process import BrokerProcess

ROOT = Path(__file__).resolve().parents[2]
WAIT = 120.0
ON_EACH_BROKER = pytest.mark.parametrize("broker", [
    pytest.param("activemq", marks=pytest.mark.activemq),
    pytest.param("rabbitmq", marks=pytest.mark.rabbitmq),
])

LISTENERS = (
    "from mdb import listener\n\n"
    "@listener('queue:outage_orders', pool=4)\n"
    "async def on_order(body: bytes) -> None:\n"
    "    pass\n\n"
    "@listener('topic:outage_prices', pool=2)\n"
    "async def on_price(body: bytes) -> None:\n"
    "    pass\n"
)


@ON_EACH_BROKER
def test_debug_logs_never_show_the_password(broker: str, request: pytest.FixtureRequest) -> None:
    process = request.getfixturevalue(broker)  # it requires a login: its url carries one
    password = process.password
    env = {**os.environ, "MDB_BROKERS__DEFAULT__URL": str(process.url), "MDB_LOG_LEVEL": "DEBUG"}
    result = subprocess.run(
        [sys.executable, "-m", "mdb.commands.cli", "send", "queue:operator_debug", "x"], cwd=ROOT,
        env=env, capture_output=True, text=True, timeout=WAIT)
    assert result.returncode == 0, result.stderr
    assert "passcode:***" in result.stderr  # stomp.py's frames are shown at DEBUG, masked
    shown = result.stdout + result.stderr
    assert f"passcode:{password}" not in shown and f":{password}@" not in shown


@pytest.mark.activemq
def test_a_broker_outage_is_one_line_when_it_starts_and_one_when_it_ends(
        tmp_path: Path) -> None:
    (tmp_path / "outage_listeners.py").write_text(LISTENERS)
    with private_brokers("activemq") as [broker]:
        env = {**os.environ, "MDB_BROKERS__MAIN__URL": str(broker.url),
               "MDB_BROKERS__MAIN__RECONNECT_DELAY": "0.1",
               "MDB_BROKERS__MAIN__RECONNECT_MAX_DELAY": "0.5"}
        process = subprocess.Popen(
            [sys.executable, "-m", "mdb.commands.cli", "run", "outage_listeners"], cwd=tmp_path,
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        stderr: queue.Queue[str] = queue.Queue()
        lines: list[str] = []
        assert process.stdout is not None and process.stderr is not None
        pipe = process.stderr

        def read() -> None:
            for line in pipe:
                stderr.put(line)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()

        def wait_for(text: str) -> None:
            while not any(text in line for line in lines):
                lines.append(stderr.get(timeout=WAIT))

        try:
            for line in process.stdout:
                if line.startswith("mdb: ready"):
                    break
            broker.kill()
            wait_for("connection-lost")
            broker.start()
            wait_for("connection-restored")
        finally:
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=WAIT) == 0
        reader.join(WAIT)
        while not stderr.empty():
            lines.append(stderr.get_nowait())
    logged = [line for line in lines if line.strip() and "SIGTERM" not in line
              and "container ready" not in line]
    assert len(logged) == 2, "".join(lines)
    lost, restored = logged
    assert "connection-lost: broker main" in lost and "queue:outage_orders@main" in lost
    assert "connection-restored: broker main (down for" in restored
    assert "failed attempts" in restored


# -- Ctrl-C and the end of input (docs/failed-messages.md, "Interrupted") ----------------------


def _dlq(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mdb.commands.cli", *args], cwd=cwd,
                          env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=WAIT)


def _read_until(fd: int, text: bytes) -> bytes:
    """What ``fd`` gives until ``text`` appeared in it (the command waits there)."""
    seen = b""
    while text not in seen:
        ready, _, _ = select.select([fd], [], [], WAIT)
        assert ready, f"{text!r} did not come: {seen!r}"
        chunk = os.read(fd, 4096)
        assert chunk, f"ended before {text!r}: {seen!r}"
        seen += chunk
    return seen


def _failed_copies(queue: str, count: int, env: dict[str, str], cwd: Path) -> None:
    for i in range(count):
        sent = _dlq("send", f"queue:{queue}.DLQ", f"order {i}", "--header",
                    f"mdb_original_destination=queue:{queue}", env=env, cwd=cwd)
        assert sent.returncode == 0, sent.stderr


def _ids_on(destination: str, env: dict[str, str], cwd: Path) -> list[str]:
    listed = _dlq("dlq", "list", destination, "--json", env=env, cwd=cwd)
    assert listed.returncode == 0, listed.stderr
    return [row["id"] for row in map(json.loads, listed.stdout.splitlines()) if "id" in row]


@pytest.mark.activemq
@pytest.mark.parametrize(("answer", "code", "said"), [
    (None, 130, "mdb: interrupted"),  # Ctrl-C
    (b"\x04", 2, "mdb: configuration error: mdb dlq purge: not confirmed, nothing purged"),
    (b"n\n", 2, "mdb: configuration error: mdb dlq purge: not confirmed, nothing purged"),
])
def test_the_purge_prompt_takes_ctrl_c_and_the_end_of_input_for_no(
        activemq: BrokerProcess, tmp_path: Path, answer: bytes | None, code: int,
        said: str) -> None:
    env = {"MDB_BROKERS__DEFAULT__URL": str(activemq.url)}
    queue = f"operator_prompt_{uuid.uuid4().hex[:8]}"
    _failed_copies(queue, 1, env, tmp_path)
    [kept] = _ids_on(f"queue:{queue}.DLQ", env, tmp_path)
    prompt, terminal = pty.openpty()  # the prompt needs a terminal on stdin
    process = subprocess.Popen(
        [sys.executable, "-m", "mdb.commands.cli", "dlq", "purge", f"queue:{queue}.DLQ"],
        cwd=tmp_path,
        env={**os.environ, **env}, stdin=terminal, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE)
    os.close(terminal)
    try:
        assert process.stdout is not None and process.stderr is not None
        _read_until(process.stdout.fileno(), b"[y/N] ")
        if answer is None:
            process.send_signal(signal.SIGINT)  # what Ctrl-C sends
        else:
            os.write(prompt, answer)
        assert process.wait(timeout=WAIT) == code
        stderr = process.stderr.read().decode()
    finally:
        process.kill()
        os.close(prompt)
    assert "Traceback" not in stderr and stderr.strip().splitlines() == [said]
    assert _ids_on(f"queue:{queue}.DLQ", env, tmp_path) == [kept]


@pytest.mark.activemq
def test_ctrl_c_in_a_replay_ends_it_with_130_and_loses_nothing(
        activemq: BrokerProcess, tmp_path: Path) -> None:
    env = {"MDB_BROKERS__DEFAULT__URL": str(activemq.url)}
    queue = f"operator_interrupted_{uuid.uuid4().hex[:8]}"
    _failed_copies(queue, 3, env, tmp_path)
    before = _ids_on(f"queue:{queue}.DLQ", env, tmp_path)
    progress, terminal = pty.openpty()  # the progress bar is drawn on a terminal
    process = subprocess.Popen(  # one message a day: the second waits
        [sys.executable, "-m", "mdb.commands.cli", "dlq", "replay", f"queue:{queue}.DLQ", "--rate",
         "0.00001"], cwd=tmp_path, env={**os.environ, **env}, stdout=subprocess.PIPE,
        stderr=terminal)
    os.close(terminal)
    try:
        seen = _read_until(progress, b"1/3")
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=WAIT) == 130
        with contextlib.suppress(OSError):  # the terminal's last lines, if any are left
            seen += _read_until(progress, b"interrupted")
    finally:
        process.kill()
        os.close(progress)
    assert b"Traceback" not in seen and b"mdb: interrupted" in seen
    assert _ids_on(f"queue:{queue}.DLQ", env, tmp_path) == before[1:]
    assert _ids_on(f"queue:{queue}", env, tmp_path) == before[:1]


async def _sent(url: str, queue: str, count: int, original: str) -> set[str]:
    connection = await broker_for(ConnectionOptions(url=url)).connect()
    ids = {new_id() for _ in range(count)}
    try:
        for message_id in ids:
            await connection.send(Destination.parse(queue), OutgoingMessage(
                b"order", {ID: message_id, ORIGINAL_DESTINATION: original}))
    finally:
        await connection.close()
    return ids


@ON_EACH_BROKER
def test_a_listing_whose_reader_leaves_ends_141_with_every_message_in_place(
        broker: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    url = str(request.getfixturevalue(broker).url)
    env = {"MDB_BROKERS__DEFAULT__URL": url}
    errors = Destination.parse(f"queue:operator_head_{uuid.uuid4().hex[:8]}.DLQ")

    async def put() -> None:  # more rows than a pipe holds, so the listing outlives its reader
        connection = await broker_for(ConnectionOptions(url, client_id="head")).connect()
        try:
            transaction = await connection.begin()
            for i in range(800):
                await transaction.send(errors, OutgoingMessage(
                    f"order {i}".encode(), {ID: new_id(), ORIGINAL_DESTINATION: "queue:x"}))
            await transaction.commit()
        finally:
            await connection.close()

    anyio.run(put)
    before = _ids_on(str(errors), env, tmp_path)
    process = subprocess.Popen([sys.executable, "-m", "mdb.commands.cli", "dlq", "list",
                                str(errors)],
                               cwd=tmp_path, env={**os.environ, **env}, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    assert process.stdout is not None and process.stderr is not None
    assert process.stdout.readline().startswith(b"ID ")  # `| head -1`
    process.stdout.close()
    assert process.wait(timeout=WAIT) == 128 + signal.SIGPIPE
    assert process.stderr.read() == b""
    assert len(before) == 800 and _ids_on(str(errors), env, tmp_path) == before


@ON_EACH_BROKER
def test_two_replays_of_one_error_destination_at_once_end_and_replay_each_once(
        broker: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    url = str(request.getfixturevalue(broker).url)
    name = unique("twice")
    errors, original = f"queue:{name}.DLQ", f"queue:{name}"
    ids = asyncio.run(_sent(url, errors, 300, original))
    env = {**os.environ, "MDB_BROKERS__DEFAULT__URL": url}

    def dlq(*args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "mdb.commands.cli", "dlq", *args],
                                cwd=tmp_path,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)

    replays = [dlq("replay", errors), dlq("replay", errors)]
    try:
        ended = [(p.wait(timeout=WAIT), *p.communicate()) for p in replays]
    finally:
        for process in replays:
            if process.poll() is None:
                process.kill()
    for code, _, err in ended:
        assert (code, err) == (0, "") or (code == 3 and err.count("\n") == 1
                                          and "another mdb dlq command is at work" in err), err
    replayed = sum(int(out.split()[1]) for code, out, _ in ended if code == 0)
    assert replayed == 300
    listed = dlq("list", original, "--json")
    out, err = listed.communicate(timeout=WAIT)
    rows = [json.loads(line) for line in out.splitlines()]
    assert (listed.returncode, err) == (0, "")
    assert sorted(row["id"] for row in rows[:-1]) == sorted(ids)
