"""Whether an ActiveMQ broker holds delayed messages back: a probe of its scheduler.

ActiveMQ holds a message sent with ``AMQ_SCHEDULED_DELAY`` back only when its scheduler is on
(``schedulerSupport="true"`` on the ``<broker>``, as in the reference ``activemq.xml``). A
broker without it takes the header for a plain property and delivers the message at once,
saying nothing. Its management destination (``ActiveMQ.Scheduler.Management``) cannot tell
either over STOMP: it answers a BROWSE with advisory messages that Debian's 5.17 cannot
convert into STOMP frames (XStream is missing; the broker logs NoClassDefFoundError and
nothing arrives), and a broker without a scheduler does not answer at all.

So the probe asks by doing (measured on 5.17.2 with and without the scheduler): it subscribes
to ``PROBE_TOPIC`` with a selector naming this probe only, sends there a message held back
``PROBE_DELAY_MS``, then one not held back, and looks at what comes first. Without a scheduler
both arrive in the order sent, the held one first; with it the other one comes first. No
timing is guessed: a broker stalled for longer than the delay could make the held one come
first, and that reads as "no scheduler" — the safe mistake (the container then waits delays
out itself). The held message comes out of the scheduler later to a topic nobody listens to
any more and is dropped without a word (a temporary queue deleted meanwhile would make the
broker log an error).
"""

from __future__ import annotations

import asyncio
import uuid

import anyio

from mdb.errors import BrokerError, ConnectionLost, SubscriptionFailed
from mdb_stomp.dialects.activemq import SCHEDULED_DELAY
from mdb_stomp.protocol.receipts import ReceiptErrors
from mdb_stomp.protocol.wire import Wire

PROBE_TOPIC = "/topic/mdb.scheduler-probe"
PROBE_HEADER = "mdb_probe"  # this probe's id, which its subscription's selector names
HELD_HEADER = "mdb_probe_held"
PROBE_DELAY_MS = 60_000


class _FirstArrival:
    """The probe's subscription: keeps whether the first message to arrive was the held one
    (``settled_on_arrival``: ``ack:auto``)."""

    settled_on_arrival = True

    def __init__(self) -> None:
        self.held_first: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

    def deliver(self, headers: dict[str, str], body: bytes | str | None,
                damage: str | None = None) -> None:
        if not self.held_first.done():
            self.held_first.set_result(headers.get(HELD_HEADER) == "true")

    def connection_lost(self, why: str) -> None:
        if not self.held_first.done():
            self.held_first.set_exception(ConnectionLost(why))

    def cancelled(self, why: str) -> None:
        self.connection_lost(why)


async def probe(wire: Wire) -> str | None:
    """None when the broker on ``wire`` holds delayed messages back, else why not (the probe
    failed, or the broker delivered a held message at once). Never raises but for
    cancellation; waits at most about twice the receipt timeout."""
    probe_id = uuid.uuid4().hex
    sub_id = wire.next_id()
    arrival = _FirstArrival()
    wire.attach(sub_id, arrival)
    try:
        await wire.request(
            "SUBSCRIBE", {"destination": PROBE_TOPIC, "id": sub_id, "ack": "auto",
                          "selector": f"{PROBE_HEADER} = '{probe_id}'"},
            errors=ReceiptErrors(f"the scheduler probe's subscription to {PROBE_TOPIC}",
                                 refused=SubscriptionFailed, unconfirmed=SubscriptionFailed))
        for held in (True, False):
            headers = {"destination": PROBE_TOPIC, PROBE_HEADER: probe_id,
                       HELD_HEADER: str(held).lower()}
            if held:
                headers[SCHEDULED_DELAY] = str(PROBE_DELAY_MS)
            wire.write("SEND", headers)
        with anyio.fail_after(wire.options.receipt_timeout):
            held_first = await arrival.held_first
    except BrokerError as exc:
        return f"its scheduler could not be probed: {exc}"
    except TimeoutError:
        return (f"its scheduler could not be probed: nothing came back on {PROBE_TOPIC} "
                f"within {wire.options.receipt_timeout:g}s")
    finally:
        wire.detach(sub_id)
        wire.unsubscribe_quietly(sub_id)
    if held_first:
        return ("it delivered a message sent with AMQ_SCHEDULED_DELAY at once: set "
                'schedulerSupport="true" on its <broker>, as the reference activemq.xml does')
    return None
