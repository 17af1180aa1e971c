"""``mdb console``: its settings, the escaping of every value shown, the login and CSRF
guarding every action, a container that does not answer, the bounds of a request, and the rates
it draws (docs/console.md). Containers here are health endpoints answering a snapshot
(``tests.harness.processes.health.serving``); tests/console drives it in a browser against
real container processes."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import anyio
import anyio.to_thread
import pytest

from mdb import listener
from mdb.commands.console.charts import rate_chart
from mdb.commands.console.console_command import check
from mdb.commands.console.poller import Fleet, Rate
from mdb.config.console_settings import ConsoleSettings
from mdb.config.settings import Settings, load_settings
from mdb.errors import ConfigurationError
from mdb.observability.health import (
    BrokerHealth,
    DatabaseHealth,
    Health,
    ListenerHealth,
    MemberHealth,
)
from mdb.serving.http.routes import HealthServer
from tests.harness.apps.in_process import running, unique
from tests.harness.processes.cli import mdb, one_line
from tests.harness.processes.console import Visitor, console
from tests.harness.processes.health import NOW, READY, serving
from tests.harness.servers.databases import prepared, with_database

SCRIPT = "<script>alert(1)</script>"
TOKEN = "a-control-token-of-the-fleet"


class Calls:
    """The console's control: what it was asked to do, each done."""

    def __init__(self) -> None:
        self.made: list[tuple[str, str, str]] = []

    async def __call__(self, url: str, listener: str, action: str) -> tuple[bool, str]:
        self.made.append((url, listener, action))
        return True, f"{action}d"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port  # closed again: nothing answers there


def _settings(tmp_path: Path, *containers: str, token: bool = True) -> Settings:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    return Settings(console=ConsoleSettings(containers=list(containers), port=0, refresh=0.5),
                    control_token_file=token_file if token else None)


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[str, Calls, list[str]]]:
    """A console over a ready container, one where nothing listens and one that takes the
    connection and never answers."""
    with ExitStack() as stack:
        silent = stack.enter_context(socket.create_server(("127.0.0.1", 0)))
        urls = [stack.enter_context(serving(READY)), f"http://127.0.0.1:{_free_port()}",
                f"http://127.0.0.1:{silent.getsockname()[1]}"]
        calls = Calls()
        yield stack.enter_context(console(_settings(tmp_path, *urls), calls)), calls, urls


# A setting the console cannot run with: exit 2, one line naming it.
BAD = {
    "not a URL": ('containers = ["ftp://orders-1:8081"]', "setting console.containers"),
    "a path": ('containers = ["http://orders-1:8081/status"]', "setting console.containers"),
    "none": ("containers = []", "setting console.containers: no container"),
    "open bind": ('containers = ["http://a:1"]\nbind = "0.0.0.0"',
                  "setting console.bind: 0.0.0.0 is reachable beyond this machine"),
    "a refresh of 0": ('containers = ["http://a:1"]\nrefresh = 0', "setting console.refresh"),
    "unknown": ('containers = ["http://a:1"]\nrefesh = 2', "did you mean console.refresh?"),
}


@pytest.mark.parametrize("case", BAD)
def test_a_bad_console_setting_names_it(tmp_path: Path, case: str) -> None:
    table, said = BAD[case]
    config = tmp_path / "console.toml"
    config.write_text(f"[console]\n{table}\n")
    with pytest.raises(ConfigurationError) as refused:
        check(load_settings(config))
    assert said in str(refused.value)


def test_mdb_console_with_a_bad_setting_is_one_line_exit_2(tmp_path: Path) -> None:
    config = tmp_path / "console.toml"
    config.write_text('[console]\ncontainers = ["http://a:1"]\nbind = "0.0.0.0"\n')
    done = mdb("console", "--config", str(config), cwd=tmp_path)
    assert done.returncode == 2
    assert one_line(done.stderr).startswith("mdb: configuration error: setting console.bind")


