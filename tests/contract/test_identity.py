"""One identity per message for exactly-once listeners (docs/exactly-once.md, "Identity"): a
message keeps the identity it was first seen with through every copy mdb makes of it, copies
on any member of a partitioned destination are recognised, and different messages never
count as one."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from sqlalchemy import event, select, text
from sqlalchemy.ext.asyncio import AsyncSession

from mdb import Context, Redelivery, listener
from mdb.commands.dlq.failed import ErrorDestination
from mdb.errors import DatabaseUnavailable
from mdb.exactly_once import tables
from mdb.exactly_once.database.database import Database
from mdb.exactly_once.guard import Guard
from mdb.exactly_once.outbox.dispatcher import Dispatcher
from mdb.exactly_once.outbox.writer import Writer
from mdb.messages.destinations import Destination
from mdb.messages.headers import ID
from mdb.messages.identity import Seal
from mdb.messages.message import OutgoingMessage
from mdb.messages.topology import Member
from mdb.routing.producer import Producer
from mdb.seam.broker import ConnectionOptions, SubscriptionRequest
from mdb.seam.registry import broker_for
from mdb_memory.state import BrokerState, broker_state
from tests.harness.apps.in_process import (
    Calls,
    partitioned_settings,
    running,
    settings_for,
    unique,
    until,
)
from tests.harness.processes.cli import mdb
from tests.harness.servers.databases import (
    count,
    database_url,
    orders,
    prepared,
    ran,
    with_database,
)
from tests.harness.servers.mariadb import MariaDB
from tests.harness.servers.postgresql import PostgreSQL
from tests.harness.servers.process import BrokerProcess
from tests.harness.traffic.messages import assert_drained, read, send_copies, send_foreign

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


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    """The application's identity secret, in a file (``identity_secret_file``)."""
    path = tmp_path / "identity-secret"
    path.write_text(f"{uuid.uuid4().hex}{uuid.uuid4().hex}\n")
    return path


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
        await ran(session, calls, body)

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
        await ran(session, calls, body)

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


