"""Request/reply (JMS reply-to and correlation id), once, on every broker: memory, ActiveMQ and
RabbitMQ."""

from __future__ import annotations

import pytest

from mdb import Context, Producer, Redelivery, ReplyTimeout, listener
from mdb.messages.headers import ERROR_TYPE, ID
from tests.harness.apps.in_process import running, settings_for, unique
from tests.harness.traffic.messages import read

pytestmark = pytest.mark.anyio


async def test_a_handler_replies_to_a_named_queue_with_the_request_id(broker_url: str) -> None:
    queue, replies = f"queue:{unique('ask')}", f"queue:{unique('answers')}"

    @listener(queue)
    async def handler(body: str, ctx: Context) -> None:
        await ctx.reply(body.upper(), {"answered_by": "mdb"})

    async with Producer(settings_for(broker_url)) as producer:
        plain = await producer.send(queue, "one", reply_to=replies)
        await producer.send(queue, "two", reply_to=replies, correlation_id="mine-2")
    async with running(settings_for(broker_url), handler):
        answers = await read(broker_url, replies, 2)
    got = {a.body: (a.correlation_id, a.headers.get("answered_by")) for a in answers}
    # The request's own correlation id, else its message id (what Producer.send returned).
    assert got == {b"ONE": (plain, "mdb"), b"TWO": ("mine-2", "mdb")}


@pytest.mark.parametrize("transacted", [True, False])
async def test_a_request_waits_for_its_reply(broker_url: str, transacted: bool) -> None:
    queue = f"queue:{unique('service')}"

    @listener(queue, pool=2, transacted=transacted)
    def handler(body: dict[str, int], ctx: Context) -> None:
        ctx.reply({"sum": body["a"] + body["b"]})

    async with running(settings_for(broker_url), handler), \
            Producer(settings_for(broker_url)) as producer:
        first = await producer.request(queue, {"a": 1, "b": 2}, timeout=30)
        second = await producer.request(queue, {"a": 5, "b": 5}, timeout=30,
                                        correlation_id="c-2")
    assert (first.body, second.body) == (b'{"sum":3}', b'{"sum":10}')
    assert second.correlation_id == "c-2"
    assert first.correlation_id and first.id != first.correlation_id


async def test_a_request_nobody_answers_times_out(broker_url: str) -> None:
    async with Producer(settings_for(broker_url)) as producer:
        with pytest.raises(ReplyTimeout):
            await producer.request(f"queue:{unique('nobody')}", "hello?", timeout=0.5)


async def test_a_reply_to_a_message_without_reply_to_fails_the_handler(broker_url: str) -> None:
    queue, errors = f"queue:{unique('noreply')}", f"queue:{unique('noreply_errors')}"

    @listener(queue, redelivery=Redelivery(limit=1, delay=0), error_destination=errors)
    async def handler(body: str, ctx: Context) -> None:
        await ctx.reply("nowhere")

    async with Producer(settings_for(broker_url)) as producer:
        sent = await producer.send(queue, "no reply-to")
    async with running(settings_for(broker_url), handler):
        [moved] = await read(broker_url, errors, 1)
    assert (moved.headers[ID], moved.headers[ERROR_TYPE]) == (sent, "mdb.errors.NoReplyTo")


async def test_reply_to_and_correlation_id_survive_a_redelivery(broker_url: str) -> None:
    queue, replies = f"queue:{unique('flaky')}", f"queue:{unique('flaky_answers')}"
    attempts: list[int] = []

    @listener(queue, redelivery=Redelivery(limit=3, delay=0))
    async def handler(body: str, ctx: Context) -> None:
        attempts.append(ctx.delivery_count)
        if ctx.delivery_count == 1:
            raise RuntimeError("first time fails")
        await ctx.reply(f"{body} at {ctx.delivery_count}")

    async with Producer(settings_for(broker_url)) as producer:
        await producer.send(queue, "retry", reply_to=replies, correlation_id="r-1")
    async with running(settings_for(broker_url), handler):
        [answer] = await read(broker_url, replies, 1)
    assert (answer.body, answer.correlation_id) == (b"retry at 2", "r-1")
    assert attempts == [1, 2]


async def test_a_request_is_answered_after_a_redelivery(broker_url: str) -> None:
    queue = f"queue:{unique('flaky_service')}"

    @listener(queue, redelivery=Redelivery(limit=3, delay=0))
    async def handler(body: str, ctx: Context) -> None:
        if ctx.delivery_count == 1:
            raise RuntimeError("first time fails")
        await ctx.reply(f"{body} at {ctx.delivery_count}")

    async with running(settings_for(broker_url), handler), \
            Producer(settings_for(broker_url)) as producer:
        reply = await producer.request(queue, "ask", timeout=30)
    assert reply.body == b"ask at 2"
