"""Counts in what mdb says are in the grammatical number they take: one delivery, one
connection, two deliveries."""

from __future__ import annotations

import logging

import pytest

from mdb import Redelivery, listener
from mdb.config.settings import Settings
from mdb.container.report import plan_table, status_report
from mdb.listeners.listener import spec_of
from mdb.observability.health import Health, ListenerHealth, StuckHandler
from mdb.routing.planning import plan_listeners
from mdb.testing import SyncRunner

pytestmark = pytest.mark.anyio


@listener("queue:counted", redelivery=Redelivery(limit=0))
async def refuse(body: str) -> None:
    raise ValueError(f"refused {body}")


async def test_a_message_moved_after_one_delivery_says_one_delivery(
        mdb_runner: SyncRunner, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="mdb.delivery"):
        async with mdb_runner.run(refuse) as app:
            sent = await app.send("queue:counted", "once")
            await app.idle(fail_fast=False)
    [line] = [r.getMessage() for r in caplog.records if "moved to" in r.getMessage()]
    assert f"message {sent} moved to queue:counted.DLQ after 1 delivery (" in line


def test_the_plan_says_one_connection() -> None:
    settings, spec = Settings(), spec_of(refuse)
    assert spec is not None
    table = plan_table(settings, plan_listeners(settings, [spec]))
    assert table.splitlines()[1].endswith("default (memory://, 1 connection)")


def test_mdb_status_says_a_listeners_one_slot_is_stuck() -> None:
    stuck = ListenerHealth("on_slow", members=1, subscribed=1, in_flight=1, processed=0,
                           slots=1, stuck=(StuckHandler("m-1", 90.0),))
    report = status_report(Health(live=True, ready=False, listeners=(stuck,)), "http://mdb")
    assert ("because listener on_slow has its one slot stuck in a handler past its "
            "handler_timeout") in report
