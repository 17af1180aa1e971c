"""A retry copy held back by ActiveMQ's scheduler (on in the reference config) expires when the
message it copies would have: a Java producer's JMSExpiration, read back by mdb and by Java.

ActiveMQ's scheduler restarts a held message's time to live when it releases it (its
``expiration - timestamp`` counted again from then): a copy sent with the original's absolute
``expires`` came out with its expiry slipped by the delay, and was handled again after the
original had expired. docs/activemq.md#redelivery-delays says what mdb sends instead.
"""

from __future__ import annotations

from typing import cast

import anyio.to_thread
import pytest

from mdb import Context, Redelivery, listener
from tests.harness.apps.in_process import Calls, running, settings_for, unique
from tests.harness.servers.activemq import ActiveMQ
from tests.harness.traffic.java import JmsTool

pytestmark = [pytest.mark.anyio, pytest.mark.activemq]

JavaBroker = tuple[ActiveMQ, JmsTool]


async def test_a_copy_that_would_outlive_its_message_expires_into_the_dead_letter_queue(
        java_broker: JavaBroker) -> None:
    """A time to live shorter than the redelivery delay: the copy's expiry passes while the
    scheduler holds it, so ActiveMQ expires it into ``ActiveMQ.DLQ`` when it comes out, with
    the original's expiry, and no handler sees the message again."""
    broker, java = java_broker
    queue = unique("expiring")
    calls = Calls()

    @listener(f"queue:{queue}", redelivery=Redelivery(limit=1, delay=6.0))
    async def handler(body: str, ctx: Context) -> None:
        calls.add("seen", ctx.headers.get("expires"))
        raise RuntimeError("fails at once")

    async with running(settings_for(broker.url), handler):
        sent = await anyio.to_thread.run_sync(
            lambda: java.send(queue, "text", "short-lived", JMSTimeToLive=3000, probe=queue))
        [expired] = await anyio.to_thread.run_sync(
            lambda: java.receive("ActiveMQ.DLQ", 1, selector=f"probe = '{queue}'"))
    # Dead-lettered by the broker: nothing is left to be delivered again.
    assert calls.of("seen") == [sent["JMSExpiration"]]
    assert expired["text"] == "short-lived"
    assert expired["properties"]["mdb_delivery_count"] == "2"
    assert expired["properties"]["originalExpiration"] == sent["JMSExpiration"]


async def test_a_delayed_copy_keeps_the_originals_expiry(java_broker: JavaBroker) -> None:
    """A copy the scheduler releases before its expiry carries the same absolute expiry as
    the message it copies (it was the original's plus the time the scheduler held it)."""
    broker, java = java_broker
    queue = unique("expires_later")
    calls = Calls()

    @listener(f"queue:{queue}", redelivery=Redelivery(limit=1, delay=0.5))
    async def handler(body: str, ctx: Context) -> None:
        calls.add("seen", ctx.headers.get("expires"))
        if len(calls.of("seen")) == 1:
            raise RuntimeError("once")

    async with running(settings_for(broker.url), handler):
        sent = await anyio.to_thread.run_sync(
            lambda: java.send(queue, "text", "long-lived", JMSTimeToLive=60_000))
        await calls.wait(lambda c: len(c.of("seen")) == 2)
    first, again = (cast(str, expires) for expires in calls.of("seen"))
    assert again == first == sent["JMSExpiration"]
