"""The health endpoint's controls, ``POST /listeners/NAME/pause`` and ``.../resume``
(mdb/serving/http/routes.py): refused without the token, or a wrong one, changing nothing; a
body past 4 KiB refused; an unknown listener named with the known ones; what ``mdb status``
and ``/metrics`` then say (docs/health.md, "Pause and resume")."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import anyio.to_thread
import pytest
from pydantic import SecretStr

from mdb import Container, listener
from mdb.container.report import status_report
from mdb.serving.http.client import fetch_status
from mdb.serving.http.routes import HealthServer
from mdb.serving.process import serve
from tests.harness.apps.in_process import memory_broker, running, settings_for, unique
from tests.harness.processes.cli import mdb, one_line

pytestmark = pytest.mark.anyio

TOKEN = "a-token-of-32-characters-or-so-1"


@asynccontextmanager
async def controlled(token: str | None) -> AsyncIterator[tuple[Container, str]]:
    url, _ = memory_broker("controls")

    @listener(f"queue:{unique('orders')}")
    async def orders(body: str) -> None: ...

    async with running(settings_for(url), orders) as container:
        server = HealthServer(container.health, act=partial(serve.act, container),
                              token=None if token is None else SecretStr(token))
        server.start()
        try:
            yield container, f"http://127.0.0.1:{server.port}"
        finally:
            server.close()


async def post(url: str, path: str, token: str | None = TOKEN,
               body: bytes = b"") -> tuple[int, dict[str, object]]:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    request = urllib.request.Request(f"{url}{path}", data=body, method="POST", headers=headers)

    def send() -> tuple[int, dict[str, object]]:
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    return await anyio.to_thread.run_sync(send)


async def test_a_post_with_the_token_pauses_and_resumes_and_status_says_so() -> None:
    async with controlled(TOKEN) as (container, url):
        assert await post(url, "/listeners/orders/pause") == (
            200, {"listener": "orders", "paused": True, "workers": 1})
        assert container.deployed[0].paused
        health = await anyio.to_thread.run_sync(fetch_status, url, 10.0)
        assert health.listeners[0].paused and health.ready
        assert "orders    0/1, paused" in status_report(health, url)
        assert await post(url, "/listeners/orders/resume") == (
            200, {"listener": "orders", "paused": False, "workers": 1})
        assert not container.deployed[0].paused


async def test_without_the_token_nothing_changes() -> None:
    async with controlled(TOKEN) as (container, url):
        for token in (None, "a-token-of-32-characters-or-so-2", TOKEN[:-1], ""):
            status, said = await post(url, "/listeners/orders/pause", token)
            assert status == 403 and "token" in str(said["error"]), (token, said)
        assert not container.deployed[0].paused
    async with controlled(None) as (container, url):
        assert await post(url, "/listeners/orders/pause") == (
            403, {"error": "control is off: set control_token_file"})
        assert not container.deployed[0].paused


async def test_a_body_past_4_kib_an_unknown_listener_and_a_get_are_refused() -> None:
    async with controlled(TOKEN) as (container, url):
        status, said = await post(url, "/listeners/orders/pause", body=b"x" * 4097)
        assert status == 413 and not container.deployed[0].paused
        assert (await post(url, "/listeners/orders/pause", body=b"x" * 4096))[0] == 200
        status, said = await post(url, "/listeners/order/resume")
        assert status == 404 and "its listeners: orders" in str(said["error"])
        status, said = await post(url, "/status")
        assert status == 405

        def get() -> int:
            try:
                urllib.request.urlopen(f"{url}/listeners/orders/resume", timeout=10)
            except urllib.error.HTTPError as exc:
                return exc.code
            return 200

        assert await anyio.to_thread.run_sync(get) == 404
        assert container.deployed[0].paused


def test_mdb_pause_without_a_token_or_an_endpoint_says_so_in_one_line(tmp_path: Path) -> None:
    without = mdb("pause", "orders", "--url", "http://127.0.0.1:9", cwd=tmp_path)
    assert without.returncode == 2
    assert "give --token-file FILE, or set control_token_file" in one_line(without.stderr)
    token = tmp_path / "token"
    token.write_text(TOKEN)
    nobody = mdb("resume", "orders", "--url", "http://127.0.0.1:9", "--token-file", str(token),
                 cwd=tmp_path)
    assert nobody.returncode == 3 and "cannot reach" in one_line(nobody.stderr)
    unreadable = mdb("pause", "orders", "--url", "http://127.0.0.1:9", "--token-file",
                     str(tmp_path / "missing"), cwd=tmp_path)
    assert unreadable.returncode == 2 and "--token-file" in one_line(unreadable.stderr)
