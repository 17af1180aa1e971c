"""The failed-message workflow on the memory broker (``mdb.commands.dlq.failed``,
docs/failed-messages.md): what reached an error destination is listed without being taken, replayed
once the handler is fixed (each message processed once, its identity kept) and purged by
selection."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from mdb import Redelivery
from mdb.commands.cli import _parser
from mdb.commands.dlq import failed_messages
from mdb.commands.dlq.failed_message import Failed
from mdb.commands.dlq.replays import Left, replay_target
from mdb.commands.dlq.selection import Selection
from mdb.config.settings import Settings, load_settings
from mdb.errors import ConfigurationError, ConnectionLost
from mdb.messages.destinations import Destination
from mdb.messages.identity import PROCESS
from mdb.messages.message import MAX_COUNT, OutgoingMessage
from mdb.messages.topology import Member
from mdb.observability.redaction import printable
from mdb.routing.producer import Producer
from mdb.seam.broker import ConnectionOptions, Delivery
from mdb.seam.registry import broker_for
from mdb.testing import SyncRunner
from mdb_memory.state import broker_state
from tests.harness.apps.failing_orders import FailingOrders

pytestmark = pytest.mark.anyio

orders = FailingOrders("queue:dlq_orders", Redelivery(limit=1, delay=0))
on_order = orders.on_order


@pytest.fixture(autouse=True)
def fresh() -> None:
    orders.reset()


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
        orders.broken = False
        dry = await errors.replay(Selection(error_type="ValueError"), dry_run=True)
        assert dry.taken == 2 and [f.id async for f in errors.list()] == [first, worse, second]
        done = await errors.replay(Selection(error_type="ValueError"))
        assert (done.taken, done.moved_back) == (2, 1)
        await app.settled(second)
        await app.idle(fail_fast=False)
        assert sorted(orders.processed) == ["bad 1", "bad 2"]
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
        assert orders.processed == []


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


async def _command(line: str | list[str], settings: Settings) -> int:
    args = _parser().parse_args(line.split() if isinstance(line, str) else line)
    code: int = await args.command(args, settings)
    return code


async def test_mdb_dlq_lists_shows_replays_and_purges(
        mdb_runner: SyncRunner, capsys: pytest.CaptureFixture[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # In this process the test's memory broker can be reached; the command refuses an
    # embedded broker only because, run as a command, it would make an empty one of its own.
    monkeypatch.setattr(failed_messages, "refuse_embedded", lambda *_: None)
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

        orders.broken = False
        assert await _command("dlq replay queue:dlq_orders.DLQ --error-type ValueError "
                              "--dry-run", settings) == 0
        assert capsys.readouterr().out == "would replay 1 message(s)\n"
        assert await _command("dlq replay queue:dlq_orders.DLQ --id " + bad, settings) == 0
        assert capsys.readouterr().out == "replayed 1 message(s)\n"
        await app.settled(bad)
        assert orders.processed == ["bad 1"]

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
    result = subprocess.run([sys.executable, "-m", "mdb.commands.cli", "dlq", "list", destination],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.startswith(f"mdb: configuration error: {said}")
    assert result.stderr.count("\n") == 1


def test_what_is_shown_of_a_failure_masks_secrets_and_bounds_the_text() -> None:
    delivery = Delivery(Destination.parse("queue:x.DLQ"), b"\x00\xff", {
        "mdb_id": "m-1", "mdb_error_type": "OSError",
        "mdb_error_message": "cannot reach postgresql://app:hunter2@db/x " + "y" * 300,
        "mdb_failed_at": "2026-11-27T23:00:00.000+00:00"}, None, False, None)
    failed = Failed.of(delivery, Member("default", delivery.destination), PROCESS,
                       assigned=True)
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
        orders.broken = False
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
        assert sorted(orders.processed) == [f"bad {i}" for i in range(4)]
        assert [f async for f in errors.list()] == []


# -- what a producer wrote on an error copy (docs/failed-messages.md, "What a producer may
# write there") -------------------------------------------------------------------------------

def _failed(headers: dict[str, str], body: bytes = b"x") -> Failed:
    delivery = Delivery(Destination.parse("queue:x.DLQ"), body, headers, None, False, None)
    return Failed.of(delivery, Member("default", delivery.destination), PROCESS, assigned=True)


@pytest.mark.parametrize(("text", "count"), [
    ("3", 3), ("²", 1), ("٣²", 1), ("٣", 1), ("-2", 1), ("9" * 5000, MAX_COUNT), ("x", 1),
])
def test_a_delivery_count_a_producer_wrote_in_any_digits_is_read_without_failing(
        text: str, count: int) -> None:
    assert _failed({"mdb_id": "m-1", "mdb_delivery_count": text}).delivery_count == count


@pytest.mark.parametrize(("text", "shown"), [
    ("2026-11-27T23:00:00.000+05:00", "2026-11-27T18:00:00+00:00"),
    ("2026-11-27T23:00:00", "2026-11-27T23:00:00+00:00"),
    ("0001-01-01T00:00:00+23:59", None),  # before the first instant of UTC's calendar
    ("9999-12-31T23:59:59-23:59", None),  # after its last
    ("yesterday", None),
])
def test_a_failure_time_is_read_in_utc_whatever_offset_it_was_written_with(
        text: str, shown: str | None) -> None:
    failed = _failed({"mdb_id": "m-1", "mdb_failed_at": text})
    assert (None if failed.failed_at is None else failed.failed_at.isoformat()) == shown
    assert Selection(older_than=timedelta(days=1)).matches(failed, datetime.now(UTC)) in (
        True, False)


# A screen clear, a window title, CSI as one character, the line and paragraph separators, a
# right-to-left override and a forged table row.
FORGED = "\x1b[2J\x1b]0;owned\x07\x9b31m\u2028\u2029\u202e\nab12  queue:x  FORGED"


def _unprintable(text: str) -> list[str]:
    return [c for c in text.replace("\n", "") if not c.isprintable()]


async def _forged_on(url: str, destination: str) -> str:
    """A message whose every header mdb reads was written by a hostile producer."""
    headers = {"mdb_id": "id" + FORGED, "mdb_original_destination": "queue:x" + FORGED,
               "mdb_error_listener": "on_x" + FORGED, "mdb_error_type": "T" + FORGED,
               "mdb_error_message": "text" + FORGED, "mdb_failed_at": "2026" + FORGED,
               "mdb_delivery_count": "٣²", "mdb_replays": "٣²", "x" + FORGED: "v" + FORGED}
    async with Producer(_settings_of(url)) as producer:
        await producer.send_message(Destination.parse(destination),
                                    OutgoingMessage(("body" + FORGED).encode(), headers))
    return headers["mdb_id"]


async def test_what_a_producer_wrote_reaches_the_terminal_escaped_and_blocks_nothing(
        mdb_runner: SyncRunner, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(failed_messages, "refuse_embedded", lambda *_: None)
    async with mdb_runner.run(on_order) as app:
        bad = await app.send("queue:dlq_orders", "bad 1")
        await app.idle(fail_fast=False)
        forged = await _forged_on(mdb_runner.url, "queue:dlq_orders.DLQ")
        settings = _settings_of(mdb_runner.url)
        capsys.readouterr()

        assert await _command("dlq list queue:dlq_orders.DLQ", settings) == 0
        table = capsys.readouterr().out
        assert _unprintable(table) == []
        # The heading, a row per message, a line per failure type and the total: no row forged.
        assert len(table.splitlines()) == 1 + 2 + 2 + 1

        assert await _command("dlq list queue:dlq_orders.DLQ --json", settings) == 0
        lines = capsys.readouterr().out.splitlines()
        assert len(lines) == 3 and all(_unprintable(line) == [] for line in lines)
        rows = [json.loads(line) for line in lines]
        assert [row.get("id") for row in rows[:2]] == [bad, forged]  # JSON keeps the value
        assert rows[1]["delivery_count"] == 1

        shown_id = printable(forged)  # what list showed: an operator can give it as it is
        assert await _command(["dlq", "show", shown_id, "queue:dlq_orders.DLQ"], settings) == 0
        shown = capsys.readouterr().out
        assert _unprintable(shown) == [] and "FORGED" in shown

        # Nothing of it blocks the others: a replay takes the good one, a purge the other.
        orders.broken = False
        assert await _command("dlq replay queue:dlq_orders.DLQ --error-type ValueError",
                              settings) == 0
        await app.settled(bad)
        assert orders.processed == ["bad 1"]
        assert await _command("dlq purge queue:dlq_orders.DLQ --yes", settings) == 0
        assert capsys.readouterr().out.splitlines()[-1] == "purged 1 message(s)"


@pytest.mark.parametrize("age", ["99999999999d", f"{10**30}s", "1e3s", "-1d", "٣d"])
def test_an_age_beyond_any_duration_is_a_usage_error_in_one_line(
        tmp_path: Path, age: str) -> None:
    result = subprocess.run([sys.executable, "-m", "mdb.commands.cli", "dlq", "list", "queue:x.DLQ",
                             "--older-than", age], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "argument --older-than: " in result.stderr.splitlines()[-1]


@pytest.mark.parametrize("rate", ["nan", "inf", "-1", "0", "1e-400", "fast"])
def test_a_rate_that_is_no_number_of_messages_a_second_is_a_usage_error_in_one_line(
        tmp_path: Path, rate: str) -> None:
    result = subprocess.run([sys.executable, "-m", "mdb.commands.cli", "dlq", "replay",
                             "queue:x.DLQ",
                             "--rate", rate], cwd=tmp_path, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "argument --rate: " in result.stderr.splitlines()[-1]


@pytest.mark.parametrize("where", ["missing/body.bin", ".", "/dev/full"])
async def test_show_raw_where_nothing_can_be_written_is_one_line(
        mdb_runner: SyncRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        where: str) -> None:
    monkeypatch.setattr(failed_messages, "refuse_embedded", lambda *_: None)
    async with mdb_runner.run(on_order) as app:
        bad = await app.send("queue:dlq_orders", "bad 1")
        await app.idle(fail_fast=False)
        raw = tmp_path / where
        with pytest.raises(ConfigurationError, match=rf"--raw {raw}: "):
            await _command(f"dlq show {bad} queue:dlq_orders.DLQ --raw {raw}",
                           _settings_of(mdb_runner.url))


# -- where a replay sends a message (docs/failed-messages.md, "Where a replay sends a
# message") ------------------------------------------------------------------------------------

ORDERS = Destination.parse("queue:orders")
ERRORS = Destination.parse("queue:orders.DLQ")


def _origin(headers: dict[str, str], recorded: str | None = None,
            member: str = "queue:orders.DLQ") -> Destination | Left:
    delivery = Delivery(Destination.parse(member), b"x", {"mdb_id": "m-1", **headers}, None,
                        False, None)
    failed = Failed.of(delivery, Member("default", delivery.destination), PROCESS,
                       assigned=True,
                       origin=None if recorded is None else Destination.parse(recorded))
    return replay_target(failed, ERRORS, frozenset({ORDERS}))


def test_a_message_goes_back_where_a_listener_of_the_application_consumes() -> None:
    assert _origin({"mdb_original_destination": "queue:orders"}) == ORDERS
    assert _origin({}, recorded="queue:orders") == ORDERS  # where the broker says it was
    # mdb's own record first: a copy the broker moved on from the error destination.
    assert _origin({"mdb_original_destination": "queue:orders"},
                   recorded="queue:orders.DLQ") == ORDERS


@pytest.mark.parametrize(("headers", "member", "reason"), [
    ({}, "queue:orders.DLQ", "names no original destination"),
    ({"mdb_original_destination": "orders\x1b[2J"}, "queue:orders.DLQ",
     r"its original destination 'orders\\x1b\[2J' is not one mdb can name"),
    ({"mdb_original_destination": "queue:orders.DLQ"}, "queue:orders.DLQ",
     "names the error destination itself"),
    ({"mdb_original_destination": "queue:orders_dlq_b"}, "queue:orders_dlq_b",
     "names the error destination itself"),
    ({"mdb_original_destination": "topic:orders"}, "queue:orders.DLQ",
     "came from topic:orders: a replay there reaches every subscription of it"),
    ({"mdb_original_destination": "queue:payments"}, "queue:orders.DLQ",
     "came from queue:payments, where no listener of this application consumes"),
])
def test_a_message_whose_origin_is_unknown_or_not_allowed_is_left_saying_why(
        headers: dict[str, str], member: str, reason: str) -> None:
    left = _origin(headers, member=member)
    assert isinstance(left, Left) and left.id == "m-1"
    assert re.search(reason, left.reason), left.reason
    assert left.reason.isprintable()


async def test_module_says_where_a_replay_may_send_back_from_any_error_destination(
        mdb_runner: SyncRunner, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(failed_messages, "refuse_embedded", lambda *_: None)
    async with mdb_runner.run(on_order) as app:
        # An error copy of queue:dlq_orders on a destination whose name says nothing of it
        # (a broker's own dead-letter queue, or an error destination shared by listeners).
        options = ConnectionOptions(mdb_runner.url, client_id="elsewhere")
        connection = await broker_for(options).connect()
        try:
            await connection.send(Destination.parse("queue:dlq_shared"), OutgoingMessage(
                b"copied", {"mdb_id": "m-copied", "mdb_original_destination": "queue:dlq_orders"}))
        finally:
            await connection.close()
        settings = _settings_of(mdb_runner.url)
        orders.broken = False
        capsys.readouterr()

        assert await _command("dlq replay queue:dlq_shared", settings) == 1
        said = capsys.readouterr().out.splitlines()
        assert said[0].startswith("left m-copied: came from queue:dlq_orders, where no listener")
        assert said[-1] == "replayed 0 message(s); 1 left on the error destination (above)"

        assert await _command(f"dlq replay queue:dlq_shared --module {__name__}",
                              settings) == 0
        assert capsys.readouterr().out == "replayed 1 message(s)\n"
        await app.idle(fail_fast=False)
        assert orders.processed == ["copied"]
