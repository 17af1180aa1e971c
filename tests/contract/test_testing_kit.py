"""mdb.testing on every broker: the kit's runner follows messages through redelivery delays
(on its manual clock), fails fast with the handler's exception, reads an error destination's
failure headers and says where a message is when it does not settle."""

from __future__ import annotations

import pytest

from mdb import Context, Redelivery, listener
from mdb.testing import NotSettled, SyncRunner

pytestmark = pytest.mark.anyio


@pytest.fixture
def mdb_broker_url(broker_url: str) -> str:
    return broker_url


class Refused(Exception):
    pass


@listener("queue:kit_orders", redelivery=Redelivery(limit=2, delay=60, backoff=2,
                                                     max_delay=300))
async def refuse_twice(body: str, ctx: Context) -> None:
    if body == "always" or ctx.delivery_count < 3:
        raise Refused(f"{body}: delivery {ctx.delivery_count}")
    await ctx.send("queue:kit_receipts", f"receipt for {body}")


@listener("queue:kit_nobody_sends_here")
async def never_called(body: bytes) -> None:
    raise AssertionError("no message was sent here")


async def test_a_minute_of_redelivery_delays_passes_on_the_clock(mdb_runner: SyncRunner) -> None:
    async with mdb_runner.run(refuse_twice) as app:
        sent = await app.send("queue:kit_orders", "o-1")
        attempts = await app.settled(sent)
        assert [a.outcome for a in attempts] == ["redelivered", "redelivered", "processed"]
        assert [a.delivery_count for a in attempts] == [1, 2, 3]
        assert mdb_runner.clock.now() >= 60 + 120  # delay, then delay x backoff
        await app.idle()
        [receipt] = await app.take("queue:kit_receipts")
        assert receipt.text == "receipt for o-1"


@listener("queue:kit_copies")
async def record_copy(body: str, ctx: Context) -> None:
    await ctx.send("queue:kit_copy_receipts", f"{body} {ctx.id}")


async def test_a_message_sent_again_is_settled_once_each_copy_is(mdb_runner: SyncRunner) -> None:
    async with mdb_runner.run(record_copy) as app:
        sent = await app.send("queue:kit_copies", "c-1")
        await app.send_again(sent)
        attempts = await app.settled(sent)
        assert [a.outcome for a in attempts] == ["processed", "processed"]  # at least once
        receipts = await app.take("queue:kit_copy_receipts", 2)
        assert {r.text for r in receipts} == {f"c-1 {sent}"}  # one mdb_id on both copies


async def test_idle_raises_the_handlers_exception_and_take_reads_the_failure(
        mdb_runner: SyncRunner) -> None:
    async with mdb_runner.run(refuse_twice) as app:
        sent = await app.send("queue:kit_orders", "always")
        with pytest.raises(Refused, match="always: delivery 3") as raised:
            await app.idle()
        assert raised.value.__notes__ == [
            "mdb.testing: delivery 3 on queue:kit_orders: moved to queue:kit_orders.DLQ after "
            "tests.contract.test_testing_kit.Refused: always: delivery 3"]
        await app.idle()  # a failure is raised once
        [moved] = await app.take("queue:kit_orders.DLQ")
        assert moved.id == sent and moved.text == "always"
        assert moved.failure is not None
        assert (moved.failure.error_type, moved.failure.delivery_count) == (
            "tests.contract.test_testing_kit.Refused", 3)
        assert moved.failure.original_destination == "queue:kit_orders"


async def test_a_message_that_does_not_settle_says_where_it_is(mdb_runner: SyncRunner) -> None:
    async with mdb_runner.run(never_called) as app:
        sent = await app.send("queue:kit_unserved", "lost?")
        with pytest.raises(NotSettled) as raised:
            await app.settled(sent)
        assert f"message {sent} sent to queue:kit_unserved" in str(raised.value)
        assert "no running listener serves it" in str(raised.value)


async def test_a_failed_assert_in_the_block_is_raised_as_itself(mdb_runner: SyncRunner) -> None:
    with pytest.raises(AssertionError, match="the test's own assert"):
        async with mdb_runner.run(never_called):
            raise AssertionError("the test's own assert")
