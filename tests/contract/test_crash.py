"""Crashes: a container process killed with SIGKILL, a connection dropped mid-handler, an ack
lost after the copies of its settlement were stored.

After each, every message is processed, and every repeat is flagged redelivered.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from mdb import Context, Redelivery, listener
from tests.harness.apps.in_process import WAIT, Calls, memory_broker, running, settings_for, unique
from tests.harness.processes.container_process import ContainerProcess
from tests.harness.traffic.messages import read, send_all


@pytest.fixture(
    params=[
        pytest.param("activemq", marks=pytest.mark.activemq),
        pytest.param("rabbitmq", marks=pytest.mark.rabbitmq),
    ]
)
def real_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A real broker's URL: these tests run container processes, which cannot share memory."""
    yield str(request.getfixturevalue(request.param).url)


def test_a_killed_container_process_has_its_work_redelivered_flagged(real_url: str) -> None:
    ledger, app = unique("ledger"), unique("app")
    sent = anyio.run(send_all, real_url, f"queue:{ledger}", [f"m{n}" for n in range(12)])
    with ContainerProcess(real_url, ledger, app, "s1", hang=True) as first:
        in_flight = first.take(4, "start")  # pool=4: four handlers hang
        first.process.send_signal(signal.SIGKILL)
        first.process.wait(timeout=WAIT)
    with ContainerProcess(real_url, ledger, app, "s2", hang=False) as second:
        done = second.take(12, "done")
        second.process.send_signal(signal.SIGTERM)
        assert second.process.wait(timeout=WAIT) == 0
    assert sorted(e["id"] for e in done) == sorted(sent)  # every message, once
    hung = {e["id"] for e in in_flight}
    for entry in done:
        assert entry["redelivered"] == (entry["id"] in hung), entry
    assert all(e["count"] == 2 for e in done if e["id"] in hung)


def test_a_redelivery_held_by_the_broker_outlives_the_killed_container_that_failed_it(
    real_url: str,
) -> None:
    ledger, app = unique("ledger"), unique("app")
    env = {"FAIL_FIRST_DELIVERY": "1", "MDB_LOG_LEVEL": "INFO",
           "MDB_LISTENERS__ON_ENTRY__REDELIVERY__DELAY": "1"}
    [sent] = anyio.run(send_all, real_url, f"queue:{ledger}", ["fails once"])
    with ContainerProcess(real_url, ledger, app, "s1", hang=False, env=env) as first:
        first.take(1, "redelivering")  # acked, its copy held by the broker for a second
        first.process.send_signal(signal.SIGKILL)
        first.process.wait(timeout=WAIT)
    with ContainerProcess(real_url, ledger, app, "s2", hang=False, env=env) as second:
        [done] = second.take(1, "done")
    assert (done["id"], done["redelivered"], done["count"]) == (sent, True, 2)


def test_a_second_signal_exits_at_once(real_url: str) -> None:
    ledger, app = unique("ledger"), unique("app")
    anyio.run(send_all, real_url, f"queue:{ledger}", ["stuck"])
    with ContainerProcess(real_url, ledger, app, "s1", hang=True, grace=600) as process:
        process.take(1, "start")
        process.process.send_signal(signal.SIGTERM)
        process.take(1, "stopping")  # in its grace period, waiting for the hung handler
        process.process.send_signal(signal.SIGTERM)
        assert process.process.wait(timeout=WAIT) == 128 + signal.SIGTERM


@pytest.mark.anyio
async def test_a_dropped_connection_discards_the_stale_result_and_redelivers_flagged() -> None:
    url, state = memory_broker("drop")
    queue_, side = f"queue:{unique('work')}", f"queue:{unique('side')}"
    calls = Calls()
    dropped = anyio.Event()

    @listener(queue_)
    async def handler(body: str, ctx: Context) -> None:
        calls.add("start", (ctx.redelivered, ctx.delivery_count))
        await ctx.send(side, f"from delivery {ctx.delivery_count}")
        if not ctx.redelivered:
            state.drop_connections()  # the connection dies while this handler runs
            dropped.set()

    await send_all(url, queue_, ["work"])
    async with running(settings_for(url), handler):
        await calls.wait(lambda c: len(c.of("start")) == 2)
        [result] = await read(url, side, 1)
    assert calls.of("start") == [(False, 1), (True, 2)]
    assert result.body == b"from delivery 2"  # the stale delivery's send never happened
    assert dropped.is_set()