def test_a_container_down_is_shown_down_beside_the_others(
        fleet: tuple[str, Calls, list[str]]) -> None:
    base, _, urls = fleet
    status, page = Visitor(base).get("/")
    assert status == 200
    rows = dict(re.findall(r'<tr class="container" id="container-(\d)" data-state="(\w+)"', page))
    assert rows == {"0": "ready", "1": "down", "2": "down"}
    assert f"cannot reach {urls[1]}/status" in page
    assert f"cannot reach {urls[2]}/status: no answer within 0.5 s" in page
    assert 'data-listener="on_order" data-container="0"' in page


def test_every_value_a_container_gives_is_shown_as_text(tmp_path: Path) -> None:
    hostile = Health(
        live=True, ready=False,
        brokers=(BrokerHealth(SCRIPT, "down", NOW, f"stomp://{SCRIPT}:61613"),),
        listeners=(ListenerHealth(SCRIPT, 1, 0, 0, 0, destination=f"queue:{SCRIPT}",
                                  mode=SCRIPT,
                                  member_states=(MemberHealth(SCRIPT, SCRIPT, False),)),),
        databases=(DatabaseHealth(SCRIPT, SCRIPT, NOW, 0, None),), stage=SCRIPT)
    with serving(hostile) as url, console(_settings(tmp_path, url), Calls()) as base:
        visitor = Visitor(base)
        visitor.login(TOKEN)
        status, page = visitor.get("/")
    assert status == 200
    assert "<script" not in page
    assert page.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 8


def test_an_action_needs_the_login_and_the_sessions_csrf_token(
        fleet: tuple[str, Calls, list[str]]) -> None:
    base, calls, urls = fleet
    pause = "/containers/0/listeners/on_order/pause"
    stranger = Visitor(base)
    assert stranger.post(pause, [("csrf", "guessed")])[0] == 403
    assert stranger.post("/login", [("token", "not-it")])[0] == 403
    operator = Visitor(base)
    csrf = operator.login(TOKEN)
    assert operator.post(pause)[0] == 403  # the cookie alone: a cross-site form would have it
    assert operator.post(pause, [("csrf", csrf + "x")])[0] == 403
    assert stranger.post(pause, [("csrf", csrf)])[0] == 403  # the token without the cookie
    assert calls.made == []
    status, page = operator.post(pause, [("csrf", csrf)])
    assert status == 200 and "<h1>Overview</h1>" in page  # back on the overview
    assert calls.made == [(urls[0], "on_order", "pause")]


def test_the_overview_an_action_leads_to_keeps_reloading_itself(
        fleet: tuple[str, Calls, list[str]]) -> None:
    """An action redirects to /#listeners; a refresh naming no URL would reload that, which a
    browser takes for a move within the page: the page would never show the fleet again."""
    base, _, _ = fleet
    operator = Visitor(base)
    csrf = operator.login(TOKEN)
    _, page = operator.post("/containers/0/listeners/on_order/resume", [("csrf", csrf)])
    found = re.search(r'<meta http-equiv="refresh" content="0.5; url=([^"]*)">', page)
    assert found is not None, page
    assert found.group(1) == "/"


def test_without_a_token_the_page_reads_and_nothing_acts(tmp_path: Path) -> None:
    calls = Calls()
    with serving(READY) as url, console(_settings(tmp_path, url, token=False), calls) as base:
        visitor = Visitor(base)
        status, page = visitor.get("/")
        assert status == 200 and 'data-listener="on_order"' in page
        assert "<form" not in page
        status, page = visitor.post("/login", [("token", "")])
        assert status == 403 and "control_token_file" in page
        assert visitor.post("/containers/0/listeners/on_order/pause")[0] == 403
    assert calls.made == []


def test_a_request_beyond_the_bounds_is_refused(fleet: tuple[str, Calls, list[str]]) -> None:
    base, calls, _ = fleet
    visitor = Visitor(base)
    csrf = visitor.login(TOKEN)
    status, _ = visitor.post("/containers/0/listeners/on_order/pause",
                             body=f"csrf={csrf}&pad=".encode() + b"x" * 70_000)
    assert status == 413
    fields = "&".join(f"ids={i}" for i in range(1_100))
    status, _ = visitor.post("/containers/0/listeners/on_order/pause",
                             body=f"csrf={csrf}&{fields}".encode())
    assert status == 400
    assert calls.made == []


