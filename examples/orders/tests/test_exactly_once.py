"""The exactly-once variant of the orders example (``examples.orders.exactly_once``), tested
with ``mdb.testing`` on SQLite: the runner makes mdb's tables as ``mdb db upgrade`` would."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import create_async_engine

from examples.orders import exactly_once
from examples.orders.models import Invoice, Order
from mdb import Settings, load_settings
from mdb.exactly_once import database_url
from mdb.testing import SyncRunner

pytestmark = pytest.mark.anyio


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The example's settings; its SQLite file (a relative path) lands in the test's folder."""
    monkeypatch.chdir(tmp_path)
    return load_settings(exactly_once.CONFIG)


async def recorded(settings: Settings) -> list[str]:
    engine = create_async_engine(database_url(settings.databases["main"]))
    try:
        async with engine.connect() as connection:
            rows = await connection.execute(select(exactly_once.orders.c.id))
            return [row.id for row in rows]
    finally:
        await engine.dispose()


async def test_a_redelivered_order_is_recorded_and_invoiced_once(
        mdb_runner: SyncRunner, settings: Settings) -> None:
    async with mdb_runner.run(exactly_once.on_order, settings=settings) as app:
        sent = await app.send("queue:orders", Order(id="o-1", sku="s", quantity=2, price=9.5))
        await app.send_again(sent)  # the copy a broker redelivers when the ack was lost
        attempts = await app.settled(sent)
        assert [a.outcome for a in attempts] == ["processed", "already processed"]
        [invoice] = await app.take("queue:invoices")
        assert invoice.decode(Invoice) == Invoice(order_id="o-1", amount=19.0)
        assert app.container.deployed[0].stats.already_processed == 1
    assert await recorded(settings) == ["o-1"]


async def test_a_failed_run_keeps_neither_its_row_nor_its_invoice(
        mdb_runner: SyncRunner, settings: Settings) -> None:
    async with mdb_runner.run(exactly_once, settings=settings) as app:
        sent = await app.send("queue:orders", Order(id="o-5", sku="s", quantity=5, price=9.5,
                                                    flaky=True))
        first, second = await app.settled(sent)
        assert (first.outcome, second.outcome) == ("redelivered", "processed")
        await app.idle()  # and its invoice
        stats = {d.spec.name: d.stats for d in app.container.deployed}
        assert stats["on_invoice"].processed == 1  # the failed run's invoice was not sent
    assert await recorded(settings) == ["o-5"]
