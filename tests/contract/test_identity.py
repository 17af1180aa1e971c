"""One identity per message for exactly-once listeners (docs/exactly-once.md, "Identity"): a
message keeps the identity it was first seen with through every copy mdb makes of it, copies
on any member of a partitioned destination are recognised, and different messages never
count as one."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

import anyio
import pytest
from sqlalchemy import event, select, text
from sqlalchemy.ext.asyncio import AsyncSession

from mdb import Context, Redelivery, listener
from mdb.adapters import broker_for
from mdb.broker import ConnectionOptions
from mdb.destinations import Destination
from mdb.exactly_once import tables
from mdb.exactly_once.database import Database
from mdb.exactly_once.outbox import Dispatcher, Writer
from mdb.message import ID, OutgoingMessage
from mdb.producer import Producer
from mdb.topology import Member
from mdb_memory.state import BrokerState, broker_state
from tests.harness.databases import count, database_url, orders, prepared, with_database
from tests.harness.in_process import Calls, partitioned_settings, running, settings_for, unique
from tests.harness.messages import read, send_copies

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgresql),
                        pytest.param("mariadb", marks=pytest.mark.mariadb)])
async def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database of the test's own, SQLite, PostgreSQL or MariaDB."""
    return await database_url(request, tmp_path)


@pytest.fixture
async def database(url: str) -> AsyncIterator[Database]:
    """That database with mdb's tables and the test's."""
    db = await prepared(url)
    yield db
    await db.close()


async def send_foreign(url: str, destination: str, bodies: Sequence[bytes]) -> None:
    """Messages as a producer that is not mdb sends them: no ``mdb_id``, no header of mdb's."""
    connection = await broker_for(ConnectionOptions(url=url, client_id=unique("w"))).connect()
    try:
        for body in bodies:
            await connection.send(Destination.parse(destination),
                                  OutgoingMessage(body, {"content-type": "text/plain"}))
    finally:
        await connection.close()


def settled(queue: str, messages: int) -> Callable[[BrokerState], bool]:
    """Whether ``queue`` of a memory broker settled ``messages`` and holds none."""
    def condition(state: BrokerState) -> bool:
        stats = state.stats(queue)
        return stats is not None and (stats.dequeued, stats.depth, stats.in_flight) == (
            messages, 0, 0)
    return condition


async def effects(database: Database) -> list[str]:
    async with database.session() as session:
        return sorted((await session.execute(select(orders.c.id))).scalars().all())


