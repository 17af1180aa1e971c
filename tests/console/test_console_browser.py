"""``mdb console`` in a real browser (Debian's chromium, driven by Playwright) over a fleet of
two container processes on a real broker, ActiveMQ then RabbitMQ (docs/console.md): the page
lists both and every listener and member, a container that does not answer is shown down, an
action without the token is refused, pause and resume from the page while messages flow lose and
repeat nothing, a listener's handler latency is shown once messages flowed, and a broker killed
shows its members reconnecting, then up. The screenshots of docs/console.md are taken here (on
ActiveMQ)."""

from __future__ import annotations

import queue
import re
import shutil
import threading
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import anyio
import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from mdb.config.broker_settings import BrokerSettings
from mdb.config.settings import DestinationSettings, MemberSettings, Settings
from tests.harness.processes.console import ConsoleProcess
from tests.harness.processes.container_process import ROOT, ContainerProcess
from tests.harness.servers.brokers import private_brokers
from tests.harness.servers.process import BrokerProcess, free_port
from tests.harness.traffic.messages import send, send_all

T = TypeVar("T")
CHROMIUM = "/usr/bin/chromium"
TOKEN = "the-fleet's-control-token"
WAIT_MS = 90_000  # a broker's restart, a reconnect's backoff
IMAGES = ROOT / "docs" / "images"
expect.set_options(timeout=30_000)  # the page reloads itself every refresh: a slow machine
SCRIPT = "<script>alert('mdb')</script>"
LISTENER = "on_entry"  # tests.harness.apps.queue_ledger_app


@dataclass
class Fleet:
    broker: BrokerProcess
    kind: str
    ledger: str
    containers: list[ContainerProcess]
    lines: queue.Queue[dict[str, Any]]
    console: ConsoleProcess
    finished: list[str] = field(default_factory=list)
    """The bodies of the deliveries the containers finished, as read so far."""

    def done(self, count: int) -> None:
        """Wait for the next ``count`` deliveries the containers finish (``finished``)."""
        for _ in range(count):
            self.finished.append(self._next(timeout=WAIT_MS / 1000))

    def done_now(self) -> list[str]:
        """``finished``, with what finished since, without waiting."""
        while True:
            try:
                self.finished.append(self._next(timeout=None))
            except queue.Empty:
                return self.finished

    def _next(self, timeout: float | None) -> str:
        while True:
            entry = (self.lines.get(timeout=timeout) if timeout is not None
                     else self.lines.get_nowait())
            if entry.get("event") == "done":
                return str(entry["body"])

    def send(self, bodies: list[str]) -> None:
        _off_the_loop(partial(send_all, self.broker.url, f"queue:{self.ledger}", bodies))


def _off_the_loop(call: Callable[[], Awaitable[T]]) -> T:
    """Run ``call`` on an event loop of its own: Playwright's runs in the test's thread."""
    done: list[T] = []
    thread = threading.Thread(target=lambda: done.append(anyio.run(call)))
    thread.start()
    thread.join()
    assert done, "it raised: see the thread's exception above"
    return done[0]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not Path(CHROMIUM).exists() or shutil.which("java") is None:
        pytest.skip("Debian's chromium is not installed here (tests/run installs it)")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        yield launched
        launched.close()


@pytest.fixture(scope="module", params=[pytest.param("activemq", marks=pytest.mark.activemq),
                                        pytest.param("rabbitmq", marks=pytest.mark.rabbitmq)])
def fleet(request: pytest.FixtureRequest,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """Two containers of one app on a private broker (killed by a test), and a console over
    them and over a third address where nothing answers."""
    kind: str = request.param
    where = tmp_path_factory.mktemp(f"console-{kind}")
    token = where / "control-token"
    token.write_text(TOKEN + "\n")
    ledger = f"console_{uuid.uuid4().hex[:8]}"
    lines: queue.Queue[dict[str, Any]] = queue.Queue()
    ports = [free_port() for _ in range(3)]
    with private_brokers(kind) as [broker]:
        containers = [
            ContainerProcess(broker.url, ledger, "shop", f"shop_{i + 1}", hang=False, lines=lines,
                             env={"MDB_HEALTH_PORT": str(port),
                                  "MDB_CONTROL_TOKEN_FILE": str(token)})
            for i, port in enumerate(ports[:2])]
        try:
            for container in containers:
                container.__enter__()
            readies = 0
            while readies < len(containers):
                readies += lines.get(timeout=WAIT_MS / 1000).get("event") == "ready"
            config = where / "console.toml"
            urls = ", ".join(f'"http://127.0.0.1:{port}"' for port in ports)
            config.write_text(f'control_token_file = "{token}"\n'
                              f'brokers.default.url = "{broker.url}"\n'
                              f"[console]\ncontainers = [{urls}]\nport = 0\nrefresh = 2\n"
                              f'error_destinations = ["queue:{ledger}.DLQ"]\n')
            console = ConsoleProcess(config, where)
            try:
                yield Fleet(broker, kind, ledger, containers, lines, console)
            finally:
                console.stop()
        finally:
            for container in containers:
                container.__exit__()


@pytest.fixture
def page(browser: Browser, fleet: Fleet) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1500, "height": 900})
    opened = context.new_page()
    opened.goto(fleet.console.url + "/")
    yield opened
    context.close()


