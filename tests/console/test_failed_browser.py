"""The console's failed messages in a real browser (Debian's chromium, driven by Playwright) on
a real broker, ActiveMQ then RabbitMQ (docs/console.md, "Failed messages"): poison messages
reach the error destination of a container process; the page lists them by failure type; the
operator opens one and reads its traceback, fixes the handler and replays them from the page;
each is processed once, and the message not selected stays. The screenshots of that section
are taken here (on ActiveMQ)."""

from __future__ import annotations

import queue
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pytest
from playwright.sync_api import Page, expect, sync_playwright

from tests.harness.processes.console import ConsoleProcess
from tests.harness.processes.container_process import ROOT, ContainerProcess
from tests.harness.servers.brokers import private_brokers
from tests.harness.servers.process import free_port
from tests.harness.traffic.messages import send_all

CHROMIUM = "/usr/bin/chromium"
TOKEN = "the-fleet's-control-token"
WAIT = 90.0
IMAGES = ROOT / "docs" / "images"


def _done(lines: queue.Queue[dict[str, Any]], count: int) -> list[str]:
    """The bodies of the next ``count`` messages the container processed."""
    bodies: list[str] = []
    while len(bodies) < count:
        entry = lines.get(timeout=WAIT)
        if entry.get("event") == "done":
            bodies.append(entry["body"])
    return bodies


def _reload_until(page: Page, texts: list[str]) -> None:
    """Reload ``page`` until its counts per failure type are ``texts``: a message reaching
    the error destination says nothing to the page."""
    deadline = time.monotonic() + WAIT
    while page.locator("ul.types li").all_inner_texts() != texts:
        assert time.monotonic() < deadline, page.locator("main").inner_text()
        page.reload()


def _screenshot(page: Page, kind: str, name: str) -> None:
    if kind == "activemq":
        IMAGES.mkdir(exist_ok=True)
        page.screenshot(path=str(IMAGES / f"console-{name}.png"), full_page=True)


@pytest.mark.parametrize("kind", [pytest.param("activemq", marks=pytest.mark.activemq),
                                  pytest.param("rabbitmq", marks=pytest.mark.rabbitmq)])
def test_poison_messages_listed_by_type_read_fixed_and_replayed_from_the_page_once(
        kind: str, tmp_path: Path) -> None:
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed here (tests/run installs it)")
    token, fixed = tmp_path / "control-token", tmp_path / "fixed"
    token.write_text(TOKEN + "\n")
    ledger = f"console_failed_{uuid.uuid4().hex[:8]}"
    dlq = f"queue:{ledger}.DLQ"
    lines: queue.Queue[dict[str, Any]] = queue.Queue()
    port = free_port()
    poison = [f"poison {i}" for i in range(3)]
    with private_brokers(kind) as [broker], ContainerProcess(
            broker.url, ledger, "shop", "shop_1", hang=False, lines=lines,
            module="tests.harness.apps.poison_app",
            env={"MDB_HEALTH_PORT": str(port), "MDB_CONTROL_TOKEN_FILE": str(token),
                 "FIXED_FILE": str(fixed)}):
        while lines.get(timeout=WAIT).get("event") != "ready":
            pass
        anyio.run(send_all, broker.url, f"queue:{ledger}", [*poison, "fatal 1", "good 1"])
        assert _done(lines, 1) == ["good 1"]
        config = tmp_path / "console.toml"
        config.write_text(f'control_token_file = "{token}"\n'
                          f'[brokers.default]\nurl = "{broker.url}"\n'
                          f'[console]\ncontainers = ["http://127.0.0.1:{port}"]\nport = 0\n'
                          f'error_destinations = ["{dlq}"]\n')
        console = ConsoleProcess(config, tmp_path)
        try:
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
                try:
                    page = browser.new_context(viewport={"width": 1200, "height": 400}
                                               ).new_page()
                    page.goto(console.url + "/login")
                    page.fill('input[name="token"]', TOKEN)
                    page.click('button:has-text("Log in")')

                    page.goto(console.url + "/failed")
                    _reload_until(page, ["ValueError: 3", "KeyError: 1"])
                    expect(page.locator("main table")).to_contain_text(dlq)
                    _screenshot(page, kind, "failed")

                    page.click('ul.types a:has-text("ValueError")')
                    rows = page.locator('input[name="ids"]')
                    expect(rows).to_have_count(3)
                    page.locator("main table a").first.click()
                    traceback = page.locator("h2:has-text('Traceback') + pre")
                    expect(traceback).to_contain_text(", in on_poison")
                    expect(traceback).to_contain_text("raise ValueError(f\"cannot take {body}\")")
                    expect(page.locator("h2:has-text('Body') + pre")).to_have_text("poison 0")
                    _screenshot(page, kind, "failed-message")

                    fixed.write_text("deployed\n")  # the handler fixed
                    page.go_back()
                    for index in range(3):
                        rows.nth(index).check()
                    page.click('button:has-text("Replay selected")')
                    expect(page.locator("main")).to_contain_text("Replayed 3 message(s).")
                    assert Counter(_done(lines, 3)) == Counter(poison)  # each once

                    page.goto(console.url + "/failed")
                    _reload_until(page, ["KeyError: 1"])  # the one not selected stays
                finally:
                    browser.close()
        finally:
            console.stop()
        done = [entry for entry in list(lines.queue) if entry.get("event") == "done"]
        assert done == []  # none twice
