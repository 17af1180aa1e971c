"""The failed-message workflow on every broker (``mdb.commands.dlq.failed``,
docs/failed-messages.md): poison messages reach the error destination, a listing shows them with
their failure and leaves them, a replay once the handler is fixed has each processed once, a replay
cut short and run again loses and doubles nothing, a purge takes what it selected and nothing else,
and a replay sends a message only where a listener of the application consumes, leaving the others
in place."""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing, asynccontextmanager

import anyio
import pytest

from mdb import Redelivery, listener
from mdb.commands.console.failed_pages import FailedPages
from mdb.commands.dlq.failed import ErrorDestination
from mdb.commands.dlq.failed_messages import FailedMessages
from mdb.commands.dlq.replays import Left
from mdb.commands.dlq.selection import Selection
from mdb.errors import ConfigurationError, QueueLocked
from mdb.messages.destinations import Destination
from mdb.messages.headers import ID, ORIGINAL_DESTINATION
from mdb.messages.message import OutgoingMessage, new_id
from mdb.routing.brokers import Brokers
from mdb.seam.broker import Connection, ConnectionOptions, SubscriptionRequest
from mdb.seam.registry import broker_for
from mdb.testing import SyncRunner
from tests.harness.apps.in_process import WAIT, settings_for, unique, until

pytestmark = pytest.mark.anyio

fixed = {"on": False}
processed: list[str] = []


@pytest.fixture
def mdb_broker_url(broker_url: str) -> str:
    return broker_url


@pytest.fixture(autouse=True)
def fresh() -> None:
    fixed["on"] = False
    processed.clear()


class Poison(Exception):
    pass


POISON = f"{__name__}.Poison"  # a failure type as mdb names it: builtins by their name alone


@listener("queue:failed_orders", redelivery=Redelivery(limit=1))
async def on_order(body: str) -> None:
    if not fixed["on"] and body.startswith("poison"):
        raise Poison(f"cannot take {body}")
    if body.startswith("fatal"):
        raise KeyError(body)
    processed.append(body)


class Cut(Exception):
    """A replay cut short (a process killed) after some messages."""


async def test_poison_listed_then_replayed_once_cut_short_and_again_then_purged(
        mdb_runner: SyncRunner) -> None:
    async with mdb_runner.run(on_order) as app:
        poison = [await app.send("queue:failed_orders", f"poison {i}") for i in range(4)]
        fatal = await app.send("queue:failed_orders", "fatal 1")
        await app.idle(fail_fast=False)
        errors = app.error_destination("queue:failed_orders.DLQ")

        listed = [f async for f in errors.list()]
        assert [f.id for f in listed] == [*poison, fatal]
        assert {f.error_type for f in listed} == {POISON, "KeyError"}
        assert listed[0].error_message == "cannot take poison 0"
        assert listed[0].original_destination == "queue:failed_orders"
        assert [f.id async for f in errors.list()] == [*poison, fatal]  # left where they were

        fixed["on"] = True
        only_poison = Selection(error_type=POISON)

        def cut_after_two(done: int, total: int) -> None:
            if done == 2:
                raise Cut

        with pytest.raises(Cut):
            await errors.replay(only_poison, progress=cut_after_two)
        assert (await errors.replay(only_poison)).taken == 2  # the rest, and only the rest
        for sent in poison:
            await app.settled(sent)
        await app.idle(fail_fast=False)
        assert sorted(processed) == [f"poison {i}" for i in range(4)]  # each once

        [left] = [f async for f in errors.list()]
        assert left.id == fatal
        assert (await errors.purge(only_poison)).taken == 0
        assert (await errors.purge(Selection(ids=frozenset({fatal})))).taken == 1
        assert [f async for f in errors.list()] == []


@listener("queue:failed_strays", redelivery=Redelivery(limit=0))
async def on_stray(body: str) -> None:
    if not fixed["on"]:
        raise Poison(f"cannot take {body}")
    processed.append(body)


