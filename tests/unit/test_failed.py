"""The failed-message workflow on the memory broker (``mdb.failed``, docs/failed-messages.md):
what reached an error destination is listed without being taken, replayed once the handler is
fixed (each message processed once, its identity kept) and purged by selection."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from mdb import Redelivery, failed_command, listener
from mdb.broker import Delivery
from mdb.cli import _parser
from mdb.destinations import Destination
from mdb.errors import ConfigurationError, ConnectionLost
from mdb.failed import Failed, Selection
from mdb.settings import Settings, load_settings
from mdb.testing import SyncRunner
from mdb.topology import Member
from mdb_memory.state import broker_state

pytestmark = pytest.mark.anyio

broken = {"on": True}
processed: list[str] = []


@listener("queue:dlq_orders", redelivery=Redelivery(limit=1, delay=0))
async def on_order(body: str) -> None:
    if broken["on"] and body.startswith("bad"):
        raise ValueError(f"cannot take {body}")
    if body.startswith("worse"):
        raise KeyError(body)
    processed.append(body)


@pytest.fixture(autouse=True)
def fresh() -> None:
    broken["on"] = True
    processed.clear()


async def test_list_shows_the_failure_and_leaves_the_messages(mdb_runner: SyncRunner) -> None:
    async with mdb_runner.run(on_order) as app:
        bad = await app.send("queue:dlq_orders", "bad 1")
        await app.send("queue:dlq_orders", "worse 1")
        await app.idle(fail_fast=False)
        errors = app.error_destination("queue:dlq_orders.DLQ")
        listed = [f async for f in errors.list()]
        again = [f.id async for f in errors.list()]
        assert [f.id for f in listed] == again  # browsing took nothing
        [failed] = [f async for f in errors.list(Selection(error_type="ValueError"))]
        assert failed.id == bad
        assert failed.original_destination == "queue:dlq_orders"
        assert failed.listener == "on_order"
        assert failed.delivery_count == 2
        assert "cannot take bad 1" in failed.error_message
        assert failed.failed_at is not None
        assert (await errors.show(bad)).body == b"bad 1"
        with pytest.raises(ConfigurationError, match="no message 'nope'"):
            await errors.show("nope")
        assert [f async for f in errors.list(Selection(older_than=timedelta(days=1)))] == []


async def test_replay_once_fixed_processes_each_once_and_keeps_the_rest(
        mdb_runner: SyncRunner) -> None:
    async with mdb_runner.run(on_order) as app:
        first = await app.send("queue:dlq_orders", "bad 1")
        worse = await app.send("queue:dlq_orders", "worse 1")
        second = await app.send("queue:dlq_orders", "bad 2")
        await app.idle(fail_fast=False)
        errors = app.error_destination("queue:dlq_orders.DLQ")
        broken["on"] = False
        dry = await errors.replay(Selection(error_type="ValueError"), dry_run=True)
        assert dry.taken == 2 and [f.id async for f in errors.list()] == [first, worse, second]
        done = await errors.replay(Selection(error_type="ValueError"))
        assert (done.taken, done.moved_back) == (2, 1)
        await app.settled(second)
        await app.idle(fail_fast=False)
        assert sorted(processed) == ["bad 1", "bad 2"]
        assert [f.id async for f in errors.list()] == [worse]
        # Replaying again what is no longer there replays nothing.
        assert (await errors.replay(Selection(ids=frozenset({first})))).taken == 0


async def test_a_replayed_message_that_fails_again_is_retried_afresh_and_keeps_its_history(
        mdb_runner: SyncRunner) -> None:
    async with mdb_runner.run(on_order) as app:
        sent = await app.send("queue:dlq_orders", "bad 1")
        await app.idle(fail_fast=False)
        errors = app.error_destination("queue:dlq_orders.DLQ")
        await errors.replay()  # not fixed: it fails again, through its retries
        [failed] = await app.take("queue:dlq_orders.DLQ")
        assert failed.id == sent
        assert failed.headers["mdb_delivery_count"] == "2"  # retried afresh, not moved at once
        assert failed.headers["mdb_replays"] == "1"
        assert failed.headers["mdb_last_error_type"] == "ValueError"
        assert processed == []


async def test_purge_removes_only_the_selection(mdb_runner: SyncRunner) -> None:
    async with mdb_runner.run(on_order) as app:
        await app.send("queue:dlq_orders", "bad 1")
        worse = await app.send("queue:dlq_orders", "worse 1")
        await app.send("queue:dlq_orders", "bad 2")
        await app.idle(fail_fast=False)
        errors = app.error_destination("queue:dlq_orders.DLQ")
        purged = await errors.purge(Selection(selector="mdb_error_type = 'ValueError'"))
        assert purged.taken == 2
        assert [f.id async for f in errors.list()] == [worse]


def test_a_selector_mdb_cannot_read_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="selector"):
        Selection(selector="mdb_error_type = ")


def _settings_of(url: str) -> Settings:
    return load_settings(None, brokers={"default": {"url": url}})


async def _command(line: str, settings: Settings) -> int:
    args = _parser().parse_args(line.split())
    code: int = await args.command(args, settings)
    return code


async def test_mdb_dlq_lists_shows_replays_and_purges(
        mdb_runner: SyncRunner, capsys: pytest.CaptureFixture[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # In this process the test's memory broker can be reached; the command refuses an
    # embedded broker only because, run as a command, it would make an empty one of its own.
    monkeypatch.setattr(failed_command, "refuse_embedded", lambda *_: None)
    async with mdb_runner.run(on_order) as app:
        bad = await app.send("queue:dlq_orders", "bad 1")
        worse = await app.send("queue:dlq_orders", "worse 1")
        await app.idle(fail_fast=False)
        settings = _settings_of(mdb_runner.url)
        capsys.readouterr()

        assert await _command("dlq list queue:dlq_orders.DLQ", settings) == 0
        table = capsys.readouterr().out.splitlines()
        assert table[0] == ("ID".ljust(32) + "  " + "FROM".ljust(20) + "  " + "TYPE".ljust(20)
                            + "  COUNT  FAILED AT (UTC)      BYTES     ERROR")
        assert table[1].startswith(f"{bad}  queue:dlq_orders      ValueError            2      ")
        assert table[1].endswith("  5         cannot take bad 1")
        assert table[-3:] == ["       1  ValueError", "       1  KeyError", "       2  in all"]

        assert await _command("dlq list queue:dlq_orders.DLQ --json --error-type KeyError",
                              settings) == 0
        rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert [r.get("id") for r in rows[:-1]] == [worse]
        assert rows[-1] == {"counts": {"KeyError": 1}, "total": 1}

        raw = tmp_path / "body.bin"
        assert await _command(f"dlq show {bad} queue:dlq_orders.DLQ --raw {raw}", settings) == 0
        shown = capsys.readouterr().out
        assert "error_type: ValueError" in shown and "  cannot take bad 1" in shown
        # Where it was raised, as mdb recorded it on the error copy.
        traceback = shown.partition("traceback:\n")[2].partition("headers:\n")[0]
        assert ", in on_order\n" in traceback and "raise ValueError" in traceback
        assert raw.read_bytes() == b"bad 1"
        with pytest.raises(ConfigurationError, match="no message 'nope'"):
            await _command("dlq show nope queue:dlq_orders.DLQ", settings)

        broken["on"] = False
        assert await _command("dlq replay queue:dlq_orders.DLQ --error-type ValueError "
                              "--dry-run", settings) == 0
        assert capsys.readouterr().out == "would replay 1 message(s)\n"
        assert await _command("dlq replay queue:dlq_orders.DLQ --id " + bad, settings) == 0
        assert capsys.readouterr().out == "replayed 1 message(s)\n"
        await app.settled(bad)
        assert processed == ["bad 1"]

        with pytest.raises(ConfigurationError, match=r"1 message\(s\) .* selected; confirm"):
            await _command("dlq purge queue:dlq_orders.DLQ", settings)
        assert await _command("dlq purge queue:dlq_orders.DLQ --yes", settings) == 0
        assert capsys.readouterr().out.splitlines()[-1] == "purged 1 message(s)"
        assert [f async for f in app.error_destination("queue:dlq_orders.DLQ").list()] == []


@pytest.mark.parametrize(("destination", "said"), [
    ("topic:prices", "topic:prices: an error destination is a queue"),
    ("queue:prices.DLQ", "mdb dlq queue:prices.DLQ: broker 'default' is the embedded "
                         "memory:// broker"),
])
def test_mdb_dlq_on_what_it_cannot_read_exits_2_in_one_line(
        tmp_path: Path, destination: str, said: str) -> None:
    result = subprocess.run([sys.executable, "-m", "mdb.cli", "dlq", "list", destination],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.startswith(f"mdb: configuration error: {said}")
    assert result.stderr.count("\n") == 1


def test_what_is_shown_of_a_failure_masks_secrets_and_bounds_the_text() -> None:
    delivery = Delivery(Destination.parse("queue:x.DLQ"), b"\x00\xff", {
        "mdb_id": "m-1", "mdb_error_type": "OSError",
        "mdb_error_message": "cannot reach postgresql://app:hunter2@db/x " + "y" * 300,
        "mdb_failed_at": "2026-11-27T23:00:00.000+00:00"}, None, False, None)
    failed = Failed.of(delivery, Member("default", delivery.destination))
    shown = failed.summary()["error"]
    assert isinstance(shown, str) and "hunter2" not in shown and len(shown) == 200
    assert "hunter2" not in failed.shown_headers()["mdb_error_message"]
    assert failed.shown_body() == "00ff"  # bytes that are not text, as hexadecimal


async def test_a_replay_whose_broker_goes_away_mid_way_loses_and_doubles_nothing(
        mdb_runner: SyncRunner) -> None:
    async with mdb_runner.run(on_order) as app:
        sent = [await app.send("queue:dlq_orders", f"bad {i}") for i in range(4)]
        await app.idle(fail_fast=False)
        errors = app.error_destination("queue:dlq_orders.DLQ")
        broken["on"] = False
        state = broker_state(mdb_runner.url.removeprefix("memory://"))

        def drop_after_two(done: int, total: int) -> None:
            if done == 2:
                state.drop_connections()  # every connection of the broker, the replay's too

        with pytest.raises(ConnectionLost):
            await errors.replay(progress=drop_after_two)
        assert (await errors.replay()).taken == 2
        for message_id in sent:
            await app.settled(message_id)
        await app.idle(fail_fast=False)
        assert sorted(processed) == [f"bad {i}" for i in range(4)]
        assert [f async for f in errors.list()] == []
