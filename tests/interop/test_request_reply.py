"""Request/reply between Java and mdb on one ActiveMQ (docs/interop.md): a Java requester
with a TemporaryQueue answered by an mdb handler, mdb's ``Producer.request`` answered by a Java
replier, and a reply-to written in mdb's syntax seen by Java as its JMSReplyTo."""

from __future__ import annotations

import anyio.to_thread
import pytest

from mdb import Context, Producer, UnsupportedMessageKind, listener
from tests.harness.apps.in_process import running, settings_for, unique
from tests.harness.servers.activemq import ActiveMQ
from tests.harness.traffic.java import JmsTool

pytestmark = [pytest.mark.anyio, pytest.mark.activemq]

JavaBroker = tuple[ActiveMQ, JmsTool]


async def test_a_java_requester_gets_the_reply_of_an_mdb_handler(java_broker: JavaBroker) -> None:
    broker, java = java_broker
    queue = unique("java_asks")
    reply_tos: list[str] = []

    @listener(f"queue:{queue}")
    async def handler(body: str, ctx: Context) -> None:
        reply_tos.append(str(ctx.message.reply_to))
        await ctx.reply(body.upper(), {"answered_by": "mdb"})

    async with running(settings_for(broker.url), handler):
        asked, answer = await anyio.to_thread.run_sync(
            lambda: java.request(queue, "hello mdb"))
        correlated, correlated_answer = await anyio.to_thread.run_sync(
            lambda: java.request(queue, "again", JMSCorrelationID="java-c-1"))
    # A JMS temporary queue, as ActiveMQ names it over STOMP.
    assert len(reply_tos) == 2
    assert all(r.startswith("/remote-temp-queue/ID:") for r in reply_tos)
    assert answer is not None and correlated_answer is not None
    assert (answer["kind"], answer["text"], answer["properties"]["answered_by"]) == (
        "text", "HELLO MDB", "mdb")
    # Without a correlation id of its own, the request's JMSMessageID (the JMS convention).
    assert answer["JMSCorrelationID"] == asked["JMSMessageID"]
    assert correlated_answer["JMSCorrelationID"] == "java-c-1"
    assert correlated["JMSReplyTo"].startswith("temp-queue://")


async def test_mdb_requests_a_java_replier(java_broker: JavaBroker) -> None:
    broker, java = java_broker
    queue = unique("mdb_asks")
    async with anyio.create_task_group() as tg, Producer(settings_for(broker.url)) as producer:
        served: list[dict[str, object]] = []

        async def serve() -> None:
            served.extend(await anyio.to_thread.run_sync(lambda: java.reply_server(queue, 1)))

        tg.start_soon(serve)
        reply = await producer.request(f"queue:{queue}", "ping from Python", timeout=60)
    assert reply.body == b"reply to ping from Python"
    [request] = served
    assert reply.correlation_id == request["JMSCorrelationID"]
    assert str(request["JMSReplyTo"]).startswith("temp-queue://ID:")


@pytest.mark.parametrize("kind", ["map", "object", "stream", "plain"])
async def test_a_java_reply_stomp_cannot_carry_is_an_error_not_an_empty_body(
        java_broker: JavaBroker, kind: str) -> None:
    """A MapMessage (...) reply reaches mdb over STOMP with an empty body: the requester gets
    an mdb error saying so, never an empty body."""
    broker, java = java_broker
    queue = unique(f"mdb_asks_{kind}")
    async with anyio.create_task_group() as tg, Producer(settings_for(broker.url)) as producer:
        tg.start_soon(lambda: anyio.to_thread.run_sync(
            lambda: java.reply_server(queue, 1, kind=kind)))
        with pytest.raises(UnsupportedMessageKind, match="MapMessage, ObjectMessage"):
            await producer.request(f"queue:{queue}", "ping", timeout=60)


async def test_a_reply_to_in_mdb_syntax_is_the_jms_reply_to(java_broker: JavaBroker) -> None:
    broker, java = java_broker
    queue, replies = unique("to_java"), unique("java_answers")
    async with Producer(settings_for(broker.url)) as producer:
        await producer.send(f"queue:{queue}", "answer me", reply_to=f"queue:{replies}",
                            correlation_id="py-1")
        [request] = await anyio.to_thread.run_sync(lambda: java.reply_server(queue, 1))
    assert (request["JMSReplyTo"], request["JMSCorrelationID"]) == (f"queue://{replies}", "py-1")
    [answer] = java.receive(replies, 1)
    assert (answer["text"], answer["JMSCorrelationID"]) == ("reply to answer me", "py-1")


async def test_a_java_named_reply_queue_gets_the_reply(java_broker: JavaBroker) -> None:
    broker, java = java_broker
    queue, replies = unique("java_named"), unique("java_named_answers")
    reply_tos: list[str] = []

    @listener(f"queue:{queue}")
    async def handler(body: str, ctx: Context) -> None:
        reply_tos.append(str(ctx.message.reply_to))
        await ctx.reply(f"{body}!")

    async with running(settings_for(broker.url), handler):
        sent = await java.send_from_thread(queue, "text", "named", JMSReplyTo=replies)
        [answer] = await anyio.to_thread.run_sync(lambda: java.receive(replies, 1))
    assert reply_tos == [f"/queue/{replies}"]
    assert (answer["text"], answer["JMSCorrelationID"]) == ("named!", sent["JMSMessageID"])


async def test_a_reply_to_header_in_mdb_syntax_is_the_jms_reply_to(
        java_broker: JavaBroker) -> None:
    broker, java = java_broker
    queue, replies = unique("header_to_java"), unique("header_answers")
    async with Producer(settings_for(broker.url)) as producer:
        await producer.send(f"queue:{queue}", "answer me", {"reply-to": f"queue:{replies}"})
    [seen] = java.receive(queue, 1)
    assert seen["JMSReplyTo"] == f"queue://{replies}"
    assert "reply-to" not in seen["properties"]
