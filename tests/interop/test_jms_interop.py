"""Java services and mdb on one ActiveMQ: what crosses intact, and what does not yet
(docs/interop.md).

Two ways mdb could change what a Java client sent are guarded here: a copy (a retry, or one on
the error destination) that is not the same JMS message, and a message STOMP cannot carry
handed to a handler as an empty body.
"""

from __future__ import annotations

import base64
from typing import cast

import anyio.to_thread
import pytest
from pydantic import BaseModel

from mdb import Context, Producer, Redelivery, listener
from mdb.messages.copies import original_expiry
from mdb.messages.headers import ORIGINAL_EXPIRY
from tests.harness.apps.in_process import Calls, running, settings_for, unique
from tests.harness.servers.activemq import ActiveMQ
from tests.harness.traffic.java import JmsTool

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
        await java.send_from_thread(queue, "text", "grüße from Java", region="eu")
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
        await java.send_from_thread(queue, "bytes", base64.b64encode(every).decode())
        await calls.wait(lambda c: len(c.of("seen")) == 1)
    assert calls.of("seen") == [every]


class Order(BaseModel):
    sku: str
    quantity: int


async def test_java_json_reaches_a_model_handler_and_invalid_json_the_error_destination(
        java_broker: JavaBroker) -> None:
    """A TextMessage holding JSON, from Java, into a pydantic-model handler: decoded; one that
    fails validation is not retried and reaches the error destination as Java sent it."""
    broker, java = java_broker
    queue = unique("json")
    calls = Calls()
    invalid = '{"sku": "s-2", "quantity": "many"}'

    @listener(f"queue:{queue}")
    async def handler(order: Order) -> None:
        calls.add("seen", order)

    async with running(settings_for(broker.url), handler):
        # No content type needed:
        await java.send_from_thread(queue, "text", '{"sku": "s-ü", "quantity": 3}')
        sent = await java.send_from_thread(queue, "text", invalid, JMSPriority=7, region="eu")
        [moved] = await anyio.to_thread.run_sync(lambda: java.receive(f"{queue}.DLQ", 1))
        await calls.wait(lambda c: len(c.of("seen")) == 1)
    assert calls.of("seen") == [Order(sku="s-ü", quantity=3)]
    assert (moved["kind"], moved["text"], moved["JMSPriority"]) == ("text", invalid, "7")
    assert moved["JMSExpiration"] == sent["JMSExpiration"]
    assert moved["properties"]["region"] == "eu"
    assert moved["properties"]["mdb_error_type"] == "mdb.DecodeError"
    assert "quantity" in moved["properties"]["mdb_error_message"]
    assert moved["properties"]["mdb_delivery_count"] == "1"


KEEP = {"JMSPriority": 8, "JMSTimeToLive": 3_600_000, "JMSDeliveryMode": "non-persistent",
        "JMSCorrelationID": "c-1", "JMSType": "Order", "region": "eu"}
BODIES = {"text": "keep me", "bytes": base64.b64encode(bytes(range(256))).decode()}


@pytest.mark.parametrize("kind", ["text", "bytes"])
async def test_an_error_destination_copy_keeps_the_jms_message(
        java_broker: JavaBroker, kind: str) -> None:
    """The copy on the error destination is the same JMS message: its kind (text stays text),
    priority, delivery mode, correlation id, type and properties; not its expiration, which it
    outlives (``mdb_original_expiry`` says it). It is a copy of a retry copy here: each keeps
    the message."""
    broker, java = java_broker
    queue = unique("copy")
    calls = Calls()

    @listener(f"queue:{queue}", redelivery=Redelivery(limit=1, delay=0))
    async def handler(body: bytes) -> None:
        calls.add("failed", body)
        raise RuntimeError("refused by the handler")

    async with running(settings_for(broker.url), handler):
        sent = await java.send_from_thread(queue, kind, BODIES[kind], **KEEP)
        await calls.wait(lambda c: len(c.of("failed")) == 2)
        [copy] = await anyio.to_thread.run_sync(lambda: java.receive(f"{queue}.DLQ", 1))
    assert copy["kind"] == kind
    assert copy.get(kind) == sent.get(kind)
    assert copy["JMSPriority"] == "8"
    assert copy["JMSExpiration"] == "0" != sent["JMSExpiration"]
    assert copy["properties"][ORIGINAL_EXPIRY] == original_expiry(
        int(sent["JMSExpiration"]))[ORIGINAL_EXPIRY]
    assert copy["JMSDeliveryMode"] == "non-persistent"
    assert (copy["JMSCorrelationID"], copy["JMSType"]) == ("c-1", "Order")
    assert copy["properties"]["region"] == "eu"
    assert copy["properties"]["mdb_error_type"] == "RuntimeError"


