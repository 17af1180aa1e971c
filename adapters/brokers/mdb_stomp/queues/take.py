"""A take over STOMP (``StompConnection.take``): the messages of a queue, consumed in their order
through a subscription of prefetch 1, as a pool slot takes them, never waiting for one that will
not come. The caller settles each delivery before it asks for the next (ActiveMQ's client acks
are cumulative). A consumer over STOMP cannot be told that a queue has nothing left for it, so
how a take knows is the broker's:

* With a queue browser (ActiveMQ, ``Dialect.browse_headers``): ``watched``. When nothing came
  for as long as a receipt may take (``receipt_timeout``), it browses the queue: a browser sees
  every message still on it, those on their way to a consumer included (measured on 5.17.2),
  so when it sees none the take ends; else it waits on. That is how a take outlives a message
  that expired before it came (ActiveMQ moves it to ``ActiveMQ.DLQ`` instead of sending it),
  or that another consumer took: the time only says when to look, what the browser sees
  decides. One sent meanwhile is taken too; closed early, a take leaves nothing of its own.
* Without one (RabbitMQ): ``to_marker``. It sends an end marker of its own to the back of the
  queue first (``mdb_stomp.queues.end_marker``) and ends at it, having handed on every message
  before it that was still there; one sent meanwhile, one the caller re-sends included, is
  behind it. RabbitMQ hands on a ready message to an idle consumer at once, so nothing before
  the marker keeps it waiting but messages another consumer holds. Ended early (closed,
  cancelled), it reads on to the marker on a connection of its own, without taking anything,
  to remove it, as a browse does (``mdb_stomp.queues.read_through``). An UNSUBSCRIBE there keeps the
  delivery in flight with the connection, so the take's end, early or not, closes the
  connection: the one way to hand that delivery back.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing, suppress

import anyio

from mdb.errors import BrokerError
from mdb.messages.destinations import Destination
from mdb.seam.broker import Delivery, SubscriptionRequest
from mdb_stomp.dialects.dialect import Dialect
from mdb_stomp.protocol.wire import OpenWire, Wire
from mdb_stomp.queues.browser import browsed
from mdb_stomp.queues.end_marker import EndMarker
from mdb_stomp.queues.read_through import read_back
from mdb_stomp.subscriptions.subscription import StompSubscription, ack_alone


async def _subscribed(wire: Wire, dialect: Dialect, queue: Destination) -> StompSubscription:
    return await StompSubscription.open(wire, dialect, SubscriptionRequest(
        queue, None, durable=False, selector=None, prefetch=1))


async def watched(wire: Wire, dialect: Dialect, queue: Destination,
                  browser: dict[str, str]) -> AsyncGenerator[Delivery, None]:
    """The messages of ``queue`` on ``wire`` until its browser, subscribed with ``browser``
    (``Dialect.browse_headers``), sees none left (see the module docstring)."""
    subscription = await _subscribed(wire, dialect, queue)
    try:
        while True:
            delivery = None
            with anyio.move_on_after(wire.options.receipt_timeout):
                delivery = await subscription.receive()
            if delivery is None:  # nothing for that long: is anything left?
                async with aclosing(browsed(wire, dialect, queue, browser)) as left:
                    seen = await anext(left, None)
                delivery = subscription.receive_nowait()  # one may have come meanwhile
                if delivery is None:
                    if seen is None:
                        return
                    continue
            yield delivery
    finally:
        await subscription.close()


async def to_marker(wire: Wire, dialect: Dialect, queue: Destination,
                    open_wire: OpenWire) -> AsyncGenerator[Delivery, None]:
    """The messages of ``queue`` on ``wire`` up to this take's end marker (see the module
    docstring)."""
    subscription = await _subscribed(wire, dialect, queue)
    marker = EndMarker()
    sent = False
    try:
        await marker.send(wire, dialect, queue)
        sent = True
        while not marker.ends((delivery := await subscription.receive()).headers):
            yield delivery
        ack_alone(delivery, wire)
    except BaseException:
        if sent:  # taken off the queue as a browse ended early takes its own (read_back)
            with anyio.CancelScope(shield=True), suppress(BrokerError):
                await wire.close()
                async for _ in read_back(open_wire, dialect, queue, marker):
                    pass
        raise
    finally:
        await wire.close()  # quietly: handing back the delivery in flight so is the rule here
        await subscription.close()
