"""The ``mdb`` command: startup errors exit non-zero with a message naming the problem."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.processes.cli import stopped, until_ready
from tests.harness.servers.postgresql import USER, PostgreSQL

ROOT = Path(__file__).resolve().parents[2]


def mdb(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mdb.commands.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def app(tmp_path: Path) -> Path:
    (tmp_path / "app_listeners.py").write_text(
        "from mdb import listener\n\n"
        "@listener('queue:orders')\n"
        "async def on_order(body: bytes) -> None:\n"
        "    pass\n"
    )
    return tmp_path


# A configuration mdb cannot run: each exits 2, naming what is wrong; the unknown scheme also
# lists the installed ones.
BAD_CONFIGURATIONS = {
    "a bad setting": ("[brokers.main]\nurl = 'nowhere'\n", ["setting brokers.main.url"]),
    "an unknown broker scheme": ("[brokers.main]\nurl = 'kafka://x:1'\n",
                                 ["no adapter for scheme 'kafka'", "memory"]),
    "an override for an unknown listener": (
        "[listeners.on_ordr]\npool = 2\n",
        ["listeners.on_ordr: no such listener; listeners are: on_order"]),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGURATIONS))
def test_a_bad_configuration_exits_2_naming_the_problem(app: Path, case: str) -> None:
    config, said = BAD_CONFIGURATIONS[case]
    (app / "bad.toml").write_text(config)
    result = mdb("run", "app_listeners", "--config", "bad.toml", cwd=app)
    assert result.returncode == 2
    assert all(text in result.stderr for text in said), result.stderr


def test_several_bad_settings_are_one_line_each_naming_the_setting(app: Path) -> None:
    """docs/configuration.md: one line per setting; a key of the file is its writer's text,
    which cannot end a line of its own (docs/security.md, "Control characters")."""
    (app / "bad.toml").write_text('pool_size = 3\n"forged\\nmdb: ready" = 1\n'
                                  "[brokers.main]\nurl = 'nowhere'\nurll = 'x'\n")
    result = mdb("run", "app_listeners", "--config", "bad.toml", cwd=app)
    assert result.returncode == 2
    first, *settings = result.stderr.splitlines()
    assert first == "mdb: configuration error: invalid settings:"
    assert len(settings) == 4 and all(line.startswith("  setting ") for line in settings)
    assert any("setting brokers.main.url: Value error, must look like" in s for s in settings)
    assert "  setting pool_size: unknown setting; docs/configuration.md lists them" in settings
    assert "  setting brokers.main.urll: unknown setting; did you mean brokers.main.url?" \
        in settings
    assert "  setting forged\\nmdb: ready: " in result.stderr


def test_a_module_that_does_not_import_is_named(app: Path) -> None:
    result = mdb("run", "no_such_module", cwd=app)
    assert result.returncode == 2 and "'no_such_module'" in result.stderr


def one_line(stderr: str) -> str:
    """The sole line of ``stderr``: a startup failure is one line, never a traceback."""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


def test_a_module_that_raises_at_import_is_one_line_exit_2(app: Path) -> None:
    (app / "broken.py").write_text("import json\n\nSETTING = json.loads('{')\n")
    result = mdb("run", "broken", cwd=app)
    assert result.returncode == 2
    line = one_line(result.stderr)
    assert "listener module 'broken'" in line and "JSONDecodeError" in line
    assert "broken.py, line 3" in line


def test_a_health_port_in_use_is_one_line_exit_2(app: Path) -> None:
    import socket

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        env = {**os.environ, "MDB_HEALTH_PORT": str(port), "MDB_LOG_LEVEL": "WARNING"}
        result = mdb("run", "app_listeners", cwd=app, env=env)
    assert result.returncode == 2
    assert f"health_port {port}" in one_line(result.stderr)


@pytest.mark.parametrize("command", ["subscriptions", "run"])
def test_an_invalid_queue_selector_is_found_by_subscriptions_and_run(
        app: Path, command: str) -> None:
    (app / "sel.toml").write_text(
        "[brokers.main]\nurl = 'stomp+activemq://127.0.0.1:9'\nconnect_timeout = 2\n"
        "[listeners.on_order]\nselector = \"region = 'eu\"\n")
    result = mdb(command, "app_listeners", "--config", "sel.toml", cwd=app)
    assert result.returncode == 2
    assert "listener 'on_order': selector" in one_line(result.stderr)


def test_a_module_without_listeners_is_named(app: Path) -> None:
    (app / "empty.py").write_text("x = 1\n")
    result = mdb("run", "empty", cwd=app)
    assert result.returncode == 2 and "no @listener functions in empty" in result.stderr


def test_an_unreachable_broker_exits_3(app: Path) -> None:
    (app / "down.toml").write_text(
        "[brokers.main]\nurl = 'stomp+activemq://127.0.0.1:9'\nconnect_timeout = 2\n")
    result = mdb("run", "app_listeners", "--config", "down.toml", cwd=app)
    assert result.returncode == 3
    assert "broker error" in one_line(result.stderr)  # said once, not logged before it too


@pytest.mark.parametrize("command", [["run", "app_listeners"], ["send", "queue:orders", "x"],
                                     ["subscriptions", "app_listeners"]])
def test_a_broker_whose_extra_is_not_installed_is_one_line_exit_2(
        app: Path, command: list[str]) -> None:
    (app / "amq.toml").write_text("[brokers.main]\nurl = 'stomp+activemq://127.0.0.1:9'\n")
    without_stomp = ("import sys\nsys.modules['stomp'] = None  # as if mdb[stomp] was not "
                     "installed\nfrom mdb.commands.cli import main\nmain()\n")
    result = subprocess.run([sys.executable, "-c", without_stomp, *command, "--config",
                             "amq.toml"], cwd=app, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert one_line(result.stderr) == (
        "mdb: configuration error: broker url 'stomp+activemq://127.0.0.1:9': its adapter "
        "cannot be loaded: mdb's STOMP adapter needs stomp.py: pip install 'mdb[stomp]'")


def test_mdb_subscriptions_delete_names_what_it_needs(app: Path) -> None:
    nothing = mdb("subscriptions", cwd=app)
    assert nothing.returncode == 2 and "--delete TOPIC NAME" in nothing.stderr
    queue = mdb("subscriptions", "--delete", "queue:orders", "x", cwd=app)
    assert queue.returncode == 2 and "only topics have named subscriptions" in queue.stderr


def test_mdb_subscriptions_delete_explains_what_activemq_cannot_do(
    activemq: object, tmp_path: Path,
) -> None:
    (tmp_path / "amq.toml").write_text(f"[brokers.main]\nurl = '{activemq.url}'\n")  # type: ignore[attr-defined]
    result = mdb("subscriptions", "--delete", "topic:quotes", "old-name", "--config", "amq.toml",
                 cwd=tmp_path)
    assert result.returncode == 3
    assert "cannot delete queue Consumer.old-name.VirtualTopic.quotes over STOMP" in result.stderr


def test_mdb_send_delivers_with_headers(activemq: object, tmp_path: Path) -> None:
    import anyio

    from tests.harness.apps.in_process import unique
    from tests.harness.traffic.messages import read

    url = str(activemq.url)  # type: ignore[attr-defined]
    queue = f"queue:{unique('sent')}"
    env = {**os.environ, "MDB_BROKERS__DEFAULT__URL": url}
    result = mdb("send", queue, "hello", "--header", "region=eu", cwd=ROOT, env=env)
    assert result.returncode == 0, result.stderr
    [delivery] = anyio.run(read, url, queue, 1)
    assert delivery.body == b"hello" and delivery.headers["region"] == "eu"
    assert result.stdout.startswith(f"sent {delivery.headers['mdb_id']} to {queue}")
    assert result.stderr == ""  # nothing of stomp.py's ("established connection ...")


def test_mdb_send_keeps_the_id_it_is_given(activemq: object) -> None:
    import anyio

    from tests.harness.apps.in_process import unique
    from tests.harness.traffic.messages import read

    url = str(activemq.url)  # type: ignore[attr-defined]
    queue = f"queue:{unique('sent')}"
    env = {**os.environ, "MDB_BROKERS__DEFAULT__URL": url}
    result = mdb("send", queue, "again", "--header", "mdb_id=order-17", cwd=ROOT, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"sent order-17 to {queue}\n"
    [delivery] = anyio.run(read, url, queue, 1)
    assert delivery.headers["mdb_id"] == "order-17"


def test_mdb_send_help_says_what_a_header_is(app: Path) -> None:
    helped = " ".join(mdb("send", "--help", cwd=app).stdout.split())
    assert ("--header KEY=VALUE an application header of the message (repeat it for more); "
            "mdb_id=ID sends it under that id") in helped


def test_mdb_send_takes_the_body_from_a_file_or_stdin(activemq: object, tmp_path: Path) -> None:
    import anyio

    from tests.harness.apps.in_process import unique
    from tests.harness.traffic.messages import read

    url = str(activemq.url)  # type: ignore[attr-defined]
    env = {**os.environ, "MDB_BROKERS__DEFAULT__URL": url}
    big = bytes(range(256)) * 1024  # 256 KB: more than one command-line argument may hold
    (tmp_path / "body.bin").write_bytes(big)
    queue = f"queue:{unique('file')}"
    result = mdb("send", queue, "--file", str(tmp_path / "body.bin"), cwd=ROOT, env=env)
    assert result.returncode == 0, result.stderr
    piped = subprocess.run([sys.executable, "-m", "mdb.commands.cli", "send", queue, "--file", "-"],
                           cwd=ROOT, env=env, input=b"from stdin", capture_output=True,
                           timeout=120)
    assert piped.returncode == 0, piped.stderr
    first, second = anyio.run(read, url, queue, 2)
    assert first.body == big and second.body == b"from stdin"


def test_mdb_send_wants_one_body(app: Path) -> None:
    both = mdb("send", "queue:q", "x", "--file", "body.bin", cwd=app)
    assert both.returncode == 2 and "give the BODY or --file" in one_line(both.stderr)
    missing = mdb("send", "queue:q", "--file", "nothing.bin", cwd=app)
    assert missing.returncode == 2 and "nothing.bin" in one_line(missing.stderr)


def test_mdb_send_sets_reply_to_and_correlation_id(activemq: object) -> None:
    import anyio

    from tests.harness.apps.in_process import unique
    from tests.harness.traffic.messages import read

    url = str(activemq.url)  # type: ignore[attr-defined]
    queue, replies = f"queue:{unique('ask')}", unique("replies")
    env = {**os.environ, "MDB_BROKERS__DEFAULT__URL": url}
    result = mdb("send", queue, "hello", "--reply-to", f"queue:{replies}",
                 "--correlation-id", "c-7", cwd=ROOT, env=env)
    assert result.returncode == 0, result.stderr
    [delivery] = anyio.run(read, url, queue, 1)
    assert (str(delivery.reply_to), delivery.correlation_id) == (f"/queue/{replies}", "c-7")


def test_mdb_send_carries_the_trace_context(activemq: object) -> None:
    import anyio

    from tests.harness.apps.in_process import unique
    from tests.harness.traffic.messages import read

    url = str(activemq.url)  # type: ignore[attr-defined]
    queue = f"queue:{unique('traced')}"
    env = {**os.environ, "MDB_BROKERS__DEFAULT__URL": url, "OTEL_TRACES_EXPORTER": "console"}
    result = mdb("send", queue, "hello", cwd=ROOT, env=env)
    assert result.returncode == 0, result.stderr
    [delivery] = anyio.run(read, url, queue, 1)
    trace_id = delivery.headers["traceparent"].split("-")[1]
    assert f'"trace_id": "0x{trace_id}"' in result.stdout  # the send span, exported


def test_mdb_send_labels_json(activemq: object, tmp_path: Path) -> None:
    import anyio

    from tests.harness.apps.in_process import unique
    from tests.harness.traffic.messages import read

    url = str(activemq.url)  # type: ignore[attr-defined]
    queue = f"queue:{unique('json')}"
    env = {**os.environ, "MDB_BROKERS__DEFAULT__URL": url}
    (tmp_path / "order.json").write_text('{"id": 7}')
    for args in (['{"id": 7}', "--json"], ["--file", str(tmp_path / "order.json"), "--json"],
                 ["a,b", "--content-type", "text/csv"]):
        result = mdb("send", queue, *args, cwd=ROOT, env=env)
        assert result.returncode == 0, result.stderr
    first, second, third = anyio.run(read, url, queue, 3)
    assert [(d.body, d.headers["content-type"], d.headers["mdb_content_type"])
            for d in (first, second, third)] == [
        (b'{"id": 7}', "application/json", "application/json"),
        (b'{"id": 7}', "application/json", "application/json"),
        (b"a,b", "text/csv", "text/csv")]


def test_mdb_send_json_must_be_json(app: Path) -> None:
    result = mdb("send", "queue:q", "{not json", "--json", cwd=app)
    assert result.returncode == 2
    assert one_line(result.stderr).startswith("mdb: cannot send: mdb send --json: the body is "
                                              "not JSON")  # a bad body, not a bad setting


def test_mdb_says_its_version_and_run_help_says_what_a_newcomer_needs(app: Path) -> None:
    from importlib.metadata import version

    assert mdb("--version", cwd=app).stdout.strip() == f"mdb {version('mdb')}"
    helped = " ".join(mdb("run", "--help", cwd=app).stdout.split())
    assert "MODULE a module of @listener functions, by its dotted name" in helped
    for needed in ("memory://", "health_port", "MDB_HEALTH_PORT", "MDB_LOG_LEVEL"):
        assert needed in helped


def test_mdb_run_says_ready_once_and_only_the_counters_that_moved(app: Path) -> None:
    process = subprocess.Popen([sys.executable, "-m", "mdb.commands.cli", "run", "app_listeners"],
                               cwd=app, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    until_ready(process)
    out, err = stopped(process)
    assert process.returncode == 0
    assert "ready" not in err  # the log does not say it a second time
    assert out.splitlines()[-1] == "mdb: stopped; processed 0, in flight 0"


# A process that lingers where the test says: at import, or at its very end (after "stopped"),
# until a line on stdin, which never comes: the test signals it there.
LINGERING = """
import atexit, os, sys
from mdb import listener