async def test_an_id_the_application_reuses_never_makes_mdb_skip_another_message(
    broker_url: str, database: Database, caplog: pytest.LogCaptureFixture, secret_file: Path,
) -> None:
    """The application itself (with its secret) sends two messages under one ``mdb_id``: the
    second is not taken for a copy of the first but moved aside (docs/exactly-once.md,
    "Identity")."""
    queue = f"queue:{unique('eo')}"
    calls = Calls()

    @listener(queue, exactly_once="main", redelivery=Redelivery(limit=0))
    async def handler(body: str, session: AsyncSession) -> None:
        calls.add("ran", body)
        await session.execute(orders.insert().values(id=body, quantity=1))

    caplog.set_level(logging.WARNING, "mdb.delivery")
    settings = with_database(broker_url, database, identity_secret_file=secret_file)
    async with Producer(settings) as producer:
        for body in ("the first order", "another order"):
            await producer.send(queue, body, headers={ID: "order-7"})
    async with running(settings, handler) as container:
        [moved] = await read(broker_url, f"{queue}.DLQ", 1)
    assert calls.of("ran") == ["the first order"]
    assert moved.body == b"another order"
    assert moved.headers["mdb_error_type"] == "mdb.IdentityReused"
    assert container.deployed[0].stats.already_processed == 0
    assert any("order-7" in r.getMessage() and r.levelno == logging.WARNING
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


async def _leased_until(database: Database) -> list[float]:
    async with database.session() as session:
        return list((await session.execute(
            select(tables.outbox.c.lease_until).order_by(tables.outbox.c.seq))).scalars())


async def _held_dispatch(url: str) -> tuple[Database, Destination, list[Any]]:
    """Three rows written with a lease of 1 s, for a dispatch whose first send waits."""
    database = await prepared(url, outbox_lease=1.0)
    out = Destination.parse(f"queue:{unique('eo_out')}")
    async with database.session() as session:
        writer = Writer(session, "this-process", database.settings.outbox_lease,
                        error_destination=None)
        for n in range(3):
            await writer.send(out, OutgoingMessage(f"m{n}".encode(), {ID: f"id-{n}"}), None)
    return database, out, writer.rows


def _holding(producer: Producer, release: anyio.Event) -> None:
    """``producer``'s first send waits for ``release``: a broker that takes its time."""
    send = producer.send_message

    async def slow_first(destination: Destination, message: OutgoingMessage, *,
                         key: str | None = None, prefer: str | None = None) -> Member:
        if message.headers[ID] == "id-0":
            await release.wait()
        return await send(destination, message, key=key, prefer=prefer)

    producer.send_message = slow_first  # type: ignore[method-assign]


async def test_a_dispatch_that_outlives_its_lease_keeps_its_rows(url: str) -> None:
    """A dispatch still sending when the lease its rows were written with runs out keeps them:
    no other process's sweep (nor this one's) takes them and sends them a second time."""
    database, out, rows = await _held_dispatch(url)
    broker = f"memory://{unique('m')}"
    written_until = time.time() + database.settings.outbox_lease
    release = anyio.Event()
    async with Producer(settings_for(broker)) as producer:
        _holding(producer, release)  # the broker takes its time: the lease runs out
        dispatcher = Dispatcher(database, producer, "this-process")
        async with anyio.create_task_group() as tg:
            tg.start_soon(dispatcher.dispatch, rows)
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


async def test_a_dispatch_cut_short_while_its_rows_lease_is_kept_ends_the_keeping(
    url: str,
) -> None:
    """The lease keeper starts only once a renewal is due (a timer); a dispatch cancelled
    after that (a stop) ends it with the dispatch: no renewal goes on for rows no longer
    being sent, which the next sweep takes once their lease ran out."""
    database, _, rows = await _held_dispatch(url)
    written = await _leased_until(database)
    async with Producer(settings_for(f"memory://{unique('m')}")) as producer:
        _holding(producer, anyio.Event())
        dispatcher = Dispatcher(database, producer, "this-process")
        async with anyio.create_task_group() as tg:
            tg.start_soon(dispatcher.dispatch, rows)
            with anyio.fail_after(30):
                while (await _leased_until(database))[0] <= written[0]:
                    await anyio.sleep(0.05)  # the database tells a renewal only when asked
            tg.cancel_scope.cancel()
    keeping = [t for t in asyncio.all_tasks() if "_keep_leased" in repr(t.get_coro())]
    assert keeping == []  # the only place a renewal runs
    await database.close()


async def test_a_dispatch_whose_lease_cannot_be_renewed_stops_sending(url: str) -> None:
    """The database out of reach at a renewal: the rows' lease will run out, and another
    process's sweep will take them, so the dispatch sends no more of them and raises."""
    database, out, rows = await _held_dispatch(url)
    release = anyio.Event()
    async with Producer(settings_for(broker := f"memory://{unique('m')}")) as producer:
        _holding(producer, release)
        dispatcher = Dispatcher(database, producer, "this-process")

        def unreachable() -> Any:
            release.set()
            raise DatabaseUnavailable("database main: no answer in 1 s")

        database.autocommitted = unreachable  # type: ignore[method-assign]
        with pytest.raises(DatabaseUnavailable, match="no answer"):
            await dispatcher.dispatch(rows)
    sent = broker_state(broker.removeprefix("memory://")).queue_depth(out)
    assert sent == 1  # the one under way when the renewal failed; not the two after it
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


@pytest.mark.parametrize("server", [
    pytest.param("postgres", marks=pytest.mark.postgresql),
    pytest.param("mariadb", marks=pytest.mark.mariadb)])
async def test_names_longer_than_the_inbox_keeps_are_processed(
    request: pytest.FixtureRequest, server: str,
) -> None:
    """A listener name of 210 characters, a queue of 420 and an application of 250 are valid
    names; the inbox and the outbox keep them within their columns (docs/exactly-once.md,
    "Databases")."""
    database_server: PostgreSQL | MariaDB = request.getfixturevalue(server)
    database = await prepared(await anyio.to_thread.run_sync(database_server.create_database,
                                                             unique("eo")))
    url = f"memory://{unique('m')}"
    queue, out = f"queue:{'q' * 420}", f"queue:{unique('eo_out')}"

    @listener(queue, exactly_once="main", name="l" * 210)
    async def handler(body: str, ctx: Context, session: AsyncSession) -> None:
        await session.execute(orders.insert().values(id=body, quantity=1))
        await ctx.send(out, body)

    try:
        await send_copies(url, queue, b"o-1", "m-1", copies=2)
        async with running(with_database(url, database, app="a" * 250),
                           handler) as container:
            [sent] = await read(url, out, 1)
            stats = container.deployed[0].stats
            await until(lambda: stats.already_processed == 1)
        assert (stats.processed, stats.to_error_destination) == (1, 0)
        assert sent.body == b"o-1"
        assert await count(database, orders) == 1
    finally:
        await database.close()


@pytest.mark.rabbitmq
async def test_a_twin_moved_aside_as_reused_runs_as_a_new_message_once_replayed(
    rabbitmq: BrokerProcess, database: Database,
) -> None:
    """Two foreign messages of one content on RabbitMQ: the second cannot be told from a copy
    and is moved aside (docs/exactly-once.md, "Identity"); replayed, it is a message of its
    own (docs/failed-messages.md), not a copy of the first."""
    url, queue = rabbitmq.url, f"queue:{unique('eo')}"
    calls = Calls()

    @listener(queue, exactly_once="main")
    async def handler(body: str, session: AsyncSession) -> None:
        await ran(session, calls, body)

    await send_foreign(url, queue, [b"add 1", b"add 1"])
    settings = with_database(url, database)
    async with running(settings, handler) as container:
        stats = container.deployed[0].stats
        await until(lambda: stats.to_error_destination == 1)
        done = await ErrorDestination(container.brokers, f"{queue}.DLQ").replay()
        assert done.taken == 1
        await calls.wait(lambda c: len(c.of("ran")) == 2)
        await until(lambda: stats.processed == 2)
    assert stats.already_processed == 0
    assert await count(database, orders) == 2
    await assert_drained(url, f"{queue}.DLQ")


async def test_an_id_the_application_reused_runs_as_a_new_message_once_replayed(
    broker_url: str, database: Database, secret_file: Path,
) -> None:
    """The second of two messages the application sent under one ``mdb_id`` is moved aside as
    reused; replayed, it runs under a new identity (docs/failed-messages.md), and a replay of
    the first kind (its identity kept) is still taken as the message it is."""
    queue = f"queue:{unique('eo')}"
    calls = Calls()

    @listener(queue, exactly_once="main", redelivery=Redelivery(limit=0))
    async def handler(body: str, ctx: Context, session: AsyncSession) -> None:
        calls.add("id", ctx.id)
        await ran(session, calls, body)

    settings = with_database(broker_url, database, identity_secret_file=secret_file)
    async with Producer(settings) as producer:
        for body in ("the first order", "another order"):
            await producer.send(queue, body, headers={ID: "order-7"})
    async with running(settings, handler) as container:
        stats = container.deployed[0].stats
        await until(lambda: stats.to_error_destination == 1)
        assert (await ErrorDestination(container.brokers, f"{queue}.DLQ").replay()).taken == 1
        await calls.wait(lambda c: len(c.of("ran")) == 2)
    assert calls.of("ran") == ["the first order", "another order"]
    [first, replayed] = calls.of("id")
    assert first == "order-7" and replayed != "order-7"
    assert stats.already_processed == 0
    await assert_drained(broker_url, f"{queue}.DLQ")


@pytest.fixture
async def real_broker_url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue(request.param).url)


