"""A partitioned topic whose three members live on three brokers, consumed in one process.

Runs on three memory brokers and on three real ActiveMQ brokers (``member_urls``). The
multi-process distribution tests are in ``test_processes``.
"""

from __future__ import annotations

from collections import Counter

import pytest

from mdb import Context, Producer, listener
from mdb.config.broker_settings import BrokerSettings
from mdb.config.settings import DestinationSettings, MemberSettings
from mdb.messages.codec import outgoing
from mdb.messages.destinations import Destination
from mdb_memory import broker_state
from tests.harness.apps.in_process import Calls, partitioned_settings, running, unique
from tests.harness.servers.process import free_port
from tests.harness.traffic.messages import read

pytestmark = pytest.mark.anyio


def _down_url(like: str) -> str:
    """A broker URL of the same kind as ``like`` that refuses every connection."""
    if like.startswith("memory://"):
        name = unique("down")
        broker_state(name).refuse_connections()
        return f"memory://{name}"
    return f"stomp+activemq://127.0.0.1:{free_port()}"


async def test_a_listener_processes_the_messages_of_every_member(member_urls: list[str]) -> None:
    topic = f"topic:{unique('orders')}"
    settings = partitioned_settings(member_urls, [topic])
    calls = Calls()

    @listener(topic, pool=2)
    async def on_order(body: str, ctx: Context) -> None:
        calls.add("seen", (ctx.id, body, ctx.destination, ctx.redelivered))

    async with running(settings, on_order), Producer(settings) as producer:
        orders = Destination.parse(topic)
        used = Counter([(await producer.send_message(orders, outgoing(f"o{n}"))).broker
                        for n in range(30)])
        await calls.wait(lambda c: len(c.of("seen")) >= 30)
    assert used == {"a": 10, "b": 10, "c": 10}  # round robin over the members
    seen = [entry for entry in calls.of("seen") if isinstance(entry, tuple)]
    assert sorted(body for _, body, _, _ in seen) == sorted(f"o{n}" for n in range(30))
    assert {(dest, again) for _, _, dest, again in seen} == {(Destination.parse(topic), False)}


async def test_a_key_keeps_its_messages_on_one_member(member_urls: list[str]) -> None:
    topic = f"topic:{unique('orders')}"
    settings = partitioned_settings(member_urls, [topic])
    orders = Destination.parse(topic)
    async with Producer(settings) as producer:
        by_key = {key: {(await producer.send_message(orders, outgoing(key), key=key)).broker
                        for _ in range(4)}
                  for key in (f"customer-{n}" for n in range(12))}
    assert all(len(members) == 1 for members in by_key.values()), by_key
    assert len(set().union(*by_key.values())) > 1  # keys spread over the members


async def test_a_producer_skips_a_member_whose_broker_is_down(member_urls: list[str]) -> None:
    queue = f"queue:{unique('spread')}"
    settings = partitioned_settings(member_urls, [])
    settings.brokers["down"] = BrokerSettings(url=_down_url(member_urls[0]), connect_timeout=5)
    settings.destinations[queue] = DestinationSettings(
        members=[MemberSettings(broker="down"), MemberSettings(broker="a")])
    async with Producer(settings) as producer:
        members = [await producer.send_message(Destination.parse(queue), outgoing(f"m{n}"))
                   for n in range(6)]
    assert {m.broker for m in members} == {"a"}
    assert sorted(d.body.decode() for d in await read(member_urls[0], queue, 6)) == \
        [f"m{n}" for n in range(6)]


async def test_handler_sends_reach_a_destination_on_another_broker_only_on_success(
    member_urls: list[str],
) -> None:
    topic, invoices = f"topic:{unique('orders')}", f"queue:{unique('invoices')}"
    settings = partitioned_settings(member_urls, [topic])
    settings.destinations[invoices] = DestinationSettings(broker="c")
    calls = Calls()

    @listener(topic, pool=1, redelivery={"limit": 1, "delay": 0})
    async def on_order(body: str, ctx: Context) -> None:
        await ctx.send(invoices, f"invoice for {body}")
        calls.add("run", (body, ctx.delivery_count))
        if body == "bad" and ctx.delivery_count == 1:
            raise RuntimeError("first delivery of 'bad' fails")

    async with Producer(settings) as producer:
        async with running(settings, on_order):
            for body in ("good", "bad", "also good"):
                await producer.send(topic, body)
            await calls.wait(lambda c: len(c.of("run")) >= 4)
        # The container stopped after its handlers settled: "end" queues behind every invoice.
        await producer.send(invoices, "end")
        invoiced = [d.body.decode() for d in await read(member_urls[2], invoices, 4)]
    assert invoiced[-1] == "end"
    assert sorted(invoiced[:-1]) == ["invoice for also good", "invoice for bad",
                                     "invoice for good"]  # none from the failed run
    assert ("bad", 2) in calls.of("run")
