"""Java services and mdb on one ActiveMQ (issue 12): what crosses intact, and what does not yet.

The tests marked ``xfail(strict=True)`` reproduce issue 12's findings: they state the behaviour a
Java team expects and fail today; once a fix lands they pass, and ``strict`` makes the suite say
so until the mark is removed.
"""

from __future__ import annotations

import base64

import pytest

from mdb import Context, Producer, Redelivery, listener
from tests.contract.support import Calls, running, settings_for, unique
from tests.harness.activemq import ActiveMQ
from tests.harness.java import JmsTool

pytestmark = [pytest.mark.anyio, pytest.mark.activemq]

JavaBroker = tuple[ActiveMQ, JmsTool]


async def test_a_java_text_message_reaches_a_handler_intact(java_broker: JavaBroker) -> None:
    broker, java = java_broker
    queue = unique("from_java")
    calls = Calls()

    @listener(f"queue:{queue}")
    async def handler(body: str, ctx: Context) -> None:
        calls.add("seen", (body, ctx.headers.get("region")))

    async with running(settings_for(broker.url), handler):
        java.send(queue, "text", "grüße from Java", region="eu")
        await calls.wait(lambda c: len(c.of("seen")) == 1)
    assert calls.of("seen") == [("grüße from Java", "eu")]


async def test_an_mdb_text_message_reaches_java_as_text(java_broker: JavaBroker) -> None:
    broker, java = java_broker
    queue = unique("to_java")
    async with Producer(settings_for(broker.url)) as producer:
        await producer.send(f"queue:{queue}", "hello Java", {"region": "eu"})
    [seen] = java.receive(queue, 1)
    assert (seen["kind"], seen["text"], seen["properties"]["region"]) == (
        "text", "hello Java", "eu")


async def test_all_byte_values_cross_both_ways(java_broker: JavaBroker) -> None:
    broker, java = java_broker
    queue = unique("bytes")
    every = bytes(range(256))
    calls = Calls()

    @listener(f"queue:{queue}")
    async def handler(body: bytes) -> None:
        calls.add("seen", body)

    async with running(settings_for(broker.url), handler):
        java.send(queue, "bytes", base64.b64encode(every).decode())
        await calls.wait(lambda c: len(c.of("seen")) == 1)
    assert calls.of("seen") == [every]


@pytest.mark.xfail(strict=True, reason="issue 12, finding 1: an error-destination copy of a "
                   "Java TextMessage becomes a BytesMessage with default priority, no expiration "
                   "and persistent delivery")
async def test_an_error_destination_copy_keeps_the_jms_message(java_broker: JavaBroker) -> None:
    broker, java = java_broker
    queue = unique("copy")
    calls = Calls()

    @listener(f"queue:{queue}", redelivery=Redelivery(limit=0))
    async def handler(body: str) -> None:
        calls.add("failed", body)
        raise RuntimeError("refused by the handler")

    async with running(settings_for(broker.url), handler):
        java.send(queue, "text", "keep me", JMSPriority=8, JMSTimeToLive=3_600_000,
                  JMSDeliveryMode="non-persistent", JMSCorrelationID="c-1", JMSType="Order")
        await calls.wait(lambda c: len(c.of("failed")) == 1)
        [copy] = java.receive(f"{queue}.DLQ", 1)
    assert copy["kind"] == "text"
    assert copy["text"] == "keep me"
    assert copy["JMSPriority"] == "8"
    assert int(copy["JMSExpiration"]) > 0
    assert copy["JMSDeliveryMode"] == "non-persistent"
    assert (copy["JMSCorrelationID"], copy["JMSType"]) == ("c-1", "Order")


@pytest.mark.xfail(strict=True, reason="issue 12, finding 2: a MapMessage arrives over STOMP with "
                   "an empty body and is processed as an empty string: its content is lost")
async def test_a_java_map_message_is_not_processed_as_an_empty_body(
        java_broker: JavaBroker) -> None:
    broker, java = java_broker
    queue = unique("map")
    calls = Calls()

    @listener(f"queue:{queue}", redelivery=Redelivery(limit=0))
    async def handler(body: str) -> None:
        calls.add("seen", body)

    async with running(settings_for(broker.url), handler):
        java.send(queue, "map", "content")
        java.send(queue, "text", "after")
        await calls.wait(lambda c: "after" in c.of("seen"))
        on_error = java.receive(f"{queue}.DLQ", 1, timeout=5.0)
    assert calls.of("seen") == ["after"]
    assert [m["kind"] for m in on_error] == ["map"]
