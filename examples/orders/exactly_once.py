"""The orders example, exactly once (docs/exactly-once.md): ``on_order`` records each order in
SQLite with the session mdb opened for the message, and its invoice goes through the outbox:
the row, the invoice and the message's inbox entry commit together. A copy of an order already
recorded (the broker's redelivery after a lost acknowledgement) is settled without running.

    mdb db upgrade --config examples/orders/exactly_once.toml     # mdb's inbox and outbox
    DEMO_ORDERS=12 mdb run examples.orders.exactly_once --config examples/orders/exactly_once.toml
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

from dependency_injector import containers, providers
from sqlalchemy import Column, Float, Integer, MetaData, String, Table
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

from examples.orders.console import say
from examples.orders.models import Invoice, Order
from examples.orders.services import demo_orders
from mdb import Context, Redelivery, listener, load_settings
from mdb.exactly_once import database_url

CONFIG = Path(__file__).with_name("exactly_once.toml")

tables = MetaData()
orders = Table(
    "orders", tables,
    Column("id", String(100), primary_key=True),  # a second insert of one order would fail
    Column("sku", String(100), nullable=False),
    Column("quantity", Integer, nullable=False),
    Column("amount", Float, nullable=False),
)


async def made_tables() -> AsyncIterator[None]:
    """The example's own table, in the database of ``exactly_once.toml`` (an application
    makes its tables with its migrations; ``mdb db upgrade`` makes only mdb's)."""
    engine = create_async_engine(database_url(load_settings(CONFIG).databases["main"]))
    try:
        async with engine.begin() as connection:
            await connection.run_sync(tables.create_all)
    finally:
        await engine.dispose()
    yield


class Services(containers.DeclarativeContainer):
    config = providers.Configuration()
    config.demo_orders.from_env("DEMO_ORDERS", as_=int, default=0)

    tables = providers.Resource(made_tables)
    demo = providers.Resource(demo_orders, count=config.demo_orders)


@listener("queue:orders", exactly_once="main", redelivery=Redelivery(limit=2, delay=0.5))
async def on_order(order: Order, ctx: Context, session: AsyncSession) -> None:
    """Record the order and invoice it, once. A run that raises keeps neither its row nor its
    invoice: a flaky order's first run rolls back, and its redelivery records it."""
    if order.sku == "POISON":
        raise ValueError(f"order {order.id}: cannot price sku POISON")
    amount = order.quantity * order.price
    await session.execute(orders.insert().values(id=order.id, sku=order.sku,
                                                 quantity=order.quantity, amount=amount))
    await ctx.send("queue:invoices", Invoice(order_id=order.id, amount=amount))  # the outbox
    if order.flaky and ctx.delivery_count == 1:
        raise TimeoutError(f"order {order.id}: warehouse timed out (first delivery only)")
    say(f"orders: recorded {order.id} ({order.quantity} x {order.sku}), once")


@listener("queue:invoices")
async def on_invoice(invoice: Invoice) -> None:
    say(f"invoices: {invoice.order_id} billed {invoice.amount:.2f}")