def settled(state: Any, queue_: str, errors: str | None = None) -> bool:
    """Whether ``queue_`` of the memory broker ``state`` holds nothing, in flight or ready, and
    ``errors`` (if given) something."""
    stats = state.stats(queue_)
    return (stats is not None and (stats.depth, stats.in_flight) == (0, 0)
            and (errors is None or state.queue_depth(errors) > 0))


@pytest.mark.anyio
@pytest.mark.parametrize("limit", [1, 0], ids=["retry copy", "error copy"])
async def test_a_failure_whose_copy_was_stored_but_not_its_ack_goes_round_once(
    limit: int,
) -> None:
    """As on RabbitMQ when the connection closes between the confirms and the acks
    (docs/rabbitmq.md): the delivery comes back flagged, and is acked unseen, since its copy
    (the retry with the next count, or the error copy) supersedes it."""
    url, state = memory_broker("lost_ack")
    queue_ = f"queue:{unique('work')}"
    errors = f"{queue_}.DLQ"
    calls = Calls()

    @listener(queue_, redelivery=Redelivery(limit=limit, delay=0))
    async def handler(body: str, ctx: Context) -> None:
        calls.add("start", ctx.delivery_count)
        raise ValueError("fails")

    await send_all(url, queue_, ["work"])
    state.lose_acks(1)  # the first settlement: the failure's copy
    async with running(settings_for(url), handler) as container:
        with anyio.fail_after(WAIT):
            await state.wait_until(lambda s: settled(s, queue_, errors))
        [deployed] = container.deployed
        rolled_back = deployed.stats.rolled_back
    assert calls.of("start") == list(range(1, limit + 2))  # no delivery handled twice
    assert state.queue_depth(errors) == 1
    assert rolled_back == 1


@pytest.mark.anyio
async def test_a_retry_copy_stored_while_its_settlement_failed_is_not_handled_twice() -> None:
    """As on RabbitMQ when a closing connection cut off the receipt of a retry copy's SEND,
    which the broker stored all the same (docs/rabbitmq.md): the delivery comes back in doubt
    and is copied again, so two copies of one round are stored. The later is told from the
    first (``mdb.delivery.strikes``, rounds): no round reaches the handler twice, and the
    message reaches its error destination once."""
    url, state = memory_broker("cut_receipt")
    queue_ = f"queue:{unique('work')}"
    errors = f"{queue_}.DLQ"
    calls = Calls()

    @listener(queue_, redelivery=Redelivery(limit=2, delay=0))
    async def handler(body: str, ctx: Context) -> None:
        calls.add("start", ctx.delivery_count)
        raise ValueError("fails")

    await send_all(url, queue_, ["work"])
    state.lose_acks(1, confirmed=False)  # the first failure's settlement: its retry copy
    async with running(settings_for(url), handler) as container:
        with anyio.fail_after(WAIT):
            await state.wait_until(lambda s: settled(s, queue_, errors))
        [deployed] = container.deployed
        already_processed = deployed.stats.already_processed
    assert calls.of("start") == [1, 2, 3]
    assert (state.queue_depth(errors), already_processed) == (1, 1)


@pytest.mark.anyio
async def test_a_success_whose_sends_were_stored_but_not_its_ack_runs_once() -> None:
    url, state = memory_broker("lost_ack")
    queue_, side = f"queue:{unique('work')}", f"queue:{unique('side')}"
    calls = Calls()

    @listener(queue_)
    async def handler(body: str, ctx: Context) -> None:
        calls.add("start", ctx.delivery_count)
        await ctx.send(side, "done")

    await send_all(url, queue_, ["work"])
    state.lose_acks(1)
    async with running(settings_for(url), handler) as container:
        with anyio.fail_after(WAIT):
            await state.wait_until(lambda s: settled(s, queue_, side))
        [deployed] = container.deployed
        processed = deployed.stats.processed
    assert calls.of("start") == [1]
    assert (state.queue_depth(side), processed) == (1, 0)
