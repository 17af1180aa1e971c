"""The example's listeners. Run them with ``mdb run examples.orders.listeners``."""

from __future__ import annotations

from dependency_injector.wiring import Provide

from examples.orders.console import say
from examples.orders.models import Invoice, Order
from examples.orders.services import OrderBook, Services
from mdb import Context, Distribution, Redelivery, listener


@listener("queue:orders", pool=4, redelivery=Redelivery(limit=2, delay=0.5))
async def on_order(order: Order, ctx: Context, book: OrderBook = Provide[Services.book]) -> None:
    """Record the order and invoice it; the invoice is sent only if this handler succeeds."""
    if order.sku == "POISON":
        raise ValueError(f"order {order.id}: cannot price sku POISON")
    if order.flaky and ctx.delivery_count == 1:
        raise TimeoutError(f"order {order.id}: warehouse timed out (first delivery only)")
    await book.record(order)
    amount = order.quantity * order.price
    await ctx.send("queue:invoices", Invoice(order_id=order.id, amount=amount))
    # On a partitioned topic the key picks the member: one order's events stay in order.
    await ctx.send("topic:order_events", {"order": order.id, "amount": amount}, key=order.id)
    if ctx.redelivered:
        say(f"orders: {order.id} succeeded on delivery {ctx.delivery_count}")


@listener("queue:invoices")
def on_invoice(invoice: Invoice, book: OrderBook = Provide[Services.book]) -> None:
    """A plain ``def`` handler: it runs in a worker thread."""
    book.invoice(invoice)


@listener("topic:order_events", distribution=Distribution.ONE_COPY_PER_SERVER)
async def on_order_event(event: dict[str, object]) -> None:
    """Every server gets every event (a per-server cache or dashboard, say)."""
    say(f"events: order {event['order']} accepted, {event['amount']:.2f}")


@listener("queue:orders.DLQ")
async def on_failed_order(body: bytes, ctx: Context) -> None:
    """The error destination of ``on_order``: the failure travels in the headers."""
    h = ctx.headers
    say(f"errors: {h.get('mdb_original_destination')} message {ctx.id} gave up after "
        f"{h.get('mdb_delivery_count')} deliveries: {h.get('mdb_error_type')}: "
        f"{h.get('mdb_error_message')}")