def _screenshot(page: Page, fleet: Fleet, name: str) -> None:
    if fleet.kind == "activemq":
        IMAGES.mkdir(exist_ok=True)
        page.screenshot(path=str(IMAGES / f"console-{name}.png"), full_page=True)


def _read_after(page: Page, when: float) -> None:
    """Reload the page until the console read both containers after ``when``."""
    deadline = time.monotonic() + WAIT_MS / 1000
    while min(float(page.locator(f"#container-{i}").get_attribute("data-read-at") or 0)
              for i in (0, 1)) <= when:
        assert time.monotonic() < deadline, "the console read no container again"
        page.reload()


def _row(page: Page, container: int) -> Any:
    return page.locator(f'tr.listener[data-listener="{LISTENER}"][data-container="{container}"]')


def test_the_page_lists_every_container_listener_and_member(page: Page, fleet: Fleet) -> None:
    expect(page.locator("#container-0")).to_have_attribute("data-state", "ready")
    expect(page.locator("#container-1")).to_have_attribute("data-state", "ready")
    expect(page.locator("#container-2")).to_have_attribute("data-state", "down")
    expect(page.locator("#container-2")).to_contain_text("cannot reach")
    for index, server in enumerate(("shop_1", "shop_2")):
        expect(page.locator(f"#container-{index}")).to_contain_text(server)
        row = _row(page, index)
        expect(row).to_contain_text(f"queue:{fleet.ledger}")
        member = row.locator(".member")
        expect(member).to_have_count(1)
        expect(member).to_have_attribute("data-state", "up")
        expect(member).to_contain_text(f"127.0.0.1:{fleet.broker.port}")
    _screenshot(page, fleet, "fleet")


def test_a_script_in_a_header_is_shown_as_text(page: Page, fleet: Fleet) -> None:
    dialogs: list[object] = []
    page.on("dialog", lambda dialog: dialogs.append(dialog))
    failed = f"queue:{fleet.ledger}.DLQ"
    message_id = _off_the_loop(partial(send, fleet.broker.url, failed, "poison", note=SCRIPT))
    page.goto(f"{fleet.console.url}/failed/{quote(failed, safe='')}/{quote(message_id, safe='')}")
    expect(page.locator("main")).to_contain_text(SCRIPT)
    expect(page.locator("main script")).to_have_count(0)
    assert dialogs == []


def test_an_action_without_the_token_is_refused(page: Page, fleet: Fleet) -> None:
    refused = page.request.post(
        fleet.console.url + f"/containers/0/listeners/{LISTENER}/pause",
        form={"csrf": "guessed"})
    assert refused.status == 403
    page.reload()
    expect(_row(page, 0).locator(".paused-state")).to_have_attribute("data-paused", "false")


def test_pause_and_resume_from_the_page_while_messages_flow(page: Page, fleet: Fleet) -> None:
    page.goto(fleet.console.url + "/login")
    page.fill('input[name="token"]', TOKEN)
    page.click('button:has-text("Log in")')
    expect(page.locator("h1")).to_have_text("Overview")
    flowing: list[str] = []
    stop = threading.Event()

    def send_until_stopped() -> None:
        while not stop.is_set():
            batch = [f"flowing-{len(flowing) + i}" for i in range(10)]
            fleet.send(batch)
            flowing.extend(batch)
            stop.wait(0.05)  # a steady flow, not a burst the containers finish at once

    sender = threading.Thread(target=send_until_stopped)
    sender.start()
    try:
        fleet.done(20)  # messages flow
        for index in (0, 1):
            _row(page, index).locator('button:has-text("pause")').click()
            expect(_row(page, index).locator(".paused-state")).to_have_attribute(
                "data-paused", "true")
    finally:
        stop.set()
        sender.join()
    for index in (0, 1):  # what was in flight finished and settled
        expect(_row(page, index).locator(".in-flight")).to_have_text("0", timeout=WAIT_MS)
    counts = [_row(page, index).locator(".counts").inner_text() for index in (0, 1)]
    paused = [f"paused-{i}" for i in range(20)]
    fleet.send(paused)
    _read_after(page, time.time() + 1)  # time enough for a container that was not paused
    for index in (0, 1):
        expect(_row(page, index).locator(".member")).to_have_attribute("data-state", "paused")
    _screenshot(page, fleet, "paused")
    assert [_row(page, index).locator(".counts").inner_text() for index in (0, 1)] == counts
    assert not set(fleet.done_now()) & set(paused)
    for index in (0, 1):
        _row(page, index).locator('button:has-text("resume")').click()
        expect(_row(page, index).locator(".paused-state")).to_have_attribute(
            "data-paused", "false")
    for index in (0, 1):  # both subscribed again, as the page keeps reloading itself shows
        expect(_row(page, index).locator(".member")).to_have_attribute(
            "data-state", "up", timeout=WAIT_MS)
    fleet.done(len(flowing) + len(paused) - len(fleet.done_now()))
    finished = Counter(fleet.done_now())
    assert set(finished) == set(flowing) | set(paused)  # nothing lost
    assert all(count == 1 for count in finished.values()), finished  # nothing twice
    page.reload()
    rates = _row(page, 0).locator("polyline.processed").get_attribute("data-rates") or ""
    assert max(map(float, rates.split())) > 0
    _screenshot(page, fleet, "fleet")  # the docs' picture, with its rates


