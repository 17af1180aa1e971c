"""A queue consumed at once by an mdb container and by a Java JMS consumer (docs/interop.md):
messages sent by either side are each processed once, by one of them, and a repeat is
flagged; a message an mdb handler fails on reaches the Java consumer as the same JMS message."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, cast

import anyio.from_thread
import anyio.to_thread
import pytest

from mdb import Context, Producer, Redelivery, listener
from tests.harness.apps.in_process import Calls, running, settings_for, unique
from tests.harness.servers.activemq import ActiveMQ
from tests.harness.traffic.java import JavaConsumer, JmsTool

pytestmark = [pytest.mark.anyio, pytest.mark.activemq]

JavaBroker = tuple[ActiveMQ, JmsTool]


@asynccontextmanager
async def consuming(java: JmsTool, queue: str, calls: Calls,
                    rollback_text: str = "") -> AsyncIterator[None]:
    """A Java consumer of ``queue`` (``JmsTool.consumer``) while the block runs; each message
    it commits or rolls back is added to ``calls`` as ``"java"``."""

    def pump(consumer: JavaConsumer) -> None:
        for seen in consumer.messages():
            anyio.from_thread.run_sync(calls.add, "java", seen)

    with java.consumer(queue, rollback_text) as consumer:
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: anyio.to_thread.run_sync(pump, consumer))
            try:
                yield
            finally:
                consumer.stop()  # the pump ends when the consumer has


def java_seen(calls: Calls) -> list[dict[str, Any]]:
    return [cast(dict[str, Any], seen) for seen in calls.of("java")]


async def test_a_copy_of_a_message_mdb_failed_on_reaches_java_as_the_same_message(
        java_broker: JavaBroker) -> None:
    """The failed message's copy goes to the back of the queue, behind one that holds mdb's
    only pool slot, so the Java consumer started then is the one that gets it."""
    broker, java = java_broker
    queue = unique("shared_copy")
    calls = Calls()
    release = anyio.Event()

    @listener(f"queue:{queue}", pool=1, redelivery=Redelivery(limit=1, delay=0))
    async def handler(body: str, ctx: Context) -> None:
        calls.add("mdb", body)
        if body == "fail":
            raise RuntimeError("refused by mdb")
        await release.wait()

    keep = {"JMSPriority": 8, "JMSTimeToLive": 3_600_000, "JMSCorrelationID": "c-1",
            "JMSType": "Order", "region": "eu"}
    sent = java.send(queue, "text", "fail", **keep)
    java.send(queue, "text", "hold", JMSPriority=8)
    async with running(settings_for(broker.url), handler):
        await calls.wait(lambda c: c.of("mdb") == ["fail", "hold"])
        async with consuming(java, queue, calls):
            await calls.wait(lambda c: len(c.of("java")) == 1)
        release.set()
    [copy] = java_seen(calls)
    assert (copy["outcome"], copy["kind"], copy["text"]) == ("committed", "text", "fail")
    assert (copy["JMSPriority"], copy["JMSExpiration"]) == ("8", sent["JMSExpiration"])
    assert (copy["JMSCorrelationID"], copy["JMSType"]) == ("c-1", "Order")
    assert copy["properties"]["region"] == "eu"
    # Not JMSRedelivered: a STOMP consumer would take a copy so flagged for one in doubt
    # (docs/activemq.md, Copies). mdb's count is the flag Java reads.
    assert (copy["JMSRedelivered"], copy["properties"]["mdb_delivery_count"]) == ("false", "2")
    assert calls.of("mdb") == ["fail", "hold"]


async def test_messages_from_both_sides_are_processed_once_by_one_consumer(
        java_broker: JavaBroker) -> None:
    """A ledger of a queue shared by two mdb pool slots and a Java consumer: mdb fails the
    first delivery of every ``fail`` message it gets, Java rolls back the first delivery of
    every ``roll back`` message it gets. Each message is processed (committed) once, and
    every delivery after a failed one is flagged a repeat."""
    broker, java = java_broker
    queue = unique("shared")
    calls = Calls()

    @listener(f"queue:{queue}", pool=2, redelivery=Redelivery(limit=3, delay=0))
    async def handler(body: str, ctx: Context) -> None:
        failing = body == "fail" and ctx.delivery_count == 1
        calls.add("mdb", (ctx.headers["n"], ctx.message.redelivered, failing))
        if failing:
            raise RuntimeError("refused by mdb")

    bodies = {f"py-{i}": ("fail", "roll back", "plain")[i % 3] for i in range(9)}
    bodies |= {"java-0": "fail", "java-1": "roll back"}
    async with running(settings_for(broker.url), handler), \
            consuming(java, queue, calls, rollback_text="roll back"):
        for n in ("java-0", "java-1"):
            await anyio.to_thread.run_sync(functools.partial(
                java.send, queue, "text", bodies[n], n=n))
        async with Producer(settings_for(broker.url)) as producer:
            for n, body in bodies.items():
                if n.startswith("py-"):
                    await producer.send(f"queue:{queue}", body, {"n": n})

        def done(c: Calls) -> set[str]:
            by_mdb = {n for n, _, failing in cast(list[tuple[str, bool, bool]], c.of("mdb"))
                      if not failing}
            by_java = {m["properties"]["n"] for m in java_seen(c)
                       if m["outcome"] == "committed"}
            return by_mdb | by_java

        await calls.wait(lambda c: done(c) == set(bodies))
    # Every attempt, in order, per message: (by whom, flagged a repeat, processed).
    attempts: dict[str, list[tuple[str, bool, bool]]] = {n: [] for n in bodies}
    for who, seen in calls.seen:
        if who == "mdb":
            n, redelivered, failing = cast(tuple[str, bool, bool], seen)
            attempts[n].append(("mdb", redelivered, not failing))
        else:
            m = cast(dict[str, Any], seen)
            count = int(m["properties"].get("mdb_delivery_count", "1"))
            repeat = m["JMSRedelivered"] == "true" or count > 1
            attempts[m["properties"]["n"]].append(("java", repeat, m["outcome"] == "committed"))
    for n, tried in attempts.items():
        assert [processed for _, _, processed in tried].count(True) == 1, (n, tried)
        assert all(repeat for _, repeat, _ in tried[1:]), (n, tried)
        assert not tried[0][1], (n, tried)