def linger(where):
    print(f"lingering {where}", flush=True)
    sys.stdin.readline()

if os.environ.get("LINGER") == "import":
    linger("at import")
atexit.register(linger, "at exit")

@listener("queue:orders")
async def on_order(body: bytes) -> None:
    pass
"""


def lingering(app: Path, where: str) -> subprocess.Popen[str]:
    """``mdb run`` of ``LINGERING``, once it lingers ``where``."""
    (app / "lingering_app.py").write_text(LINGERING)
    process = subprocess.Popen(
        [sys.executable, "-m", "mdb.commands.cli", "run", "lingering_app"], cwd=app,
        env={**os.environ, "LINGER": where.split()[-1]}, stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith("mdb: ready"):
            process.send_signal(signal.SIGINT)
        if line == f"lingering {where}\n":
            return process
    raise AssertionError(f"mdb run ended before lingering {where}: {process.wait()}")


@pytest.mark.parametrize("where", ["at import", "at exit"])
def test_ctrl_c_at_any_moment_exits_130_without_a_traceback(app: Path, where: str) -> None:
    """docs/concepts.md, "Exit status": the first signal stops in order, a second exits at once
    (at exit: just after ``mdb: stopped``, the stop done); a signal before the stop can begin
    (while the listener modules import) exits as well. Never a traceback."""
    process = lingering(app, where)
    process.send_signal(signal.SIGINT)
    assert process.stdin is not None and process.stderr is not None
    process.stdin.close()  # the import goes on (Python cannot stop it), or the end
    code = process.wait(timeout=60)
    err = process.stderr.read()
    assert code == 128 + signal.SIGINT, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err


def test_mdb_run_without_config_runs_on_after_sighup(app: Path) -> None:
    process = subprocess.Popen([sys.executable, "-m", "mdb.commands.cli", "run", "app_listeners"],
                               cwd=app, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    assert process.stderr is not None
    until_ready(process)
    process.send_signal(signal.SIGHUP)
    for line in process.stderr:
        if "SIGHUP" in line:
            break
    assert process.poll() is None
    out, err = stopped(process)
    assert process.returncode == 0, err
    assert "SIGHUP: nothing to reload without --config" in line
    assert out.splitlines()[-1] == "mdb: stopped; processed 0, in flight 0"


def test_load_settings_in_mdb_run_reads_what_mdb_run_read(tmp_path: Path) -> None:
    # A resource's Producer made from load_settings() sends where the container listens:
    # the --config file's broker (a memory broker of another name than the default's) and
    # app, and the command line's --server.
    (tmp_path / "svc.py").write_text(
        "from collections.abc import AsyncIterator\n"
        "from dependency_injector import containers, providers\n"
        "from mdb import Producer, listener, load_settings\n\n"
        "async def greeting() -> AsyncIterator[None]:\n"
        "    settings = load_settings()\n"
        "    print(f'resource: app {settings.app}, server {settings.server}, broker '\n"
        "          f'{settings.brokers[\"default\"].url}', flush=True)\n"
        "    async with Producer(settings) as producer:\n"
        "        await producer.send('queue:greetings', 'hello')\n"
        "    yield\n\n"
        "class Services(containers.DeclarativeContainer):\n"
        "    greeting = providers.Resource(greeting)\n\n"
        "@listener('queue:greetings')\n"
        "async def on_greeting(body: str) -> None:\n"
        "    print(f'handled {body}', flush=True)\n")
    (tmp_path / "shop.toml").write_text("app = 'shop'\n[brokers.default]\nurl = 'memory://shop'\n")
    process = subprocess.Popen(
        [sys.executable, "-m", "mdb.commands.cli", "run", "svc", "--config", "shop.toml",
         "--server",
         "s7"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        lines = (line.strip() for line in process.stdout)
        assert next(line for line in lines if line.startswith("resource:")) == (
            "resource: app shop, server s7, broker memory://shop")
        assert next(line for line in lines if line.startswith("handled")) == "handled hello"
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err


def test_mdb_send_refuses_the_embedded_broker_it_cannot_reach(app: Path) -> None:
    # The default broker is memory://, inside the process of `mdb run`: a send from another
    # process would go to a broker of its own and reach nothing.
    result = mdb("send", "queue:orders", '{"id": 1}', "--json", cwd=app)
    assert result.returncode == 2 and result.stdout == ""
    assert "broker 'default' is the embedded memory:// broker" in one_line(result.stderr)


def test_mdb_subscriptions_prints_the_plan_without_connecting(tmp_path: Path) -> None:
    (tmp_path / "topic_listeners.py").write_text(
        "from mdb import Distribution, listener\n\n"
        "@listener('topic:prices')\n"
        "async def per_app(body: bytes) -> None:\n"
        "    pass\n\n"
        "@listener('topic:prices', distribution=Distribution.ONE_COPY_PER_SERVER)\n"
        "async def per_server(body: bytes) -> None:\n"
        "    pass\n"
    )
    (tmp_path / "down.toml").write_text(  # nothing listens there: it must not connect
        "app = 'shop'\nserver = 'web_1'\n[brokers.main]\nurl = 'stomp+activemq://127.0.0.1:9'\n")
    result = mdb("subscriptions", "topic_listeners", "--config", "down.toml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["listener", "destination", "member", "subscription", "kind",
                                "pool", "broker"]
    assert lines[1].split()[:6] == ["per_app", "topic:prices", "topic:prices", "shop-per_app",
                                    "shared,", "durable"]
    assert lines[2].split()[:6] == ["per_server", "topic:prices", "topic:prices",
                                    "shop-web_1-per_server", "own,", "durable"]


def to_a_reader_gone(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``mdb`` whose stdout is a pipe nobody reads any more, as in ``mdb status | head -1``
    once head has its line."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([sys.executable, "-m", "mdb.commands.cli", *args], cwd=cwd,
                              stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write)


def test_a_reader_that_stops_reading_ends_mdb_quietly(app: Path) -> None:
    cut = to_a_reader_gone("subscriptions", "app_listeners", cwd=app)
    assert (cut.returncode, cut.stderr) == (128 + signal.SIGPIPE, "")


def test_mdb_run_serves_its_health_to_mdb_status(app: Path) -> None:
    from tests.harness.servers.process import free_port

    port = free_port()
    env = {**os.environ, "MDB_HEALTH_PORT": str(port), "MDB_LOG_LEVEL": "WARNING"}
    process = subprocess.Popen([sys.executable, "-m", "mdb.commands.cli", "run", "app_listeners"],
                               cwd=app, env=env, stdout=subprocess.PIPE, text=True)
    try:
        until_ready(process)  # after the plan and the health URL
        status = mdb("status", "--url", f"http://127.0.0.1:{port}", cwd=app, env=env)
        assert status.returncode == 0, status.stdout + status.stderr
        assert "live, ready" in status.stdout and "on_order" in status.stdout
        cut = to_a_reader_gone("status", "--url", f"http://127.0.0.1:{port}", cwd=app)
        assert (cut.returncode, cut.stderr) == (128 + signal.SIGPIPE, "")
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0


def test_mdb_send_refuses_headers_it_cannot_send_in_one_line(app: Path) -> None:
    huge = mdb("send", "queue:q", "x", "--header", "big=" + "x" * 9000, cwd=app)
    assert huge.returncode == 2 and "cannot send" in one_line(huge.stderr)


def test_mdb_db_upgrade_creates_the_tables_a_container_then_finds(app: Path) -> None:
    (app / "app_listeners.py").write_text(
        "from sqlalchemy.ext.asyncio import AsyncSession\n"
        "from mdb import listener\n\n"
        "@listener('queue:orders', exactly_once='main')\n"
        "async def on_order(body: bytes, session: AsyncSession) -> None:\n"
        "    pass\n")
    (app / "mdb.toml").write_text("[databases.main]\nurl = 'sqlite+aiosqlite:///app.db'\n"
                                  "[brokers.main]\nurl = 'memory://'\n")
    missing = mdb("run", "app_listeners", "--config", "mdb.toml", cwd=app)
    assert missing.returncode == 2
    assert "mdb_inbox, mdb_outbox, mdb_secret missing" in missing.stderr
    assert "mdb db upgrade" in missing.stderr
    created = mdb("db", "upgrade", "--config", "mdb.toml", cwd=app)
    assert created.returncode == 0, created.stderr
    assert "created mdb_inbox, mdb_outbox, mdb_secret, the identity secret" in created.stdout
    again = mdb("db", "upgrade", "--config", "mdb.toml", cwd=app)
    assert "up to date" in again.stdout
    assert mdb("subscriptions", "app_listeners", "--config", "mdb.toml", cwd=app).returncode == 0


EXACTLY_ONCE_APP = (
    "from sqlalchemy.ext.asyncio import AsyncSession\n"
    "from mdb import listener\n\n"
    "@listener('queue:orders', exactly_once='main')\n"
    "async def on_order(body: bytes, session: AsyncSession) -> None:\n"
    "    pass\n")


def out_of_reach(tmp_path: Path, where: str) -> str:
    """A database URL that cannot be reached: a server that is down (nothing listens on its
    port), or a SQLite file in a folder that does not exist."""
    from tests.harness.servers.process import free_port

    if where == "server down":
        return f"postgresql+asyncpg://127.0.0.1:{free_port()}/orders"
    return f"sqlite+aiosqlite:///{tmp_path}/no_such_folder/app.db"


@pytest.mark.parametrize("command", [["run", "app_listeners"], ["db", "upgrade"]])
@pytest.mark.parametrize("where", ["server down", "no such folder"])
def test_a_database_out_of_reach_at_startup_is_one_line_exit_2(
        app: Path, command: list[str], where: str) -> None:
    (app / "app_listeners.py").write_text(EXACTLY_ONCE_APP)
    (app / "mdb.toml").write_text(f"[databases.main]\nurl = '{out_of_reach(app, where)}'\n"
                                  "timeout = 5\n")
    result = mdb(*command, "--config", "mdb.toml", cwd=app)
    assert result.returncode == 2
    line = one_line(result.stderr)
    assert line.startswith("mdb: configuration error: database main (")
    assert "databases.main.url" in line


@pytest.mark.postgresql
@pytest.mark.parametrize("command", [["run", "app_listeners"], ["db", "upgrade"]])
def test_a_database_that_refuses_the_login_is_one_line_exit_2(
        app: Path, postgres: PostgreSQL, command: list[str]) -> None:
    (app / "app_listeners.py").write_text(EXACTLY_ONCE_APP)
    url = postgres.url().replace(f"{USER}@", "")
    (app / "mdb.toml").write_text(f"[databases.main]\nurl = '{url}'\nusername = 'nobody'\n"
                                  "password = 'wrong'\n")
    result = mdb(*command, "--config", "mdb.toml", cwd=app)
    assert result.returncode == 2
    line = one_line(result.stderr)
    assert 'role "nobody" does not exist' in line and "wrong" not in line
    assert "databases.main.username" in line and "databases.main.password" in line