def test_every_answer_forbids_scripts_frames_and_caches(
        fleet: tuple[str, Calls, list[str]]) -> None:
    import urllib.request

    with urllib.request.urlopen(fleet[0] + "/", timeout=30) as answer:
        policy = answer.headers["Content-Security-Policy"]
        assert "default-src 'none'" in policy and "script" not in policy
        assert answer.headers["X-Frame-Options"] == "DENY"
        assert answer.headers["Cache-Control"] == "no-store"


def test_the_chart_carries_its_points() -> None:
    rates = [Rate(100.0, 10.0, 1.0, 0.0), Rate(102.0, 15.0, 0.0, 0.5)]
    chart = rate_chart(rates, now=102.0)
    lines = dict(re.findall(r'<polyline class="(\w+)".*? data-rates="([^"]*)"', chart))
    assert lines == {"processed": "10 15", "redelivered": "1 0", "to_error_destination": "0 0.5"}
    assert 'data-at="100.0 102.0"' in chart


@pytest.mark.anyio
async def test_rates_are_the_counters_differences_over_time() -> None:
    readings = iter([(0, 0, 0), (20, 2, 0), (50, 2, 1), (5, 0, 0)])  # then it restarted
    times = iter([100.0, 102.0, 104.0, 106.0])

    def fetch(url: str, timeout: float) -> Health:
        processed, redelivered, moved = next(readings)
        return Health(live=True, ready=True, listeners=(ListenerHealth(
            "on_order", 1, 1, 0, processed, redelivered=redelivered,
            to_error_destination=moved),))

    fleet = Fleet(["http://a:1"], 2.0, fetch=fetch, clock=lambda: next(times))
    for _ in range(4):
        await fleet.read(0)
    rates = fleet.rates("http://a:1", "on_order")
    assert [(r.at, r.processed, r.redelivered, r.to_error_destination) for r in rates] == [
        (102.0, 10.0, 1.0, 0.0), (104.0, 15.0, 0.0, 0.5), (106.0, 2.5, 0.0, 0.0)]


def test_the_failed_messages_pages_are_routed_and_their_actions_guarded(
        fleet: tuple[str, Calls, list[str]]) -> None:
    visitor = Visitor(fleet[0])
    status, page = visitor.get("/failed")
    assert status == 200 and "console.error_destinations" in page
    assert visitor.post("/failed/queue:orders.DLQ/purge", [("ids", "a")])[0] == 403
    csrf = visitor.login(TOKEN)
    status, page = visitor.post("/failed/queue%3Aorders.DLQ/purge",
                                [("csrf", csrf), ("ids", "a")])
    assert status == 404 and "queue:orders.DLQ is not an error destination" in page


@pytest.mark.anyio
async def test_an_exactly_once_database_is_shown_up_with_its_outbox(tmp_path: Path) -> None:
    database = await prepared(f"sqlite+aiosqlite:///{tmp_path / 'app.db'}")
    url = f"memory://{unique('console')}"

    @listener("queue:orders", exactly_once="main")
    async def on_order(body: str) -> None: ...

    try:
        async with running(with_database(url, database), on_order) as container:
            server = HealthServer(container.health)
            server.start()
            try:
                settings = _settings(tmp_path, f"http://127.0.0.1:{server.port}")
                page = await anyio.to_thread.run_sync(_overview, settings)
            finally:
                server.close()
    finally:
        await database.close()
    row = re.search(r'<tr class="database"><td>main</td>.*?</tr>', page)
    assert row, page
    assert '<span class="up">up</span>' in row.group(0)
    assert "<td>0</td><td>—</td>" in row.group(0)  # no row waits in the outbox


def _overview(settings: Settings) -> str:
    with console(settings, Calls()) as base:
        return Visitor(base).get("/")[1]