async def test_a_replay_sends_back_what_it_can_and_leaves_each_other_in_place_saying_why(
        mdb_runner: SyncRunner) -> None:
    async with mdb_runner.run(on_stray) as app:
        failed = await app.send("queue:failed_strays", "failed 1")
        await app.idle(fail_fast=False)
        errors = app.error_destination("queue:failed_strays.DLQ")
        elsewhere = f"queue:failed_elsewhere_{uuid.uuid4().hex[:8]}"  # another application's
        strays = {"plain": {}, "elsewhere": {ORIGINAL_DESTINATION: elsewhere},
                  "topic": {ORIGINAL_DESTINATION: "topic:failed_prices"},
                  "itself": {ORIGINAL_DESTINATION: "queue:failed_strays.DLQ"},
                  "unreadable": {ORIGINAL_DESTINATION: "failed strays"}}
        put = []
        # What a producer put there itself (through the seam: the runner's waits follow what
        # is sent through mdb's producer, and nothing consumes an error destination).
        options = ConnectionOptions(mdb_runner.url, client_id="strays")
        connection = await broker_for(options).connect()
        try:
            for body, headers in strays.items():
                message = OutgoingMessage(body.encode(), {ID: new_id(), **headers})
                await connection.send(errors.destination, message)
                put.append(message.headers[ID])
        finally:
            await connection.close()

        fixed["on"] = True
        left: list[Left] = []
        done = await errors.replay(left=left.append)
        assert (done.taken, done.left) == (1, len(strays))
        assert [stray.id for stray in left] == put
        await app.settled(failed)
        await app.idle(fail_fast=False)
        assert processed == ["failed 1"]
        assert [f.id async for f in errors.list()] == put  # left in place, in their order
        assert [f async for f in app.error_destination(elsewhere).list()] == []

        # Where the operator names a destination, they go there, but never back where they are.
        with pytest.raises(ConfigurationError, match="the error destination itself"):
            await errors.replay(to=errors.destination)
        plain = Selection(ids=frozenset(put[:1]))
        to = Destination.parse("queue:failed_strays")
        assert (await errors.replay(plain, to=to)).taken == 1
        await app.idle(fail_fast=False)
        assert processed == ["failed 1", "plain"]
        assert [f.id async for f in errors.list()] == put[1:]
        assert (await errors.purge()).taken == len(put) - 1


# --- browsing and taking an error destination (docs/failed-messages.md, "Two at once") ------


@asynccontextmanager
async def _connection(url: str) -> AsyncIterator[Connection]:
    connection = await broker_for(ConnectionOptions(url=url, client_id=unique("raw"))).connect()
    try:
        yield connection
    finally:
        await connection.close()


def _origin(queue: str) -> str:
    """The queue error destination ``queue`` (``queue:NAME.DLQ``) is named after, where a
    replay sends what failed there (docs/failed-messages.md); nothing listens to it here."""
    return queue.removesuffix(".DLQ")


async def _put(url: str, queue: str, *headers: dict[str, str]) -> list[str]:
    """One message per ``headers`` on ``queue``, sent as a foreign producer would (persistent,
    an ``mdb_id`` of its own, failed on ``_origin(queue)``); their ids."""
    ids = []
    async with _connection(url) as connection:
        for extra in headers:
            ids.append(new_id())
            await connection.send(Destination.parse(queue), OutgoingMessage(
                f"body {len(ids)}".encode(), {ID: ids[-1], ORIGINAL_DESTINATION: _origin(queue),
                                              **extra}))
    return ids


def _errors(url: str, queue: str) -> ErrorDestination:
    return ErrorDestination(Brokers(settings_for(url)), queue)


async def _listed(errors: ErrorDestination) -> list[str]:
    with anyio.fail_after(WAIT):
        return [f.id async for f in errors.list()]