async def test_a_redelivered_copy_keeps_the_jms_message(java_broker: JavaBroker) -> None:
    """The retry copy as mdb reads it is the same message: the same STOMP headers as the
    original but for the message id, timestamp and mdb's own (and the two ActiveMQ adds as
    properties to a TextMessage sent over STOMP: ``amq-msg-type``, ``content-length``)."""
    broker, java = java_broker
    queue = unique("retry")
    calls = Calls()

    @listener(f"queue:{queue}", redelivery=Redelivery(limit=1, delay=0))
    async def handler(body: str, ctx: Context) -> None:
        calls.add("seen", (body, dict(ctx.headers)))
        if len(calls.of("seen")) == 1:
            raise RuntimeError("once")

    async with running(settings_for(broker.url), handler):
        await java.send_from_thread(queue, "text", "again", **KEEP)
        await calls.wait(lambda c: len(c.of("seen")) == 2)
    (first_body, first), (again_body, again) = (
        cast(tuple[str, dict[str, str]], seen) for seen in calls.of("seen"))
    assert again_body == first_body == "again"
    same = ("priority", "expires", "persistent", "type", "correlation-id", "region")
    assert {k: again.get(k) for k in same} == {k: first.get(k) for k in same}
    assert (again["priority"], again.get("persistent"), again.get("amq-msg-type")) == (
        "8", None, "text")
    assert again["mdb_delivery_count"] == "2"


@pytest.mark.parametrize("kind", ["map", "object", "stream", "plain"])
async def test_a_java_message_stomp_cannot_carry_is_not_processed_as_an_empty_body(
        java_broker: JavaBroker, kind: str) -> None:
    """A MapMessage (ObjectMessage, ...) reaches mdb over STOMP with an empty body: it goes to
    the error destination, saying so, never to the handler as an empty body that is acked."""
    broker, java = java_broker
    queue = unique(kind)
    calls = Calls()

    @listener(f"queue:{queue}", redelivery=Redelivery(limit=0))
    async def handler(body: str) -> None:
        calls.add("seen", body)

    async with running(settings_for(broker.url), handler):
        await java.send_from_thread(queue, kind, "content", region="eu")
        await java.send_from_thread(queue, "text", "after")
        await calls.wait(lambda c: "after" in c.of("seen"))
        on_error = await anyio.to_thread.run_sync(lambda: java.receive(f"{queue}.DLQ", 1))
    assert calls.of("seen") == ["after"]
    [copy] = on_error
    assert copy["properties"]["mdb_error_type"] == "mdb.UnsupportedMessageKind"
    assert copy["properties"]["region"] == "eu"


async def test_an_empty_text_message_from_mdb_is_an_empty_body(java_broker: JavaBroker) -> None:
    broker, _ = java_broker
    queue = unique("empty")
    calls = Calls()

    @listener(f"queue:{queue}")
    async def handler(body: str) -> None:
        calls.add("seen", body)

    async with running(settings_for(broker.url), handler):
        async with Producer(settings_for(broker.url)) as producer:
            await producer.send(f"queue:{queue}", "")
            await producer.send(f"queue:{queue}", b"")
        await calls.wait(lambda c: len(c.of("seen")) == 2)
    assert calls.of("seen") == ["", ""]


TYPED = {"qty:int": 3, "serial:long": 12_345_678_901, "urgent:boolean": "true",
         "ratio:double": 0.5}


async def test_a_copy_gives_java_its_typed_properties_as_strings_and_no_group(
        java_broker: JavaBroker) -> None:
    """What a copy changes for a Java reader: STOMP carries every property as text, so the
    copy's int, long, boolean and double properties are Strings (a selector ``qty = 3`` no
    longer matches it, ``qty = '3'`` does); and ActiveMQ hands no JMSXGroupID to STOMP, so
    the copy leaves its message group."""
    broker, java = java_broker
    queue = unique("typed")
    calls = Calls()

    @listener(f"queue:{queue}", pool=1, redelivery=Redelivery(limit=0))
    async def handler(body: str, ctx: Context) -> None:
        calls.add("seen", (body, dict(ctx.headers)))
        if body == "typed":
            raise RuntimeError("to the error destination")

    async with running(settings_for(broker.url), handler):
        sent = await java.send_from_thread(queue, "text", "typed", JMSXGroupID="g-1", **TYPED)
        # Handled by the one slot once the copy is sent:
        await java.send_from_thread(queue, "text", "after")
        await calls.wait(lambda c: len(c.of("seen")) == 2)
    # A message that does match ``qty = 3``, behind the copy on its queue: what the selector
    # takes first is this one, so the copy did not match.
    java.send(f"{queue}.DLQ", "text", "control", **TYPED)
    [numeric] = await anyio.to_thread.run_sync(
        lambda: java.receive(f"{queue}.DLQ", 1, selector="qty = 3"))
    [copy] = await anyio.to_thread.run_sync(
        lambda: java.receive(f"{queue}.DLQ", 1, selector="qty = '3'"))
    assert numeric["text"] == "control"
    names = [name.split(":")[0] for name in TYPED]
    assert [sent["propertyTypes"][n] for n in names] == ["Integer", "Long", "Boolean", "Double"]
    assert [copy["propertyTypes"][n] for n in names] == ["String"] * 4
    assert [copy["properties"][n] for n in names] == ["3", "12345678901", "true", "0.5"]
    _, headers = cast(tuple[str, dict[str, str]], calls.of("seen")[0])
    assert sent["properties"]["JMSXGroupID"] == "g-1"
    assert "JMSXGroupID" not in headers and "JMSXGroupID" not in copy["properties"]