REAL_BROKERS = pytest.mark.parametrize("real_broker_url", [
    pytest.param("activemq", marks=pytest.mark.activemq),
    pytest.param("rabbitmq", marks=pytest.mark.rabbitmq)], indirect=True)


@REAL_BROKERS
@pytest.mark.parametrize("forged", ["another body", "the same body, another header"])
async def test_a_forged_mdb_id_sent_first_costs_the_genuine_message_nothing(
    real_broker_url: str, database: Database, forged: str, secret_file: Path,
) -> None:
    """A producer that is not mdb copies the ``mdb_id`` of a message mdb sends (and perhaps
    its body) and gets its forgery there first: the genuine message is processed all the
    same, with its own headers, and nothing reaches the error destination."""
    url, queue = real_broker_url, f"queue:{unique('eo')}"
    calls = Calls()
    seen: dict[str | None, tuple[str, str]] = {}  # by tenant: the body and the identity

    @listener(queue, exactly_once="main", redelivery=Redelivery(limit=0))
    async def handler(body: str, ctx: Context, session: AsyncSession) -> None:
        seen[ctx.message.headers.get("tenant")] = (body, ctx.id)
        await ran(session, calls, body)

    settings = with_database(url, database, identity_secret_file=secret_file)
    victim = unique("victim")
    body = b"order 7" if forged.startswith("the same") else b"a forger's order"
    await send_foreign(url, queue, [body], mdb_id=victim, tenant="evil")
    async with Producer(settings) as producer:  # the application's: it has the secret
        await producer.send(queue, "order 7", headers={"mdb_id": victim, "tenant": "good"})
    async with running(settings, handler) as container:
        await calls.wait(lambda c: len(c.of("ran")) == 2)
        await until(lambda: container.deployed[0].stats.processed == 2)
        stats = container.deployed[0].stats
    assert (stats.to_error_destination, stats.already_processed) == (0, 0)
    assert seen["good"] == ("order 7", victim)  # known by its mdb_id: proven
    assert seen["evil"][0] == body.decode() and seen["evil"][1] != victim
    await assert_drained(url, f"{queue}.DLQ")


