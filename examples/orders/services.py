"""The example's services, wired into handlers by dependency-injector."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator

from dependency_injector import containers, providers

from examples.orders.console import say
from examples.orders.models import Invoice, Order
from mdb import Producer, load_settings


class OrderBook:
    """Stands in for a database. Thread-safe: plain ``def`` handlers run in worker threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.orders: dict[str, Order] = {}
        self.invoiced = 0.0

    async def record(self, order: Order) -> None:
        with self._lock:
            self.orders[order.id] = order
        say(f"orders: recorded {order.id} ({order.quantity} x {order.sku})")

    def invoice(self, invoice: Invoice) -> None:
        with self._lock:
            self.invoiced += invoice.amount
            total = self.invoiced
        say(f"invoices: {invoice.order_id} billed {invoice.amount:.2f} (total {total:.2f})")


async def demo_orders(count: int) -> AsyncIterator[None]:
    """Demo traffic: ``count`` orders sent at startup, before the listeners subscribe (a queue
    keeps them). One is poison (never succeeds) and one is flaky (fails once)."""
    if count:
        # mdb run's own settings (its --config): the demo goes where the container listens.
        async with Producer(load_settings()) as producer:
            for n in range(1, count + 1):
                order = Order(id=f"o-{n}", sku="POISON" if n == 3 else f"sku-{n % 4}",
                              quantity=n, price=9.5, flaky=n == 5)
                await producer.send("queue:orders", order)
        say(f"demo: sent {count} orders to queue:orders")
    yield


class Services(containers.DeclarativeContainer):
    config = providers.Configuration()
    config.demo_orders.from_env("DEMO_ORDERS", as_=int, default=0)

    book = providers.Singleton(OrderBook)
    demo = providers.Resource(demo_orders, count=config.demo_orders)
