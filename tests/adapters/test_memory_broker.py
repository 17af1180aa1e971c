"""The memory broker (``mdb_memory``): the seam's contract with ActiveMQ-like semantics, and
its test hooks (inspection and injected failures)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace

import anyio
import pytest

import mdb_memory
from mdb.errors import (
    BrokerError,
    ConfigurationError,
    ConnectionFailed,
    ConnectionLost,
    SendOutcomeUnknown,
    SubscriptionFailed,
    TransactionRolledBack,
)
from mdb.messages.destinations import Destination
from mdb.messages.message import OutgoingMessage
from mdb.messages.selector import SelectorError, compile_selector
from mdb.seam.broker import ConnectionOptions, Delivery, SubscriptionRequest
from mdb_memory import BrokerState, MemoryBroker, MemoryConnection, MemorySubscription

pytestmark = pytest.mark.anyio

WAIT = 5  # seconds: a bound on waits that should end at once, never an expected duration


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def name() -> Iterator[str]:
    broker_name = f"test-{uuid.uuid4().hex[:12]}"
    yield broker_name
    mdb_memory.reset(broker_name)


@pytest.fixture
def broker(name: str) -> MemoryBroker:
    return MemoryBroker(ConnectionOptions(f"memory://{name}"))


@pytest.fixture
def state(name: str) -> BrokerState:
    return mdb_memory.broker_state(name)


@pytest.fixture
async def conn(broker: MemoryBroker) -> AsyncIterator[MemoryConnection]:
    connection = await broker.connect()
    yield connection
    await connection.close()


def d(text: str) -> Destination:
    return Destination.parse(text)


def msg(body: str, **headers: str) -> OutgoingMessage:
    return OutgoingMessage(body.encode(), {"mdb_id": uuid.uuid4().hex, **headers})


def req(destination: str, name: str | None = None, *, durable: bool = False,
        selector: str | None = None, prefetch: int = 10) -> SubscriptionRequest:
    return SubscriptionRequest(d(destination), name, durable, selector, prefetch)


async def receive(subscription: MemorySubscription) -> Delivery:
    with anyio.fail_after(WAIT):
        return await subscription.receive()


async def bodies(subscription: MemorySubscription, count: int) -> list[str]:
    return [(await receive(subscription)).body.decode() for _ in range(count)]


async def send_all(conn: MemoryConnection, destination: str, *texts: str) -> None:
    for text in texts:
        await conn.send(d(destination), msg(text))


# --- naming and registry ---------------------------------------------------------------------


async def test_url_names_the_shared_state(name: str) -> None:
    assert MemoryBroker(ConnectionOptions("memory://")).name == "default"
    named = MemoryBroker(ConnectionOptions(f"memory://{name}"))
    assert named.name == name and named.state is mdb_memory.broker_state(name)
    with pytest.raises(ConfigurationError):
        MemoryBroker(ConnectionOptions("stomp://localhost:61613"))

    first = await MemoryBroker(ConnectionOptions(f"memory://{name}")).connect()
    second = await MemoryBroker(ConnectionOptions(f"memory://{name}")).connect()
    assert mdb_memory.broker_state(name).connection_count == 2
    sub = await second.subscribe(req("queue:shared"))
    await first.send(d("queue:shared"), msg("one"))
    assert (await receive(sub)).body == b"one"
    assert mdb_memory.broker_state(f"{name}-other").queue_names() == []
    await first.close()
    await second.close()
    assert mdb_memory.broker_state(name).connection_count == 0
    mdb_memory.reset(f"{name}-other")


async def test_entry_point_finds_the_memory_broker(name: str) -> None:
    from importlib.metadata import entry_points

    from mdb.seam.registry import ENTRY_POINT_GROUP, broker_for

    if "memory" not in {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)}:
        pytest.skip("mdb is not installed, so its entry points are not registered")
    assert isinstance(broker_for(ConnectionOptions(f"memory://{name}")), MemoryBroker)


async def test_reset_drops_connections_and_forgets_the_state(
    broker: MemoryBroker, name: str
) -> None:
    conn = await broker.connect()
    sub = await conn.subscribe(req("queue:q"))
    await conn.send(d("queue:q"), msg("x"))
    old = mdb_memory.broker_state(name)
    mdb_memory.reset(name)
    assert not conn.is_open
    with pytest.raises(ConnectionLost):
        await sub.receive()
    fresh = mdb_memory.broker_state(name)
    assert fresh is not old and fresh.queue_names() == []
    again = await broker.connect()
    assert again.state is fresh
    await again.close()


# --- queues ----------------------------------------------------------------------------------


async def test_queue_is_fifo_and_keeps_messages_sent_before_subscribing(
    conn: MemoryConnection, state: BrokerState
) -> None:
    await send_all(conn, "queue:orders", "a", "b", "c")
    assert state.queue_depth("queue:orders") == 3
    assert [m.body for m in state.browse("queue:orders")] == [b"a", b"b", b"c"]
    sub = await conn.subscribe(req("queue:orders"))
    got = [await receive(sub) for _ in range(3)]
    assert [x.body for x in got] == [b"a", b"b", b"c"]
    assert all(x.destination == d("queue:orders") and not x.broker_redelivered for x in got)
    assert len({x.message_id for x in got}) == 3
    assert all((x.message_id or "").startswith("ID:memory-") for x in got)
    for x in got:
        await conn.ack(x)
    stats = state.stats("queue:orders")
    assert stats is not None
    assert (stats.depth, stats.in_flight, stats.enqueued, stats.dequeued) == (0, 0, 3, 3)


async def test_receive_waits_for_a_send(conn: MemoryConnection) -> None:
    sub = await conn.subscribe(req("queue:q"))
    received: list[bytes] = []
    waiting = anyio.Event()

    async def consumer() -> None:
        waiting.set()
        received.append((await sub.receive()).body)

    with anyio.fail_after(WAIT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(consumer)
            await waiting.wait()
            await conn.send(d("queue:q"), msg("late"))
    assert received == [b"late"]


async def test_cancelled_receive_loses_nothing(conn: MemoryConnection) -> None:
    sub = await conn.subscribe(req("queue:q"))
    with anyio.CancelScope() as scope:
        scope.cancel()
        await sub.receive()
    await conn.send(d("queue:q"), msg("kept"))
    assert (await receive(sub)).body == b"kept"


async def test_competing_subscribers_get_messages_round_robin(conn: MemoryConnection) -> None:
    first = await conn.subscribe(req("queue:work"))
    second = await conn.subscribe(req("queue:work"))
    await send_all(conn, "queue:work", "1", "2", "3", "4")
    assert await bodies(first, 2) == ["1", "3"]
    assert await bodies(second, 2) == ["2", "4"]


async def test_prefetch_limits_unsettled_deliveries(
    conn: MemoryConnection, state: BrokerState
) -> None:
    sub = await conn.subscribe(req("queue:p", prefetch=2))
    await send_all(conn, "queue:p", "1", "2", "3", "4", "5")
    assert sub.unsettled_count == 2 and state.queue_depth("queue:p") == 3
    first = await receive(sub)
    await receive(sub)
    assert sub.unsettled_count == 2 and state.queue_depth("queue:p") == 3  # received ≠ settled
    await conn.ack(first)
    assert sub.unsettled_count == 2 and state.queue_depth("queue:p") == 2
    assert (await receive(sub)).body == b"3"


async def test_receive_nowait_takes_only_what_was_already_pushed(conn: MemoryConnection) -> None:
    sub = await conn.subscribe(req("queue:n", prefetch=2))
    assert sub.receive_nowait() is None
    await send_all(conn, "queue:n", "1", "2", "3")
    first = await receive(sub)
    second = sub.receive_nowait()
    assert first.body == b"1" and second is not None and second.body == b"2"
    assert sub.receive_nowait() is None  # "3" waits for room under the prefetch
    await conn.ack(first)
    third = sub.receive_nowait()
    assert third is not None and third.body == b"3"
    await conn.send(d("queue:n"), msg("4"))
    await sub.close()
    assert sub.receive_nowait() is None


async def test_a_full_subscriber_is_skipped(conn: MemoryConnection) -> None:
    busy = await conn.subscribe(req("queue:w", prefetch=1))
    idle = await conn.subscribe(req("queue:w", prefetch=10))
    await send_all(conn, "queue:w", "1", "2", "3")
    assert await bodies(busy, 1) == ["1"]
    assert await bodies(idle, 2) == ["2", "3"]


async def test_bad_subscription_requests_fail(conn: MemoryConnection) -> None:
    with pytest.raises(SubscriptionFailed, match="prefetch"):
        await conn.subscribe(req("queue:q", prefetch=0))
    with pytest.raises(SubscriptionFailed, match="durable subscription needs a name"):
        await conn.subscribe(req("topic:t", None, durable=True))
    with pytest.raises(SubscriptionFailed, match=r"a\.b"):
        await conn.subscribe(req("topic:t", "a.b"))


# --- topics (virtual topics) -----------------------------------------------------------------


async def test_topic_copies_each_message_to_every_subscription(
    conn: MemoryConnection, state: BrokerState
) -> None:
    app1 = await conn.subscribe(req("topic:orders", "app1", durable=True))
    app2 = await conn.subscribe(req("topic:orders", "app2", durable=True))
    assert state.subscription_names("orders") == ["app1", "app2"]
    await send_all(conn, "topic:orders", "a", "b")
    one, two = await receive(app1), await receive(app2)
    assert one.body == two.body == b"a"
    assert one.destination == d("topic:orders")
    assert one.message_id == two.message_id  # one message, two copies
    assert await bodies(app1, 1) == await bodies(app2, 1) == ["b"]


async def test_topic_messages_without_a_subscription_are_not_kept(
    conn: MemoryConnection, state: BrokerState
) -> None:
    await send_all(conn, "topic:news", "lost")
    assert state.queue_names() == [] and state.subscription_names("news") == []
    sub = await conn.subscribe(req("topic:news", "late", durable=True))
    await send_all(conn, "topic:news", "kept")
    assert await bodies(sub, 1) == ["kept"]
    assert sub.unsettled_count == 1  # the earlier message never arrives


async def test_a_named_subscription_is_one_queue_shared_by_its_subscribers(
    broker: MemoryBroker, conn: MemoryConnection, state: BrokerState
) -> None:
    other = await broker.connect()
    here = await conn.subscribe(req("topic:orders", "shared", durable=True))
    there = await other.subscribe(req("topic:orders", "shared", durable=True))
    assert state.queue_names() == ["Consumer.shared.VirtualTopic.orders"]
    await send_all(conn, "topic:orders", "1", "2")
    assert await bodies(here, 1) == ["1"]
    assert await bodies(there, 1) == ["2"]
    assert here.unsettled_count == there.unsettled_count == 1
    await other.close()


async def test_durable_subscription_keeps_messages_while_nobody_is_attached(
    conn: MemoryConnection, state: BrokerState
) -> None:
    sub = await conn.subscribe(req("topic:t", "keeper", durable=True))
    await sub.close()
    await send_all(conn, "topic:t", "while-away")
    assert state.queue_depth("queue:Consumer.keeper.VirtualTopic.t") == 1
    again = await conn.subscribe(req("topic:t", "keeper", durable=True))
    assert await bodies(again, 1) == ["while-away"]


async def test_non_durable_subscription_goes_away_with_its_last_subscriber(
    conn: MemoryConnection, state: BrokerState
) -> None:
    first = await conn.subscribe(req("topic:t", "temp"))
    second = await conn.subscribe(req("topic:t", "temp"))
    await first.close()
    assert state.subscription_names("t") == ["temp"]
    await second.close()
    assert state.subscription_names("t") == [] and state.queue_names() == []
    await send_all(conn, "topic:t", "nobody")
    again = await conn.subscribe(req("topic:t", "temp"))
    await send_all(conn, "topic:t", "new")
    assert await bodies(again, 1) == ["new"]
    assert again.unsettled_count == 1


async def test_anonymous_topic_subscription_is_private_and_temporary(
    conn: MemoryConnection, state: BrokerState
) -> None:
    first = await conn.subscribe(req("topic:t"))
    second = await conn.subscribe(req("topic:t"))
    assert first.requeue_destination != second.requeue_destination
    await send_all(conn, "topic:t", "x")
    assert await bodies(first, 1) == await bodies(second, 1) == ["x"]
    await first.close()
    await second.close()
    assert state.queue_names() == []


async def test_requeue_destination_feeds_only_that_subscription(
    conn: MemoryConnection, state: BrokerState
) -> None:
    mine = await conn.subscribe(req("topic:orders", "mine", durable=True))
    theirs = await conn.subscribe(req("topic:orders", "theirs", durable=True))
    queue_sub = await conn.subscribe(req("queue:jobs"))
    assert mine.requeue_destination == d("queue:Consumer.mine.VirtualTopic.orders")
    assert mine.requeue_destination.name == mdb_memory.subscription_queue_name("orders", "mine")
    assert queue_sub.requeue_destination == d("queue:jobs")

    await conn.send(mine.requeue_destination, msg("again"))
    delivery = await receive(mine)
    assert delivery.body == b"again" and delivery.destination == mine.requeue_destination
    assert theirs.unsettled_count == 0
    assert state.queue_depth("queue:Consumer.theirs.VirtualTopic.orders") == 0

    await conn.send(queue_sub.requeue_destination, msg("job"))
    assert await bodies(queue_sub, 1) == ["job"]


async def test_subscription_queue_created_by_a_send_receives_topic_copies(
    conn: MemoryConnection,
) -> None:
    await conn.send(d("queue:Consumer.early.VirtualTopic.t"), msg("direct"))
    await send_all(conn, "topic:t", "copy")
    sub = await conn.subscribe(req("topic:t", "early", durable=True))
    assert await bodies(sub, 2) == ["direct", "copy"]


# --- transactions ----------------------------------------------------------------------------


async def test_commit_applies_sends_and_acks_together(
    conn: MemoryConnection, state: BrokerState
) -> None:
    sub = await conn.subscribe(req("queue:in"))
    await send_all(conn, "queue:in", "order")
    delivery = await receive(sub)
    tx = await conn.begin()
    await tx.send(d("queue:out"), msg("invoice"))
    await tx.send(d("topic:nobody"), msg("dropped"))
    await tx.ack(delivery)
    assert state.queue_depth("queue:out") == 0
    assert sub.unsettled_count == 1
    await tx.commit()
    assert [m.body for m in state.browse("queue:out")] == [b"invoice"]
    assert sub.unsettled_count == 0
    stats = state.stats("queue:in")
    assert stats is not None and stats.dequeued == 1


async def test_abort_discards_sends_and_keeps_the_ack_unsettled_without_redelivery(
    broker: MemoryBroker, conn: MemoryConnection, state: BrokerState
) -> None:
    sub = await conn.subscribe(req("queue:in", prefetch=5))
    await send_all(conn, "queue:in", "order")
    delivery = await receive(sub)
    tx = await conn.begin()
    await tx.send(d("queue:out"), msg("invoice"))
    await tx.ack(delivery)
    await tx.abort()
    assert state.queue_depth("queue:out") == 0
    # still held by the live subscription, not redelivered to it nor back in the queue
    assert sub.unsettled_count == 1 and state.queue_depth("queue:in") == 0
    stats = state.stats("queue:in")
    assert stats is not None and stats.in_flight == 1

    # it comes back, flagged and with the same id, only when the subscription closes
    other = await (await broker.connect()).subscribe(req("queue:in"))
    await sub.close()
    again = await receive(other)
    assert again.body == b"order" and again.broker_redelivered
    assert again.message_id == delivery.message_id


async def test_an_aborted_ack_can_be_acked_again(
    conn: MemoryConnection, state: BrokerState
) -> None:
    sub = await conn.subscribe(req("queue:in"))
    await send_all(conn, "queue:in", "x")
    delivery = await receive(sub)
    tx = await conn.begin()
    await tx.ack(delivery)
    await tx.abort()
    retry = await conn.begin()
    await retry.ack(delivery)
    await retry.commit()
    assert sub.unsettled_count == 0
    stats = state.stats("queue:in")
    assert stats is not None and stats.dequeued == 1


async def test_transacted_ack_widens_prefetch_until_the_transaction_ends(
    conn: MemoryConnection, state: BrokerState
) -> None:
    sub = await conn.subscribe(req("queue:p", prefetch=1))
    await send_all(conn, "queue:p", "1", "2", "3")
    first = await receive(sub)
    tx = await conn.begin()
    await tx.ack(first)  # like ActiveMQ: the window opens by one while the ack is pending
    second = await receive(sub)
    assert second.body == b"2" and state.queue_depth("queue:p") == 1
    await tx.abort()  # ...and closes again: "1" occupies the prefetch once more
    await conn.ack(second)
    assert sub.unsettled_count == 1 and state.queue_depth("queue:p") == 1
    tx = await conn.begin()
    await tx.ack(first)
    await tx.commit()
    assert await bodies(sub, 1) == ["3"]


async def test_several_transactions_open_at_once(
    conn: MemoryConnection, state: BrokerState
) -> None:
    sub = await conn.subscribe(req("queue:in"))
    await send_all(conn, "queue:in", "a", "b")
    a, b = await receive(sub), await receive(sub)
    tx_a, tx_b = await conn.begin(), await conn.begin()
    await tx_a.ack(a)
    await tx_a.send(d("queue:out"), msg("from-a"))
    await tx_b.ack(b)
    await tx_b.send(d("queue:out"), msg("from-b"))
    await tx_b.commit()
    await tx_a.abort()
    assert [m.body for m in state.browse("queue:out")] == [b"from-b"]
    assert sub.unsettled_count == 1  # a: aborted, still unsettled


async def test_commit_is_all_or_nothing_when_an_ack_is_stale(
    conn: MemoryConnection, state: BrokerState
) -> None:
    sub = await conn.subscribe(req("queue:in"))
    await send_all(conn, "queue:in", "x")
    delivery = await receive(sub)
    tx = await conn.begin()
    await tx.ack(delivery)
    await tx.send(d("queue:out"), msg("y"))
    await sub.close()  # the delivery goes back to the queue
    with pytest.raises(TransactionRolledBack):
        await tx.commit()
    assert state.queue_depth("queue:out") == 0
    assert [(m.body, m.broker_redelivered) for m in state.browse("queue:in")] == [(b"x", True)]


async def test_a_settled_delivery_cannot_be_settled_again(
    conn: MemoryConnection, state: BrokerState
) -> None:
    sub = await conn.subscribe(req("queue:in"))
    await send_all(conn, "queue:in", "x")
    delivery = await receive(sub)
    await conn.ack(delivery)
    await conn.ack(delivery)  # no effect
    tx = await conn.begin()
    await tx.ack(delivery)
    await tx.send(d("queue:out"), msg("y"))
    with pytest.raises(TransactionRolledBack):
        await tx.commit()
    stats = state.stats("queue:in")
    assert stats is not None and stats.dequeued == 1
    assert state.queue_depth("queue:out") == 0


async def test_a_delivery_of_another_connection_cannot_be_acked_here(
    broker: MemoryBroker, conn: MemoryConnection
) -> None:
    sub = await conn.subscribe(req("queue:in"))
    await send_all(conn, "queue:in", "x")
    delivery = await receive(sub)
    other = await broker.connect()
    await other.ack(delivery)
    assert sub.unsettled_count == 1
    tx = await other.begin()
    await tx.ack(delivery)
    with pytest.raises(TransactionRolledBack):
        await tx.commit()
    assert sub.unsettled_count == 1
    await other.close()


async def test_a_finished_transaction_ignores_work_and_refuses_to_commit(
    conn: MemoryConnection, state: BrokerState
) -> None:
    tx = await conn.begin()
    await tx.send(d("queue:out"), msg("1"))
    await tx.commit()
    await tx.send(d("queue:out"), msg("2"))
    with pytest.raises(TransactionRolledBack):
        await tx.commit()
    await tx.abort()
    aborted = await conn.begin()
    await aborted.abort()
    with pytest.raises(TransactionRolledBack):
        await aborted.commit()
    assert [m.body for m in state.browse("queue:out")] == [b"1"]


# --- delayed sends ---------------------------------------------------------------------------


async def test_a_delayed_send_is_held_from_the_commit_then_goes_behind_later_messages(
    conn: MemoryConnection, state: BrokerState,
) -> None:
    assert (await conn.capabilities()).cannot_hold_delays is None
    queue = d("queue:held")
    sub = await conn.subscribe(req("queue:held"))
    aborted = await conn.begin()
    await aborted.send(queue, replace(msg("aborted"), delay=0.2))
    await aborted.abort()
    tx = await conn.begin()
    await tx.send(queue, replace(msg("held", region="eu"), delay=0.2))
    assert state.held_count == 0  # nothing is held before the commit
    await tx.commit()
    assert state.held_count == 1 and sub.receive_nowait() is None
    await conn.send(queue, msg("later"))
    later, held = await receive(sub), await receive(sub)
    assert (later.body, held.body) == (b"later", b"held")
    assert held.headers["region"] == "eu" and not held.broker_redelivered
    assert state.held_count == 0 and state.queue_depth(queue) == 0  # the aborted one: gone


async def test_a_held_message_outlives_its_sender_and_is_released_to_a_waiter(
    broker: MemoryBroker, state: BrokerState,
) -> None:
    sender = await broker.connect()
    await sender.send(d("queue:later"), replace(msg("held"), delay=0.1))
    state.drop_connections()
    assert state.held_count == 1
    with anyio.fail_after(WAIT):
        await state.wait_until(lambda s: s.queue_depth("queue:later") == 1)
    assert [m.body for m in state.browse("queue:later")] == [b"held"]


async def test_a_receiver_waiting_before_a_message_is_held_gets_it_when_due(
    broker: MemoryBroker,
) -> None:
    receiver, sender = await broker.connect(), await broker.connect()
    sub = await receiver.subscribe(req("queue:waited"))
    got: list[Delivery] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: _append(got, sub))
        await anyio.wait_all_tasks_blocked()  # the receiver waits, with nothing held yet
        await sender.send(d("queue:waited"), replace(msg("held"), delay=0.1))
    assert [g.body for g in got] == [b"held"]


async def _append(got: list[Delivery], sub: MemorySubscription) -> None:
    got.append(await receive(sub))


# --- redelivery on close ---------------------------------------------------------------------


async def test_closing_a_subscription_returns_unsettled_deliveries_to_the_front_flagged(
    conn: MemoryConnection, state: BrokerState
) -> None:
    sub = await conn.subscribe(req("queue:q", prefetch=3))
    await send_all(conn, "queue:q", "1", "2", "3", "4", "5")
    first = await receive(sub)  # 1 received; 2 and 3 pushed but not received
    await conn.ack(await receive(sub))  # 2 settled; 4 pushed
    await sub.close()
    assert [(m.body, m.broker_redelivered) for m in state.browse("queue:q")] == [
        (b"1", True), (b"3", True), (b"4", True), (b"5", False)
    ]
    with pytest.raises(ConnectionLost):
        await sub.receive()
    await sub.close()  # twice is fine

    again = await conn.subscribe(req("queue:q"))
    redelivered = await receive(again)
    assert redelivered.broker_redelivered
    assert redelivered.message_id == first.message_id
    assert await bodies(again, 3) == ["3", "4", "5"]
    await conn.ack(first)  # a stale delivery: no effect on the new subscription
    assert again.unsettled_count == 4


async def test_closing_the_connection_returns_deliveries_and_aborts_transactions(
    broker: MemoryBroker, state: BrokerState
) -> None:
    conn = await broker.connect()
    sub = await conn.subscribe(req("queue:q"))
    await send_all(conn, "queue:q", "x")
    delivery = await receive(sub)
    tx = await conn.begin()
    await tx.ack(delivery)
    await tx.send(d("queue:out"), msg("y"))
    await conn.close()
    assert not conn.is_open and state.connection_count == 0
    with pytest.raises(TransactionRolledBack):
        await tx.commit()
    with pytest.raises(ConnectionLost):
        await sub.receive()
    for operation in (conn.begin(), conn.subscribe(req("queue:q")),
                      conn.send(d("queue:q"), msg("z")), conn.ack(delivery)):
        with pytest.raises(ConnectionLost):
            await operation
    await conn.close()  # twice is fine
    assert [(m.body, m.broker_redelivered) for m in state.browse("queue:q")] == [(b"x", True)]
    assert state.queue_depth("queue:out") == 0


# --- injected failures -----------------------------------------------------------------------


async def test_drop_connections_makes_everything_stale(
    broker: MemoryBroker, state: BrokerState
) -> None:
    conn = await broker.connect()
    busy = await conn.subscribe(req("queue:q", prefetch=2))
    idle = await conn.subscribe(req("queue:idle"))
    await send_all(conn, "queue:q", "1", "2", "3")
    delivery = await receive(busy)
    tx = await conn.begin()
    await tx.ack(delivery)
    await tx.send(d("queue:out"), msg("y"))
    failures: list[BaseException] = []
    started = anyio.Event()

    async def blocked_receive() -> None:
        started.set()
        try:
            await idle.receive()
        except ConnectionLost as exc:
            failures.append(exc)

    with anyio.fail_after(WAIT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(blocked_receive)
            await started.wait()
            assert state.drop_connections() == 1
    assert len(failures) == 1  # the waiting receive was woken with ConnectionLost

    assert not conn.is_open and state.connection_count == 0
    with pytest.raises(ConnectionLost):
        await busy.receive()
    await tx.send(d("queue:out"), msg("after"))  # no effect
    await tx.ack(delivery)  # no effect
    with pytest.raises(TransactionRolledBack):
        await tx.commit()
    with pytest.raises(ConnectionLost):
        await conn.send(d("queue:out"), msg("z"))
    with pytest.raises(ConnectionLost):
        await conn.ack(delivery)
    await busy.close()
    await conn.close()
    assert state.queue_depth("queue:out") == 0
    # 3 was pushed too: the transacted ack of 1 had widened the prefetch window
    assert [(m.body, m.broker_redelivered) for m in state.browse("queue:q")] == [
        (b"1", True), (b"2", True), (b"3", True)
    ]

    fresh = await broker.connect()
    sub = await fresh.subscribe(req("queue:q"))
    again = await receive(sub)
    assert again.broker_redelivered and again.message_id == delivery.message_id
    await fresh.ack(again)
    await fresh.close()


async def test_fail_sends_raises_without_storing(
    conn: MemoryConnection, state: BrokerState
) -> None:
    state.fail_sends(2, SendOutcomeUnknown)
    with pytest.raises(SendOutcomeUnknown):
        await conn.send(d("queue:q"), msg("1"))
    state.fail_sends(1, ConnectionLost)
    with pytest.raises(ConnectionLost):
        await conn.send(d("queue:q"), msg("2"))
    assert conn.is_open  # only the send failed
    await conn.send(d("queue:q"), msg("3"))
    assert [m.body for m in state.browse("queue:q")] == [b"3"]


async def test_fail_sends_can_store_the_message_anyway(
    conn: MemoryConnection, state: BrokerState
) -> None:
    state.fail_sends(1, SendOutcomeUnknown, stored=True)
    with pytest.raises(SendOutcomeUnknown):
        await conn.send(d("queue:q"), msg("in-doubt"))
    assert [m.body for m in state.browse("queue:q")] == [b"in-doubt"]


async def test_fail_sends_makes_a_commit_roll_back(
    conn: MemoryConnection, state: BrokerState
) -> None:
    sub = await conn.subscribe(req("queue:in"))
    await send_all(conn, "queue:in", "x")
    delivery = await receive(sub)
    tx = await conn.begin()
    await tx.ack(delivery)
    await tx.send(d("queue:out"), msg("y"))
    state.fail_sends(1, SendOutcomeUnknown)
    with pytest.raises(TransactionRolledBack) as caught:
        await tx.commit()
    assert isinstance(caught.value.__cause__, SendOutcomeUnknown)
    assert state.queue_depth("queue:out") == 0
    assert sub.unsettled_count == 1  # the ack did not happen

    tx = await conn.begin()
    await tx.ack(delivery)
    await tx.send(d("queue:out"), msg("y"))
    state.fail_sends(1, SendOutcomeUnknown, stored=True)
    with pytest.raises(TransactionRolledBack):
        await tx.commit()
    assert state.queue_depth("queue:out") == 1 and sub.unsettled_count == 0


async def test_refused_sends_store_nothing_and_roll_a_commit_back(
    conn: MemoryConnection, state: BrokerState
) -> None:
    state.refuse_sends_to("queue:forbidden")
    with pytest.raises(BrokerError, match="refused a send to queue:forbidden"):
        await conn.send(d("queue:forbidden"), msg("no"))
    sub = await conn.subscribe(req("queue:in"))
    await send_all(conn, "queue:in", "x")
    delivery = await receive(sub)
    tx = await conn.begin()
    await tx.ack(delivery)
    await tx.send(d("queue:forbidden"), msg("no"))
    with pytest.raises(TransactionRolledBack, match="refused"):
        await tx.commit()
    assert sub.unsettled_count == 1 and state.stats("queue:forbidden") is None
    state.refuse_sends_to("queue:forbidden", refuse=False)
    await conn.send(d("queue:forbidden"), msg("yes"))
    assert state.queue_depth("queue:forbidden") == 1


async def test_dead_letter_settles_and_keeps_the_message_on_the_dlq(
    conn: MemoryConnection, state: BrokerState
) -> None:
    sub = await conn.subscribe(req("queue:in"))
    await send_all(conn, "queue:in", "x")
    delivery = await receive(sub)
    assert (await conn.capabilities()).dead_letters(delivery)
    await conn.dead_letter(delivery)
    assert sub.unsettled_count == 0
    [kept] = state.browse(f"queue:{mdb_memory.DEAD_LETTER_QUEUE}")
    assert (kept.body, kept.headers) == (b"x", delivery.headers)
    with pytest.raises(BrokerError, match="not unsettled"):
        await conn.dead_letter(delivery)  # settled already: nothing more
    assert state.queue_depth(f"queue:{mdb_memory.DEAD_LETTER_QUEUE}") == 1


async def test_refused_connections(broker: MemoryBroker, state: BrokerState) -> None:
    conn = await broker.connect()
    state.refuse_connections(True)
    with pytest.raises(ConnectionFailed):
        await broker.connect()
    assert conn.is_open  # existing connections are not affected
    state.drop_connections()
    with pytest.raises(ConnectionFailed):
        await broker.connect()
    state.refuse_connections(False)
    again = await broker.connect()
    assert again.is_open
    await again.close()


# --- selectors -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("selector", "headers", "matches"),
    [
        ("region = 'EU'", {"region": "EU"}, True),
        ("region = 'EU'", {"region": "US"}, False),
        ("region = 'EU'", {}, False),
        ("region <> 'EU'", {"region": "US"}, True),
        ("region <> 'EU'", {}, False),  # NULL <> 'EU' is unknown
        ("NOT region = 'EU'", {}, False),  # NOT unknown is unknown
        ("region IS NULL", {}, True),
        ("region IS NOT NULL", {"region": "EU"}, True),
        ("amount > 100", {"amount": "150"}, True),
        ("amount > 100", {"amount": "99.5"}, False),
        ("amount >= 100 AND amount <= 200", {"amount": "200"}, True),
        ("amount < -1.5", {"amount": "-2"}, True),
        ("amount > 100", {"amount": "lots"}, False),
        ("amount = 5", {"amount": "5.0"}, True),
        ("name = 'it''s'", {"name": "it's"}, True),
        ("a = 1 OR b = 2", {"b": "2"}, True),
        ("a = 1 OR b = 2", {}, False),
        ("(a = 1 OR b = 2) AND NOT c IS NULL", {"a": "1", "c": "x"}, True),
        ("(a = 1 OR b = 2) AND NOT c IS NULL", {"a": "1"}, False),
        ("a = 1 and B = 2", {"a": "1", "B": "2"}, True),
        ("urgent", {"urgent": "true"}, True),
        ("urgent = TRUE", {"urgent": "false"}, False),
        ("NOT urgent", {"urgent": "FALSE"}, True),
    ],
)
def test_selector_evaluation(selector: str, headers: dict[str, str], matches: bool) -> None:
    assert compile_selector(selector)(headers) is matches


@pytest.mark.parametrize(
    "selector",
    ["", "region =", "region = 'EU", "a LIKE 'x%'", "a IN ('x')", "a BETWEEN 1 AND 2",
     "(a = 1", "a = 1)", "a == 1", "'x'", "a = 1 AND 5", "a IS NOT", "a # b"],
)
def test_selector_outside_the_subset_is_refused(selector: str) -> None:
    with pytest.raises(SelectorError):
        compile_selector(selector)


async def test_unparseable_selector_fails_the_subscription(
    conn: MemoryConnection, state: BrokerState
) -> None:
    with pytest.raises(SubscriptionFailed, match="region LIKE 'E%'"):
        await conn.subscribe(req("topic:t", "sel", selector="region LIKE 'E%'"))
    assert state.queue_names() == []


async def test_selector_picks_matching_messages_and_leaves_the_rest(
    conn: MemoryConnection, state: BrokerState
) -> None:
    eu = await conn.subscribe(req("queue:orders", selector="region = 'EU'"))
    await conn.send(d("queue:orders"), msg("us-1", region="US"))
    await conn.send(d("queue:orders"), msg("eu-1", region="EU"))
    await conn.send(d("queue:orders"), msg("eu-2", region="EU"))
    assert await bodies(eu, 2) == ["eu-1", "eu-2"]
    assert [m.body for m in state.browse("queue:orders")] == [b"us-1"]  # stays, as in ActiveMQ
    anyone = await conn.subscribe(req("queue:orders"))
    assert await bodies(anyone, 1) == ["us-1"]
    await conn.send(d("queue:orders"), msg("eu-3", region="EU"))
    await conn.send(d("queue:orders"), msg("us-2", region="US"))
    assert await bodies(eu, 1) == ["eu-3"]
    assert await bodies(anyone, 1) == ["us-2"]


async def test_selector_on_a_shared_topic_subscription(
    conn: MemoryConnection, state: BrokerState
) -> None:
    sub = await conn.subscribe(req("topic:t", "big", durable=True, selector="amount > 10"))
    await conn.send(d("topic:t"), msg("small", amount="1"))
    await conn.send(d("topic:t"), msg("large", amount="100"))
    assert await bodies(sub, 1) == ["large"]
    # virtual-topic queues get every copy; a non-matching one waits in the queue
    assert state.queue_depth("queue:Consumer.big.VirtualTopic.t") == 1


# --- inspection hooks and volume -------------------------------------------------------------


async def test_headers_are_a_frozen_copy(conn: MemoryConnection) -> None:
    sub = await conn.subscribe(req("queue:q"))
    headers = {"mdb_id": "1", "k": "v"}
    await conn.send(d("queue:q"), OutgoingMessage(b"x", headers))
    headers["k"] = "changed"
    delivery = await receive(sub)
    assert delivery.headers["k"] == "v"
    with pytest.raises(TypeError):
        delivery.headers["k"] = "no"  # type: ignore[index]


async def test_wait_until_wakes_on_changes(conn: MemoryConnection, state: BrokerState) -> None:
    async def producer() -> None:
        for i in range(3):
            await conn.send(d("queue:q"), msg(str(i)))

    with anyio.fail_after(WAIT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(producer)
            await state.wait_until(lambda s: s.queue_depth("queue:q") == 3)


async def test_delete_queue_and_topic_inspection(
    conn: MemoryConnection, state: BrokerState
) -> None:
    sub = await conn.subscribe(req("topic:t", "gone", durable=True))
    assert not state.delete_queue("queue:Consumer.gone.VirtualTopic.t")  # has a consumer
    await sub.close()
    assert state.delete_queue("queue:Consumer.gone.VirtualTopic.t")
    assert state.subscription_names("t") == [] and state.stats("queue:nothing") is None
    with pytest.raises(ConfigurationError):
        state.queue_depth("topic:t")


async def test_thousands_of_messages_through_transactions(
    conn: MemoryConnection, state: BrokerState
) -> None:
    count = 5000
    subs = [await conn.subscribe(req("queue:bulk", prefetch=1)) for _ in range(4)]
    seen: list[str] = []

    async def worker(sub: MemorySubscription) -> None:
        while True:
            delivery = await sub.receive()
            tx = await conn.begin()
            await tx.ack(delivery)
            await tx.send(d("queue:done"), OutgoingMessage(delivery.body, delivery.headers))
            await tx.commit()
            seen.append(delivery.body.decode())

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            for sub in subs:
                tg.start_soon(worker, sub)
            for i in range(count):
                await conn.send(d("queue:bulk"), msg(str(i)))
            await state.wait_until(lambda s: s.queue_depth("queue:done") == count)
            tg.cancel_scope.cancel()
    assert sorted(seen, key=int) == [str(i) for i in range(count)]
    stats = state.stats("queue:bulk")
    assert stats is not None and (stats.depth, stats.in_flight, stats.dequeued) == (0, 0, count)


async def test_closing_a_subscription_wakes_its_receiver(conn: MemoryConnection) -> None:
    sub = await conn.subscribe(req("queue:q"))
    failures: list[BaseException] = []
    started = anyio.Event()

    async def blocked_receive() -> None:
        started.set()
        try:
            await sub.receive()
        except ConnectionLost as exc:
            failures.append(exc)

    with anyio.fail_after(WAIT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(blocked_receive)
            await started.wait()
            await sub.close()
    assert len(failures) == 1


def test_a_state_outlives_event_loops_after_cancelled_waits(name: str) -> None:
    """Named states are module-level: a wait cancelled in one event loop must not break
    waiting in the next (pytest runs every test in its own loop)."""
    broker = MemoryBroker(ConnectionOptions(f"memory://{name}"))
    state = mdb_memory.broker_state(name)
    holder: dict[str, object] = {}

    async def first_loop() -> None:
        conn = await broker.connect()
        sub = await conn.subscribe(req("queue:q"))
        holder["conn"], holder["sub"] = conn, sub
        async with anyio.create_task_group() as tg:
            tg.start_soon(sub.receive)
            tg.start_soon(state.wait_until, lambda s: s.queue_depth("queue:q") > 0)
            await anyio.wait_all_tasks_blocked()
            tg.cancel_scope.cancel()

    async def second_loop() -> None:
        conn = holder["conn"]
        sub = holder["sub"]
        assert isinstance(conn, MemoryConnection) and isinstance(sub, MemorySubscription)
        received: list[bytes] = []

        async def receiver() -> None:
            received.append((await sub.receive()).body)

        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(receiver)
                tg.start_soon(state.wait_until, lambda s: s.connection_count == 2)
                await anyio.wait_all_tasks_blocked()  # both wait before anything changes
                await conn.send(d("queue:q"), msg("x"))
                await broker.connect()
        assert received == [b"x"]

    anyio.run(first_loop)
    anyio.run(second_loop)