async def test_headers_named_as_the_tools_own_markers_are_ordinary_messages(
        mdb_broker_url: str) -> None:
    queue = f"queue:{unique('forged')}.DLQ"
    ids = await _put(mdb_broker_url, queue, {}, {"mdb_browse_end": "x"}, {"browser": "end"},
                     {"mdb_end_marker": "x"}, {"message-id": "0", "browser": "end"}, {})
    errors = _errors(mdb_broker_url, queue)
    assert await _listed(errors) == ids
    assert await _listed(errors) == ids  # and left where they were
    with anyio.fail_after(WAIT):
        assert (await errors.show(ids[-1])).id == ids[-1]
        assert (await errors.purge(Selection(ids=frozenset(ids[1:5])))).taken == 4
    assert await _listed(errors) == [ids[-1], ids[0]]  # the first went behind, moved back


async def test_a_browse_shows_the_message_and_none_of_its_own_frame_headers(
        mdb_broker_url: str) -> None:
    queue = f"queue:{unique('shown')}.DLQ"
    [sent] = await _put(mdb_broker_url, queue, {"tenant": "t1"})
    with anyio.fail_after(WAIT):
        shown = await _errors(mdb_broker_url, queue).show(sent)
    assert shown.headers["tenant"] == "t1"
    assert not {"ack", "subscription"} & shown.headers.keys()


async def test_two_operators_at_once_never_hang_or_miscount(mdb_broker_url: str) -> None:
    queue = f"queue:{unique('twice')}.DLQ"
    ids = await _put(mdb_broker_url, queue, *({} for _ in range(30)))
    errors = _errors(mdb_broker_url, queue)

    async def listed() -> list[str] | QueueLocked:
        try:
            return await _listed(errors)
        except QueueLocked as locked:
            return locked

    async def replayed() -> int | QueueLocked:
        try:
            return (await errors.replay()).taken
        except QueueLocked as locked:
            return locked

    with anyio.fail_after(WAIT):
        lists = await asyncio.gather(listed(), listed())
        replays = await asyncio.gather(replayed(), replayed())
    for seen in lists:
        assert seen == ids or isinstance(seen, QueueLocked)
    taken = [n for n in replays if isinstance(n, int)]
    assert sum(taken) == 30 and len(taken) >= 1
    assert await _listed(errors) == []
    assert sorted(await _listed(_errors(mdb_broker_url, _origin(queue)))) == sorted(ids)


async def test_an_operation_under_way_locks_the_others_out_until_it_ends(
        mdb_broker_url: str) -> None:
    queue = f"queue:{unique('locked')}.DLQ"
    ids = await _put(mdb_broker_url, queue, {}, {})
    errors = _errors(mdb_broker_url, queue)
    with anyio.fail_after(WAIT):
        async with aclosing(errors.list()) as listing:
            assert (await anext(listing)).id == ids[0]
            with pytest.raises(QueueLocked, match="another mdb dlq command is at work"):
                await errors.purge()
            with pytest.raises(QueueLocked):
                await errors.show(ids[1])
        assert (await errors.purge()).taken == 2
    assert await _listed(errors) == []


async def test_a_message_another_consumer_takes_meanwhile_never_hangs_a_replay(
        mdb_broker_url: str) -> None:
    queue = f"queue:{unique('gone')}.DLQ"
    ids = await _put(mdb_broker_url, queue, *({} for _ in range(5)))
    errors = _errors(mdb_broker_url, queue)
    async with _connection(mdb_broker_url) as other:
        subscription = await other.subscribe(SubscriptionRequest(
            Destination.parse(queue), None, durable=False, selector=None, prefetch=1))
        taking = anyio.Event()

        async def take_held() -> None:
            await taking.wait()
            await other.ack(held)
            await subscription.close()  # and hands back what came to it since

        with anyio.fail_after(WAIT):
            held = await subscription.receive()  # a browse may see it: no take gets it
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(take_held)  # once the replay took one
                done = await errors.replay(progress=lambda done, total: taking.set())
    assert done.taken == 4
    assert sorted(await _listed(_errors(mdb_broker_url, _origin(queue)))) == sorted(
        set(ids) - {held.headers[ID]})


