"""Redelivery delays kept by the broker, on every broker: memory, ActiveMQ (its
scheduler, on in the reference config) and RabbitMQ (delay queues).

A failed message's copy is handed to the broker with its delay, in the transaction that acks
it, so its pool slot takes the next message at once; the count, the flag, the failure headers
and the error destination stay as they were. No test waits out a long delay: the one that shows
the slot is free uses a delay of an hour and never sees its end.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest

from mdb import Context, Producer, Redelivery, listener
from mdb.messages.headers import (
    DELIVERY_COUNT,
    ERROR_LISTENER,
    ERROR_TYPE,
    ID,
    ORIGINAL_DESTINATION,
)
from tests.harness.apps.in_process import Calls, running, settings_for, unique
from tests.harness.servers.activemq import ActiveMQ, activemq_available, reference_config
from tests.harness.servers.brokers import missing
from tests.harness.servers.rabbitmq import RabbitMQ
from tests.harness.traffic.messages import read, send_all

pytestmark = pytest.mark.anyio

HOUR = 3600.0
# A time to live the first delivery surely beats, and a redelivery delay that outlasts it.
SHORT_TTL_MS, LONGER_DELAY = 3000, 6.0


async def test_a_message_waiting_out_its_redelivery_delay_does_not_hold_its_pool_slot(
    broker_url: str,
) -> None:
    queue = f"queue:{unique('slot')}"
    calls = Calls()

    @listener(queue, pool=1, redelivery=Redelivery(limit=1, delay=HOUR))
    async def handler(body: str, ctx: Context) -> None:
        calls.add(body, ctx.delivery_count)
        if body == "poison":
            raise RuntimeError("poison")

    await send_all(broker_url, queue, ["poison"])
    async with running(settings_for(broker_url), handler) as container:
        await calls.wait(lambda c: bool(c.of("poison")))
        # Sent once the only slot has failed the poison message: with the delay held in the
        # slot, this one would wait an hour for it.
        await send_all(broker_url, queue, ["good"])
        await calls.wait(lambda c: bool(c.of("good")))
        stats = container.deployed[0].stats
    assert calls.of("poison") == [1]  # its second delivery is an hour away
    assert (stats.processed, stats.redelivered) == (1, 1)


async def test_a_delayed_redelivery_keeps_its_count_flag_headers_and_error_destination(
    broker_url: str,
) -> None:
    queue, errors = f"queue:{unique('delayed')}", f"queue:{unique('errors')}"
    calls = Calls()

    @listener(queue, pool=1, error_destination=errors,
              redelivery=Redelivery(limit=2, delay=0.3, backoff=1.0))
    async def handler(body: str, ctx: Context) -> None:
        calls.add(body, (ctx.id, ctx.redelivered, ctx.delivery_count, ctx.headers.get("region")))
        if body == "poison":
            raise ValueError("poison!")

    async with running(settings_for(broker_url), handler):
        async with Producer(settings_for(broker_url)) as producer:
            sent = await producer.send(queue, "poison", {"region": "eu"})
        await calls.wait(lambda c: bool(c.of("poison")))
        await send_all(broker_url, queue, ["good"])
        [moved] = await read(broker_url, errors, 1)
    # The good message, sent after the first failure, went before the delayed redeliveries.
    assert [key for key, _ in calls.seen] == ["poison", "good", "poison", "poison"]
    assert calls.of("poison") == [(sent, False, 1, "eu"), (sent, True, 2, "eu"),
                                  (sent, True, 3, "eu")]
    h = moved.headers
    assert moved.body == b"poison" and h[ID] == sent
    assert (h[ERROR_TYPE], h[ERROR_LISTENER], h[ORIGINAL_DESTINATION], h[DELIVERY_COUNT]) == (
        "ValueError", "handler", queue, "3")
    # What made the broker hold the copies (ActiveMQ's scheduler, RabbitMQ's delay queue
    # arguments and dead-lettering) is not carried on to the error destination, where it
    # would hold or dead-letter the message again.
    held_by = {"scheduledJobId", "AMQ_SCHEDULED_DELAY", "x-message-ttl",
               "x-dead-letter-exchange", "x-dead-letter-routing-key", "x-first-death-queue"}
    assert not held_by & set(h), sorted(held_by & set(h))


@pytest.fixture(scope="module")
def activemq_without_scheduler(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ActiveMQ]:
    """A private ActiveMQ whose configuration is the reference one without its scheduler."""
    if not activemq_available():
        missing("ActiveMQ Classic")
    config = tmp_path_factory.mktemp("no-scheduler") / "activemq.xml"
    reference = reference_config().read_text()
    attribute = 'schedulerSupport="true">'  # on the <broker> element
    assert reference.count(attribute) == 1
    config.write_text(reference.replace(attribute, 'schedulerSupport="false">'))
    with ActiveMQ(config=config) as broker:
        yield broker


@pytest.mark.activemq
async def test_where_the_broker_cannot_hold_a_delay_the_process_waits_it_out_and_says_so(
    activemq_without_scheduler: ActiveMQ, caplog: pytest.LogCaptureFixture,
) -> None:
    url = activemq_without_scheduler.url
    queue = f"queue:{unique('unheld')}"
    calls = Calls()

    @listener(queue, pool=1, redelivery=Redelivery(limit=1, delay=0.3))
    async def handler(body: str, ctx: Context) -> None:
        calls.add(body, (ctx.redelivered, ctx.delivery_count))
        if ctx.delivery_count == 1:
            raise RuntimeError("first delivery fails")

    with caplog.at_level(logging.WARNING, logger="mdb.container"):
        async with running(settings_for(url), handler):
            await send_all(url, queue, ["retried"])
            await calls.wait(lambda c: len(c.of("retried")) == 2)
    assert calls.of("retried") == [(False, 1), (True, 2)]
    [line] = [r.getMessage() for r in caplog.records if "cannot hold" in r.getMessage()]
    assert "broker default" in line and "schedulerSupport" in line


@pytest.mark.activemq
async def test_without_the_scheduler_a_copy_that_expired_while_waited_for_is_dead_lettered(
    activemq_without_scheduler: ActiveMQ,
) -> None:
    """The process waits the delay out, then sends the copy with the original's expiry, which
    has passed: ActiveMQ expires it into ActiveMQ.DLQ, and no handler sees it again."""
    url = activemq_without_scheduler.url
    queue = f"queue:{unique('expiring')}"
    calls = Calls()

    @listener(queue, pool=1, redelivery=Redelivery(limit=1, delay=LONGER_DELAY))
    async def handler(body: str, ctx: Context) -> None:
        calls.add(body, ctx.delivery_count)
        raise RuntimeError("fails at once")

    async with running(settings_for(url), handler):
        async with Producer(settings_for(url)) as producer:
            expires = str(round(time.time() * 1000) + SHORT_TTL_MS)
            sent = await producer.send(queue, "short-lived", {"expires": expires})
        [expired] = await read(url, "queue:ActiveMQ.DLQ", 1)
    assert calls.of("short-lived") == [1]
    assert (expired.headers[ID], expired.headers[DELIVERY_COUNT]) == (sent, "2")
    assert expired.headers["originalExpiration"] == expires


@pytest.mark.rabbitmq
async def test_on_rabbitmq_a_copy_that_would_expire_while_delayed_is_not_sent(
    rabbitmq: RabbitMQ,
) -> None:
    """Sent to its delay queue, the copy would be dead-lettered back when its time to live
    ends, before its delay does and without its ``expiration``: handled after its expiry.
    RabbitMQ drops an expired message, so mdb does not send this copy: the failed delivery
    is settled and the message is in no queue any more."""
    name = unique("expiring")
    queue = f"queue:{name}"
    calls = Calls()

    @listener(queue, pool=1, redelivery=Redelivery(limit=1, delay=HOUR))
    async def handler(body: str, ctx: Context) -> None:
        calls.add(body, ctx.delivery_count)
        if body == "short-lived":
            raise RuntimeError("fails at once")

    async with running(settings_for(rabbitmq.url), handler) as container:
        async with Producer(settings_for(rabbitmq.url)) as producer:
            await producer.send(queue, "short-lived", {"expiration": str(SHORT_TTL_MS)})
            await producer.send(queue, "after")  # the one slot takes it once the other is settled
        await calls.wait(lambda c: bool(c.of("after")))
        stats = container.deployed[0].stats
    assert calls.of("short-lived") == [1]
    assert stats.redelivered == 1  # the redelivery decided, whose copy expired unsent
    # Neither in its queue nor in a delay queue of it (mdb.delay.<ms>.<name>).
    assert {q: n for q, n in rabbitmq.stored().items() if q.endswith(name) and n} == {}