def next_connections_message_id(seen: str) -> str:
    """The JMSMessageID ActiveMQ gives the first message of the STOMP connection made after
    the one that sent ``seen`` (``ID:<broker>:<connection>:-1:1:<message>``): predictable."""
    broker, connection, *_ = seen.rsplit(":", 4)
    return f"{broker}:{int(connection) + 1}:-1:1:1"


@pytest.mark.activemq
async def test_a_claimed_mdb_id_never_meets_a_jmsmessageid_it_predicted(
    activemq: BrokerProcess, database: Database,
) -> None:
    """A forger predicts the JMSMessageID ActiveMQ will give the next connection's first
    message, and sends its own message first with that ``mdb_id``: the foreign message that
    then gets the id is processed, not moved aside."""
    url, queue = activemq.url, f"queue:{unique('eo')}"
    probe = Destination.parse(f"queue:{unique('probe')}")
    calls = Calls()

    @listener(queue, exactly_once="main", redelivery=Redelivery(limit=0))
    async def handler(body: str, session: AsyncSession) -> None:
        calls.add("ran", body)
        await session.execute(orders.insert().values(id=body, quantity=1))

    forger = await broker_for(ConnectionOptions(url=url, client_id=unique("f"))).connect()
    try:
        await forger.send(probe, OutgoingMessage(b"probe", {"content-type": "text/plain"}))
        subscription = await forger.subscribe(SubscriptionRequest(
            probe, None, durable=True, selector=None, prefetch=1))
        seen = await subscription.receive()
        await forger.ack(seen)
        assert seen.message_id is not None
        predicted = next_connections_message_id(seen.message_id)
        await forger.send(Destination.parse(queue), OutgoingMessage(
            b"forged", {"content-type": "text/plain", ID: predicted}))
    finally:
        await forger.close()
    await send_foreign(url, queue, [b"genuine"])  # the next connection's first message
    async with running(with_database(url, database), handler) as container:
        await calls.wait(lambda c: len(c.of("ran")) == 2)
        await until(lambda: container.deployed[0].stats.processed == 2)
        assert container.deployed[0].stats.to_error_destination == 0
    assert sorted(map(str, calls.of("ran"))) == ["forged", "genuine"]