async def test_a_foreign_message_back_in_doubt_after_its_commit_does_not_run_again(
    database: Database, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Committed, dispatched, then the connection lost before the ack: the broker redelivers
    the message flagged, the container re-sends it as a copy in doubt, and the copy must be
    known as the message whose run committed, though the message came without an id."""
    name = unique("m")
    url, state = f"memory://{name}", broker_state(name)
    queue = f"queue:{unique('eo')}"
    calls = Calls()
    dispatch = Dispatcher.dispatch

    async def dispatch_then_lose_the_connection(self: Dispatcher, rows: object) -> None:
        await dispatch(self, rows)  # type: ignore[arg-type]
        if len(calls.of("ran")) == 1:  # the first run committed and was dispatched
            state.drop_connections()  # before its ack

    monkeypatch.setattr(Dispatcher, "dispatch", dispatch_then_lose_the_connection)

    @listener(queue, exactly_once="main")
    async def handler(body: str, ctx: Context, session: AsyncSession) -> None:
        calls.add("ran", ctx.redelivered)
        await session.execute(orders.insert().values(id=f"{body}-{len(calls.seen)}",
                                                     quantity=1))

    async with running(with_database(url, database), handler):
        await send_foreign(url, queue, [b"o-1"])
        with anyio.fail_after(30):  # the message and its copy in doubt
            await state.wait_until(settled(queue, 2))
    assert calls.of("ran") == [False]
    assert await effects(database) == ["o-1-1"]


async def test_copies_of_one_message_on_two_members_run_once(database: Database) -> None:
    urls = [f"memory://{unique('m')}" for _ in range(3)]
    queue = unique("eo")
    calls = Calls()

    @listener(f"queue:{queue}", exactly_once="main")
    async def handler(body: str, session: AsyncSession) -> None:
        calls.add("ran", body)
        await session.execute(orders.insert().values(id=f"{body}-{len(calls.seen)}",
                                                     quantity=1))

    # One message, dispatched twice from an outbox (its process died after the first send
    # was confirmed, before the row was deleted), each time to another member.
    await send_copies(urls[0], f"queue:{queue}.a", b"o-1", "m-1", copies=1)
    await send_copies(urls[1], f"queue:{queue}.b", b"o-1", "m-1", copies=1)
    settings = partitioned_settings(urls, [f"queue:{queue}"], named=True,
                                    databases={"main": database.settings})
    async with running(settings, handler) as container:
        with anyio.fail_after(30):
            for url, member in zip(urls[:2], ("a", "b"), strict=True):
                await broker_state(url.removeprefix("memory://")).wait_until(
                    settled(f"queue:{queue}.{member}", 1))
    stats = container.deployed[0].stats
    assert (stats.processed, stats.already_processed) == (1, 1)
    assert calls.of("ran") == ["o-1"]
    assert await effects(database) == ["o-1-1"]


async def test_two_foreign_messages_with_one_body_both_run(
    broker_url: str, database: Database,
) -> None:
    queue = f"queue:{unique('eo')}"
    calls = Calls()

    @listener(queue, exactly_once="main")
    async def handler(body: str, session: AsyncSession) -> None:
        calls.add("ran", body)
        await session.execute(orders.insert().values(id=f"{body}-{len(calls.seen)}",
                                                     quantity=1))

    await send_foreign(broker_url, queue, [b"add 1", b"add 1"])
    async with running(with_database(broker_url, database), handler):
        if broker_url.startswith("stomp+rabbitmq"):
            # RabbitMQ keeps no id of a message a producer sent without one: two such
            # messages with one content cannot be told from a copy, and the second is moved
            # aside, not run and not dropped (docs/exactly-once.md, "Identity").
            [moved] = await read(broker_url, f"{queue}.DLQ", 1)
            assert moved.headers["mdb_error_type"] == "mdb.IdentityReused"
            assert calls.of("ran") == ["add 1"]
        else:
            await calls.wait(lambda c: len(c.of("ran")) == 2)
    assert await count(database, orders) == len(calls.of("ran"))


async def test_a_reused_id_never_makes_mdb_skip_another_message(
    broker_url: str, database: Database, caplog: pytest.LogCaptureFixture,
) -> None:
    queue = f"queue:{unique('eo')}"
    calls = Calls()

    @listener(queue, exactly_once="main", redelivery=Redelivery(limit=0))
    async def handler(body: str, session: AsyncSession) -> None:
        calls.add("ran", body)
        await session.execute(orders.insert().values(id=body, quantity=1))

    caplog.set_level(logging.WARNING, "mdb.delivery")
    await send_copies(broker_url, queue, b"the victim's order", "victim-7", copies=1)
    await send_copies(broker_url, queue, b"a forger's order", "victim-7", copies=1)
    async with running(with_database(broker_url, database), handler) as container:
        [moved] = await read(broker_url, f"{queue}.DLQ", 1)
    assert calls.of("ran") == ["the victim's order"]
    assert moved.body == b"a forger's order"
    assert moved.headers["mdb_error_type"] == "mdb.IdentityReused"
    assert container.deployed[0].stats.already_processed == 0
    assert any("victim-7" in r.getMessage() and r.levelno == logging.WARNING
               for r in caplog.records)


async def test_a_handler_that_ends_mdbs_transaction_fails_and_commits_nothing(
    database: Database,
) -> None:
    url = f"memory://{unique('m')}"
    queue, out = f"queue:{unique('eo')}", f"queue:{unique('eo_out')}"

    @listener(queue, exactly_once="main", redelivery=Redelivery(limit=0))
    async def handler(body: str, ctx: Context, session: AsyncSession) -> None:
        await session.execute(orders.insert().values(id=body, quantity=1))
        await ctx.send(out, body)
        await getattr(session, body)()  # commit, rollback or close: mdb's to do

    await send_copies(url, queue, b"commit", "m-1", copies=1)
    await send_copies(url, queue, b"rollback", "m-2", copies=1)
    await send_copies(url, queue, b"close", "m-3", copies=1)
    async with running(with_database(url, database), handler):
        moved = await read(url, f"{queue}.DLQ", 3)
    assert {d.headers["mdb_error_type"] for d in moved} == {"mdb.errors.SessionMisuse"}
    assert await count(database, orders) == 0
    assert await count(database, tables.inbox) == 0
    assert await count(database, tables.outbox) == 0
    assert broker_state(url.removeprefix("memory://")).queue_depth(out) == 0


async def test_sends_go_to_a_member_on_the_deliverys_broker_first(database: Database) -> None:
    urls = [f"memory://{unique('m')}" for _ in range(3)]
    inbound, out = unique("eo"), unique("eo_out")
    calls = Calls()

    @listener(f"queue:{inbound}", exactly_once="main")
    async def handler(body: str, ctx: Context) -> None:
        await ctx.send(f"queue:{out}", body)
        calls.add("ran", body)

    bodies = [f"o-{n}".encode() for n in range(6)]
    for n, body in enumerate(bodies):
        await send_copies(urls[1], f"queue:{inbound}", body, f"m-{n}", copies=1)
    settings = partitioned_settings(urls, [f"queue:{inbound}", f"queue:{out}"],
                                    databases={"main": database.settings})
    async with running(settings, handler):
        await calls.wait(lambda c: len(c.of("ran")) == len(bodies))
        sent = await read(urls[1], f"queue:{out}", len(bodies))
    assert sorted(d.body for d in sent) == bodies  # all on broker b, where they came from


async def test_a_run_made_again_after_an_outage_of_the_database_is_flagged_redelivered(
    tmp_path: Path,
) -> None:
    """A run that met an outage is held and made again once the database answers: its first
    run may have had effects outside the database, so the second says so."""
    database = await prepared(f"sqlite+aiosqlite:///{tmp_path / 'app.db'}")
    url = f"memory://{unique('m')}"
    queue = f"queue:{unique('eo')}"
    calls = Calls()

    @listener(queue, exactly_once="main")
    async def handler(body: str, ctx: Context, session: AsyncSession) -> None:
        calls.add("ran", ctx.redelivered)
        if len(calls.seen) == 1:  # SQLite's "no such table" is an OperationalError: an outage
            await session.execute(text("SELECT * FROM no_such_table"))
        await session.execute(orders.insert().values(id=body, quantity=1))

    await send_copies(url, queue, b"o-1", "m-1", copies=1)
    async with running(with_database(url, database), handler):
        await calls.wait(lambda c: len(c.of("ran")) == 2)
    await database.close()
    assert calls.of("ran") == [False, True]


async def test_a_dispatch_that_outlives_its_lease_keeps_its_rows(url: str) -> None:
    """A dispatch still sending when the lease its rows were written with runs out keeps them:
    no other process's sweep (nor this one's) takes them and sends them a second time."""
    database = await prepared(url, outbox_lease=1.0)
    broker = f"memory://{unique('m')}"
    out = Destination.parse(f"queue:{unique('eo_out')}")
    lease = database.settings.outbox_lease
    async with database.session() as session:
        writer = Writer(session, "this-process", lease, error_destination=None)
        for n in range(3):
            await writer.send(out, OutgoingMessage(f"m{n}".encode(), {ID: f"id-{n}"}), None)
    written_until = time.time() + lease
    release = anyio.Event()
    async with Producer(settings_for(broker)) as producer:
        send = producer.send_message

        async def slow_first(destination: Destination, message: OutgoingMessage, *,
                             key: str | None = None, prefer: str | None = None) -> Member:
            if message.headers[ID] == "id-0" and not release.is_set():
                await release.wait()  # the broker takes its time: the lease runs out
            return await send(destination, message, key=key, prefer=prefer)

        producer.send_message = slow_first  # type: ignore[method-assign]
        dispatcher = Dispatcher(database, producer, "this-process")
        async with anyio.create_task_group() as tg:
            tg.start_soon(dispatcher.dispatch, writer.rows)
            with anyio.fail_after(30):
                while time.time() <= written_until:
                    await anyio.sleep(0.05)  # the lease ends by the clock, no event says so
            release.set()  # a sweep that takes the rows sends them (once) from here
            assert await Dispatcher(database, producer, "another-process").sweep() == 0
        await dispatcher.forget_sent()  # as the next run's transaction, or the upkeep, does
    sent = await read(broker, str(out), 3)
    assert sorted(d.headers[ID] for d in sent) == ["id-0", "id-1", "id-2"]
    assert broker_state(broker.removeprefix("memory://")).queue_depth(out) == 0
    assert await count(database, tables.outbox) == 0
    await database.close()


async def test_a_copy_leaves_the_rows_a_dispatch_under_way_holds_to_it(database: Database) -> None:
    """A copy of a message whose run committed dispatches that run's rows before it is
    acked, unless the run's own dispatch (in this process or another) is still sending
    them: then it waits for that dispatch instead of sending them a second time."""
    broker = f"memory://{unique('m')}"
    out = Destination.parse(f"queue:{unique('eo_out')}")
    source = "listener/queue:eo/m-1"
    async with database.session() as session:
        writer = Writer(session, "first-process", database.settings.outbox_lease,
                        error_destination=None)
        sends = writer.sends_for(source)  # a handler's: held until the run writes them
        for n in range(2):
            await sends(out, OutgoingMessage(f"m{n}".encode(), {ID: f"id-{n}"}), None)
        await writer.write()
    release, looked = anyio.Event(), Calls()

    def executing(_connection: object, _cursor: object, statement: str, *_: object) -> None:
        if "mdb_outbox.source" in statement:
            looked.add("statement", statement)

    event.listen(database.engine.sync_engine, "before_cursor_execute", executing)
    async with Producer(settings_for(broker)) as producer:
        send = producer.send_message

        async def held(destination: Destination, message: OutgoingMessage, *,
                       key: str | None = None, prefer: str | None = None) -> Member:
            if message.headers[ID] == "id-0":
                looked.add("sending", message.headers[ID])
                await release.wait()  # the first dispatch is still sending
            return await send(destination, message, key=key, prefer=prefer)

        producer.send_message = held  # type: ignore[method-assign]
        first = Dispatcher(database, producer, "first-process")

        async def dispatched() -> None:
            await first.dispatch(writer.rows)
            await first.forget_sent()  # as the first process's next run, or its upkeep, does

        async with anyio.create_task_group() as tg:
            tg.start_soon(dispatched)
            await looked.wait(lambda c: len(c.of("sending")) == 1)
            tg.start_soon(Dispatcher(database, producer, "copy-process").dispatch_pending, source)
            # The copy looked at the rows twice, or took one and is sending it too.
            await looked.wait(lambda c: len(c.of("statement")) >= 2 or len(c.of("sending")) > 1)
            release.set()
    sent = await read(broker, str(out), 2)
    assert sorted(d.headers[ID] for d in sent) == ["id-0", "id-1"]
    assert broker_state(broker.removeprefix("memory://")).queue_depth(out) == 0