async def test_a_message_expiring_between_the_browse_and_the_take_never_hangs_a_replay(
        mdb_broker_url: str) -> None:
    if mdb_broker_url.startswith("memory:"):
        pytest.skip("the memory broker keeps a message until it is taken")
    queue = f"queue:{unique('expiring')}.DLQ"
    # Alive while the replay browses; gone when, after two messages at half a message a
    # second, the take would reach it (ActiveMQ's absolute `expires`, RabbitMQ's `expiration`).
    expiring = {"expires": str(int(time.time() * 1000) + 1000), "expiration": "1000"}
    ids = await _put(mdb_broker_url, queue, {}, {}, expiring)
    with anyio.fail_after(WAIT):
        done = await _errors(mdb_broker_url, queue).replay(rate=0.5)
    assert done.taken == 2
    assert sorted(await _listed(_errors(mdb_broker_url, _origin(queue)))) == sorted(ids[:2])


async def test_a_replay_that_stops_before_the_end_says_nothing_on_the_log(
        mdb_broker_url: str, caplog: pytest.LogCaptureFixture) -> None:
    queue = f"queue:{unique('quiet')}.DLQ"
    ids = await _put(mdb_broker_url, queue, {"pick": "yes"}, {})
    errors = _errors(mdb_broker_url, queue)
    with caplog.at_level(logging.INFO), anyio.fail_after(WAIT):
        assert (await errors.replay(Selection(ids=frozenset(ids[:1])))).taken == 1
    assert [r.getMessage() for r in caplog.records if r.name.startswith("mdb")] == []
    assert await _listed(errors) == ids[1:]


@listener("queue:console_failed", redelivery=Redelivery(limit=0))
async def on_console(body: str) -> None:
    if not fixed["on"] and body.startswith("poison"):
        raise Poison(f"cannot take {body}")
    if body.startswith("fatal"):
        raise KeyError(body)
    processed.append(body)


async def test_the_console_counts_replays_and_purges_a_selection_as_mdb_dlq_does(
        mdb_runner: SyncRunner) -> None:
    url, dlq = mdb_runner.url, "queue:console_failed.DLQ"
    async with mdb_runner.run(on_console) as app:
        poison = [await app.send("queue:console_failed", f"poison {i}") for i in range(3)]
        fatal = [await app.send("queue:console_failed", f"fatal {i}") for i in range(2)]
        await app.idle(fail_fast=False)
        # As `mdb console` makes it, from the settings (the memory broker lives in this process
        # alone: there, the runner's brokers).
        pages = (FailedPages(FailedMessages([app.error_destination(dlq)]))
                 if url.startswith("memory:") else FailedPages.of(settings_for(url), [dlq]))
        with anyio.fail_after(WAIT):
            index = await pages.index("")
        assert re.findall(r">([\w.]+)</a>: (\d+)</li>", index.body) == [(POISON, "3"),
                                                                        ("KeyError", "2")]

        fixed["on"] = True
        with anyio.fail_after(WAIT):
            done = await pages.replay(dlq, poison[:2])
        assert "Replayed 2 message(s)." in done.body
        await until(lambda: len(processed) == 2)
        with anyio.fail_after(WAIT):
            purged = await pages.purge(dlq, [fatal[1]])
            assert "Purged 1 message(s)." in purged.body
            left = await pages.destination(dlq, {}, '<input type="hidden" name="csrf">')
        assert sorted(re.findall(r'name="ids" value="([^"]*)"', left.body)) == sorted(
            [poison[2], fatal[0]])
        await app.idle(fail_fast=False)
        assert sorted(processed) == ["poison 0", "poison 1"]  # each once
        with anyio.fail_after(WAIT):
            await pages.purge(dlq, [poison[2], fatal[0]])