@pytest.mark.rabbitmq
@pytest.mark.parametrize(("server", "fault", "recovery"), [
    pytest.param("postgres", "pause", "resume", marks=pytest.mark.postgresql,
                 id="postgresql_hung"),
    pytest.param("mariadb", "pause", "resume", marks=pytest.mark.mariadb, id="mariadb_hung"),
])
async def test_a_twin_held_through_an_outage_is_not_taken_for_a_copy(
    request: pytest.FixtureRequest, rabbitmq: BrokerProcess, server: str, fault: str,
    recovery: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run made again once the database answers is flagged redelivered for the handler, and
    that is no evidence of a copy: a twin of a message processed before still goes to the error
    destination, as it does without an outage."""
    runs = Calls()
    run = Guard.run_all

    async def observed(self: Guard, *args: Any, **kwargs: Any) -> Any:
        try:
            return await run(self, *args, **kwargs)
        except DatabaseUnavailable:
            runs.add("unavailable", None)
            raise

    monkeypatch.setattr(Guard, "run_all", observed)
    database_server: PostgreSQL | MariaDB = request.getfixturevalue(server)
    database = await prepared(await anyio.to_thread.run_sync(database_server.create_database,
                                                             unique("eo")), timeout=2.0,
                              outbox_lease=1.5)
    url, queue = rabbitmq.url, f"queue:{unique('eo')}"
    calls = Calls()

    @listener(queue, exactly_once="main")
    async def handler(body: str, session: AsyncSession) -> None:
        await ran(session, calls, body)

    try:
        async with running(with_database(url, database), handler) as container:
            await send_foreign(url, queue, [b"add 1"])
            # Settled, not only run: a database stopped before the first run's commit (or in
            # its handler's statement) makes that run the one held through the outage.
            await until(lambda: container.deployed[0].stats.processed == 1)
            await anyio.to_thread.run_sync(getattr(database_server, fault))
            try:
                await send_foreign(url, queue, [b"add 1"])
                await runs.wait(lambda c: bool(c.of("unavailable")))  # the twin's run: held
            finally:
                await anyio.to_thread.run_sync(getattr(database_server, recovery))
            [moved] = await read(url, f"{queue}.DLQ", 1)
        assert moved.headers["mdb_error_type"] == "mdb.IdentityReused"
        assert container.deployed[0].stats.already_processed == 0
        assert await count(database, orders) == 1
    finally:
        await database.close()


@pytest.mark.rabbitmq
async def test_a_run_whose_commit_was_in_doubt_knows_its_own_row_when_made_again(
    rabbitmq: BrokerProcess, database: Database, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The run committed and the database's answer was lost: made again once the database
    answers, the message (RabbitMQ, no id: known by its content) finds the row of its own
    first run, not a twin's: already processed, not run twice nor moved aside."""
    url, queue = rabbitmq.url, f"queue:{unique('eo')}"
    calls = Calls()
    run_all = Guard.run_all

    async def answer_lost(self: Guard, messages: Any, handler: Any, *, at: float) -> Any:
        ran = await run_all(self, messages, handler, at=at)
        if not calls.of("lost"):
            calls.add("lost", None)
            raise DatabaseUnavailable("the answer to the commit was lost")
        return ran

    monkeypatch.setattr(Guard, "run_all", answer_lost)

    @listener(queue, exactly_once="main")
    async def handler(body: str, session: AsyncSession) -> None:
        calls.add("ran", body)
        await session.execute(orders.insert().values(id=body, quantity=1))

    async with running(with_database(url, database), handler) as container:
        await send_foreign(url, queue, [b"add 1"])
        stats = container.deployed[0].stats
        await until(lambda: stats.already_processed == 1)
    assert calls.of("ran") == ["add 1"]
    assert stats.to_error_destination == 0
    assert await effects(database) == ["add 1"]


async def test_a_container_proves_with_the_secret_its_database_holds(
    broker_url: str, database: Database,
) -> None:
    """With no ``identity_secret_file``, a container with exactly-once listeners proves and
    checks with the secret ``mdb db upgrade`` made in its database (docs/security.md): a
    message proven with it is known by its ``mdb_id``; one proven with another secret, or
    none, by its id bound to its content, so that a producer's repeat (its id and content
    again) is one message and another content under its id another (docs/exactly-once.md,
    "Identity")."""
    secret = await tables.identity_secret(database.engine)
    assert secret is not None
    queue = f"queue:{unique('eo')}"
    calls = Calls()
    identities: dict[str, str] = {}  # body -> identity

    @listener(queue, exactly_once="main")
    async def handler(body: str, ctx: Context, session: AsyncSession) -> None:
        identities[body] = ctx.id
        await ran(session, calls, body)

    def sent(body: bytes, mdb_id: str, seal: Seal | None = None) -> OutgoingMessage:
        message = OutgoingMessage(body, {ID: mdb_id, "content-type": "text/plain"})
        return message if seal is None else seal.sealed(message)

    connection = await broker_for(ConnectionOptions(url=broker_url,
                                                    client_id=unique("w"))).connect()
    try:
        for message in (sent(b"proven", "m-app", Seal(secret)),
                        sent(b"another's", "m-other", Seal(b"another application's secret")),
                        sent(b"claimed", "m-claim"), sent(b"claimed", "m-claim"),
                        sent(b"claimed otherwise", "m-claim")):
            await connection.send(Destination.parse(queue), message)
    finally:
        await connection.close()
    async with running(with_database(broker_url, database), handler) as container:
        await calls.wait(lambda c: len(c.of("ran")) == 4)
        stats = container.deployed[0].stats
        await until(lambda: stats.already_processed == 1)
    assert identities["proven"] == "m-app"
    assert identities["another's"].startswith("m-other#")
    assert identities["claimed"].startswith("m-claim#")
    assert identities["claimed otherwise"].startswith("m-claim#")
    assert identities["claimed"] != identities["claimed otherwise"]
    assert stats.to_error_destination == 0


@REAL_BROKERS
async def test_mdb_dlq_replay_proves_with_the_secret_of_the_applications_database(
    real_broker_url: str, tmp_path: Path,
) -> None:
    """An error copy of a message whose run committed (its delivery was in doubt until its
    redeliveries ran out), replayed with ``mdb dlq replay``: the command proves it with the
    secret of the settings' database as a container does, so the listener takes it as the
    message it processed, not as a producer's new one."""
    database = await prepared(f"sqlite+aiosqlite:///{tmp_path / 'app.db'}")
    secret = await tables.identity_secret(database.engine)
    assert secret is not None
    url, queue = real_broker_url, f"queue:{unique('eo')}"
    calls = Calls()

    @listener(queue, exactly_once="main")
    async def handler(body: str, session: AsyncSession) -> None:
        calls.add("ran", body)
        await session.execute(orders.insert().values(id=body, quantity=1))

    config = tmp_path / "mdb.toml"
    config.write_text(f'[brokers.default]\nurl = "{url}"\n'
                      f'[databases.main]\nurl = "{database.settings.url}"\n')
    try:
        async with running(with_database(url, database), handler) as container:
            await send_copies(url, queue, b"order 1", "order-1", copies=1, seal=Seal(secret))
            await calls.wait(lambda c: c.of("ran") == ["order 1"])
            await send_copies(url, f"{queue}.DLQ", b"order 1", "order-1", copies=1,
                              seal=Seal(secret), headers={
                                  "mdb_original_destination": queue,
                                  "mdb_error_type": "mdb.InDoubt"})
            replayed = await anyio.to_thread.run_sync(lambda: mdb(
                "dlq", "replay", f"{queue}.DLQ", "--config", str(config), cwd=tmp_path))
            assert replayed.returncode == 0, replayed.stderr
            stats = container.deployed[0].stats
            await until(lambda: stats.already_processed == 1)
        assert calls.of("ran") == ["order 1"]
        assert await count(database, orders) == 1
    finally:
        await database.close()


@pytest.mark.parametrize("destination", ["queue", "topic"])
async def test_a_message_the_application_sends_is_known_by_its_mdb_id(
    broker_url: str, destination: str, secret_file: Path,
) -> None:
    """Its proof holds on the way through each broker (a queue, a topic's subscription queue),
    whatever the broker writes on it (a reply-to's address, a time to live counted down, a
    virtual topic's originalDestination), and through a retry copy mdb makes of it."""
    target = f"{destination}:{unique('ids')}"
    calls = Calls()

    @listener(target, redelivery=Redelivery(limit=1, delay=0))
    async def handler(ctx: Context) -> None:
        calls.add("id", ctx.id)
        if ctx.delivery_count == 1:
            raise ValueError("the first delivery fails: the retry is mdb's copy")

    settings = settings_for(broker_url, identity_secret_file=secret_file)
    async with running(settings, handler), Producer(settings) as producer:
        sent = await producer.send(target, "order 1", headers={"expiration": "600000"},
                                   reply_to="queue:replies", correlation_id="c-1")
        await calls.wait(lambda c: len(c.of("id")) == 2)
    assert calls.of("id") == [sent, sent]