def test_a_listener_shows_its_handler_latency_once_messages_flowed(page: Page,
                                                                   fleet: Fleet) -> None:
    # After the pause test, which takes every delivery the fleet finished for its own.
    fleet.send([f"timed-{i}" for i in range(4)])
    fleet.done(4)
    timed = page.locator(f'tr.listener[data-listener="{LISTENER}"] .latency').filter(
        has_text=re.compile(r"^[0-9.e+-]+/[0-9.e+-]+ ms$"))
    expect(timed.first).to_be_visible()  # the page reloads itself: read again until shown


def test_a_broker_killed_shows_its_members_reconnecting_then_up(page: Page,
                                                                fleet: Fleet) -> None:
    fleet.broker.kill()
    member = _row(page, 0).locator(".member")
    expect(member).to_have_attribute("data-state", "reconnecting", timeout=WAIT_MS)
    expect(page.locator("#container-0")).to_have_attribute("data-state", "unready")
    _screenshot(page, fleet, "reconnecting")
    fleet.broker.start()
    for index in (0, 1):
        expect(_row(page, index).locator(".member")).to_have_attribute(
            "data-state", "up", timeout=WAIT_MS)
    expect(page.locator("#container-0")).to_have_attribute("data-state", "ready",
                                                           timeout=WAIT_MS)


@pytest.mark.activemq
def test_a_partitioned_queue_on_three_brokers_one_killed(browser: Browser, tmp_path: Path) -> None:
    """Its member on the killed broker is shown reconnecting, then up; the others stay up."""
    ledger = f"console_{uuid.uuid4().hex[:8]}"
    lines: queue.Queue[dict[str, Any]] = queue.Queue()
    port = free_port()
    with private_brokers("activemq", 3) as brokers:
        names = ("a", "b", "c")
        topology = Settings(
            brokers={n: BrokerSettings(url=b.url, reconnect_delay=0.2, reconnect_max_delay=1.0)
                     for n, b in zip(names, brokers, strict=True)},
            destinations={f"queue:{ledger}": DestinationSettings(
                members=[MemberSettings(broker=n) for n in names])})
        with ContainerProcess(topology, ledger, "shop", "shop_1", hang=False, lines=lines,
                              env={"MDB_HEALTH_PORT": str(port)}):
            while lines.get(timeout=WAIT_MS / 1000).get("event") != "ready":
                pass
            config = tmp_path / "console.toml"
            config.write_text(f'[console]\ncontainers = ["http://127.0.0.1:{port}"]\n'
                              "port = 0\nrefresh = 2\n")
            console = ConsoleProcess(config, tmp_path)
            context = browser.new_context()
            try:
                page = context.new_page()
                page.goto(console.url + "/")
                members = _row(page, 0).locator(".member")
                expect(members).to_have_count(3)
                for name in names:
                    expect(members.and_(page.locator(f'[data-broker="{name}"]'))) \
                        .to_have_attribute("data-state", "up")
                brokers[1].kill()
                killed = members.and_(page.locator('[data-broker="b"]'))
                expect(killed).to_have_attribute("data-state", "reconnecting", timeout=WAIT_MS)
                for name in ("a", "c"):
                    expect(members.and_(page.locator(f'[data-broker="{name}"]'))) \
                        .to_have_attribute("data-state", "up")
                brokers[1].start()
                expect(killed).to_have_attribute("data-state", "up", timeout=WAIT_MS)
            finally:
                context.close()
                console.stop()
