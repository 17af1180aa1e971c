"""The orders example's tests, written only with ``mdb.testing`` as an application's own
tests would be (docs/testing.md shows each of them). On the memory broker, or on the broker
that ``MDB_TEST_BROKER_URL`` names."""

from __future__ import annotations

import pytest

from examples.orders import listeners
from examples.orders.models import Invoice, Order
from examples.orders.services import OrderBook
from mdb import Settings
from mdb.testing import SyncRunner

pytestmark = pytest.mark.anyio

LISTENERS = "examples.orders.listeners"


def order(id: str, sku: str = "sku-1", **values: object) -> Order:
    return Order(id=id, sku=sku, quantity=2, price=9.5, **values)


async def test_an_order_is_recorded_and_invoiced(mdb_runner: SyncRunner) -> None:
    async with mdb_runner.run(LISTENERS) as app:
        sent = await app.send("queue:orders", order("o-1"))
        [attempt] = await app.settled(sent)
        assert attempt.outcome == "processed"
        await app.idle()  # the invoice it sent is processed too
        book: OrderBook = app.services.book()  # type: ignore[union-attr]
        assert list(book.orders) == ["o-1"]
        assert book.invoiced == 19.0


async def test_a_failing_delivery_is_redelivered_after_its_delay(
        mdb_runner: SyncRunner) -> None:
    # A minute's delay, set in settings as a deployment would: the runner's clock jumps.
    settings = Settings(listeners={"on_order": {"redelivery": {"limit": 2, "delay": 60}}})
    async with mdb_runner.run(LISTENERS, settings=settings) as app:
        sent = await app.send("queue:orders", order("o-2", flaky=True))
        first, second = await app.settled(sent)
        assert (first.outcome, first.error_type) == ("redelivered", "TimeoutError")
        assert (second.outcome, second.delivery_count) == ("processed", 2)
        assert mdb_runner.clock.now() >= 60


async def test_a_poison_order_moves_to_the_error_destination(mdb_runner: SyncRunner) -> None:
    # Only on_order runs: its error destination keeps what it moves there, for take().
    async with mdb_runner.run(listeners.on_order) as app:
        sent = await app.send("queue:orders", order("o-3", sku="POISON"))
        with pytest.raises(ValueError, match="cannot price sku POISON"):
            await app.idle()  # fail fast: the handler's own exception
        [moved] = await app.take("queue:orders.DLQ")
        assert moved.id == sent
        assert moved.failure is not None
        assert moved.failure.error_type == "ValueError"
        assert moved.failure.delivery_count == 3  # the first delivery and two redeliveries
        assert moved.decode(Order).sku == "POISON"


async def test_a_handler_sends_an_invoice(mdb_runner: SyncRunner) -> None:
    async with mdb_runner.run(listeners.on_order) as app:
        await app.send("queue:orders", order("o-4"))
        await app.idle()
        [invoice] = await app.take("queue:invoices")
        assert invoice.decode(Invoice) == Invoice(order_id="o-4", amount=19.0)


async def test_every_app_on_a_topic_gets_each_event(mdb_runner: SyncRunner) -> None:
    # Two applications (each run is one) subscribed to the same topic.
    async with mdb_runner.run(listeners.on_order_event) as dashboard, \
            mdb_runner.run(listeners.on_order_event) as audit:
        sent = await dashboard.send("topic:order_events", {"order": "o-5", "amount": 19.0})
        attempts = await dashboard.settled(sent)
        assert [a.outcome for a in attempts] == ["processed", "processed"]
        assert len({a.subscription for a in attempts}) == 2
        assert all(dashboard.settings.app in a.subscription or audit.settings.app in
                   a.subscription for a in attempts if a.subscription)


class FakeBook(OrderBook):
    """A stand-in for the real service: remembers what it was asked to record."""

    def __init__(self) -> None:
        super().__init__()
        self.recorded: list[str] = []

    async def record(self, order: Order) -> None:
        self.recorded.append(order.id)


async def test_a_dependency_is_overridden(mdb_runner: SyncRunner) -> None:
    fake = FakeBook()
    async with mdb_runner.run(LISTENERS, overrides={"book": fake}) as app:
        await app.send("queue:orders", order("o-6"))
        await app.idle()
    assert fake.recorded == ["o-6"]
    assert fake.invoiced == 19.0


def test_a_plain_def_test(mdb_runner: SyncRunner) -> None:
    app = mdb_runner.start(LISTENERS)
    sent = app.send("queue:orders", order("o-7", flaky=True))
    assert [a.outcome for a in app.settled(sent)] == ["redelivered", "processed"]
    app.idle()
