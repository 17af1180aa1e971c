"""Exactly-once listeners (docs/exactly-once.md), on every broker, with SQLite and with
PostgreSQL (a private server, ``tests.harness.servers.postgresql``): the handler's writes, its sends
and the message commit together, and a copy already processed is settled without running the
handler."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from sqlalchemy import event, select, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from mdb import ConfigurationError, Container, Context, Redelivery, Settings, listener
from mdb.config.broker_settings import BrokerSettings
from mdb.config.database_settings import DatabaseSettings
from mdb.exactly_once import inbox, tables
from mdb.exactly_once.database import database as database_module
from mdb.exactly_once.database.database import Database
from mdb.exactly_once.inbox import Taken
from mdb.exactly_once.outbox.dispatcher import Dispatcher
from mdb.exactly_once.outbox.writer import Writer
from mdb.exactly_once.store import Store
from mdb.listeners.context import SendFunction
from mdb.messages.destinations import Destination
from mdb.messages.headers import ID
from mdb.messages.message import Message, OutgoingMessage
from mdb.observability.health import Health
from mdb.routing.producer import Producer
from mdb_memory.state import BrokerState, broker_state
from tests.harness.apps.in_process import (
    WAIT,
    Calls,
    running,
    settings_for,
    specs,
    unique,
    until,
)
from tests.harness.servers.databases import count, database_url, orders, prepared, with_database
from tests.harness.servers.mariadb import MariaDB
from tests.harness.servers.postgresql import PostgreSQL
from tests.harness.traffic.messages import assert_drained, read, send_bodies, send_copies

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgresql),
                        pytest.param("mariadb", marks=pytest.mark.mariadb)])
async def database(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Database]:
    """A database of the test's own, SQLite, PostgreSQL or MariaDB, with mdb's tables (``mdb
    db upgrade``) and the test's."""
    db = await prepared(await database_url(request, tmp_path))
    yield db
    await db.close()


@pytest.fixture
async def postgres_database(postgres: PostgreSQL) -> AsyncIterator[Database]:
    """A PostgreSQL database of the test's own, with mdb's tables and the test's."""
    db = await prepared(await anyio.to_thread.run_sync(postgres.create_database, unique("eo")))
    yield db
    await db.close()


@pytest.fixture(params=[pytest.param("postgresql", marks=pytest.mark.postgresql),
                        pytest.param("mariadb", marks=pytest.mark.mariadb)])
async def server_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of a new database of the test's own on a server (PostgreSQL or MariaDB)."""
    return await database_url(request, tmp_path)


@pytest.fixture
async def server_database(server_url: str) -> AsyncIterator[Database]:
    """A database of the test's own on a server, with mdb's tables and the test's."""
    db = await prepared(server_url)
    yield db
    await db.close()


# Per database: how many of the database's sessions wait for a lock another transaction holds.
_LOCK_WAITS = {
    "postgresql": "SELECT count(*) FROM pg_stat_activity "
                  "WHERE datname = current_database() AND wait_event_type = 'Lock'",
    "mysql": "SELECT count(*) FROM information_schema.innodb_trx "
             "WHERE trx_state = 'LOCK WAIT'",
}


async def lock_waits(database: Database) -> int:
    """How many of ``database``'s sessions wait for a lock another transaction holds."""
    async with database.engine.connect() as connection:
        return int((await connection.execute(
            text(_LOCK_WAITS[connection.dialect.name]))).scalar_one())


async def test_a_copy_of_a_processed_message_is_settled_without_running_the_handler(
    broker_url: str, database: Database,
) -> None:
    queue, out = f"queue:{unique('eo')}", f"queue:{unique('eo_out')}"
    calls = Calls()

    @listener(queue, exactly_once="main")
    async def handler(body: str, ctx: Context, session: AsyncSession) -> None:
        await session.execute(orders.insert().values(id=body, quantity=1))
        await ctx.send(out, f"invoice for {body}")
        calls.add("ran", body)

    await send_copies(broker_url, queue, b"o-1", "m-1", copies=3)
    await send_copies(broker_url, queue, b"o-after", "m-after", copies=1)
    async with running(with_database(broker_url, database), handler) as container:
        sent = await read(broker_url, out, 2)
        await calls.wait(lambda c: "o-after" in c.of("ran"))  # one slot: in order
        assert container.deployed[0].stats.already_processed == 2
        # What /status says and `mdb status` reads back.
        [seen] = Health.from_json(container.health().to_json()).listeners
        assert seen.already_processed == 2
    assert calls.of("ran") == ["o-1", "o-after"]
    assert await count(database, orders) == 2
    assert [d.body for d in sent] == [b"invoice for o-1", b"invoice for o-after"]
    assert await count(database, tables.outbox) == 0  # dispatched, then forgotten
    assert await count(database, tables.inbox) == 2


async def test_a_failed_run_keeps_neither_its_writes_nor_its_sends(
    broker_url: str, database: Database,
) -> None:
    queue, out = f"queue:{unique('eo')}", f"queue:{unique('eo_out')}"
    calls = Calls()

    @listener(queue, exactly_once="main", redelivery=Redelivery(limit=2, delay=0))
    async def handler(body: str, ctx: Context, session: AsyncSession) -> None:
        await session.execute(orders.insert().values(id=f"{body}-{ctx.delivery_count}",
                                                     quantity=1))
        await ctx.send(out, f"sent by delivery {ctx.delivery_count}")
        calls.add("ran", ctx.delivery_count)
        if ctx.delivery_count == 1:
            raise ValueError("the first run fails after writing and sending")

    await send_copies(broker_url, queue, b"o-2", "m-2", copies=1)
    async with running(with_database(broker_url, database), handler):
        sent = await read(broker_url, out, 1)
        await calls.wait(lambda c: c.of("ran") == [1, 2])
    assert [d.body for d in sent] == [b"sent by delivery 2"]
    async with database.session() as session:
        rows = (await session.execute(select(orders.c.id))).scalars().all()
    assert rows == ["o-2-2"]


async def test_a_write_the_database_refuses_fails_the_delivery_like_an_exception(
    broker_url: str, database: Database,
) -> None:
    queue = f"queue:{unique('eo')}"

    @listener(queue, exactly_once="main", redelivery=Redelivery(limit=1, delay=0))
    async def handler(body: str, session: AsyncSession) -> None:
        await session.execute(orders.insert().values(id=body, quantity=None))  # NOT NULL

    await send_copies(broker_url, queue, b"o-3", "m-3", copies=1)
    async with running(with_database(broker_url, database), handler):
        moved = await read(broker_url, f"{queue}.DLQ", 1)
    assert moved[0].headers["mdb_error_type"] == "sqlalchemy.exc.IntegrityError"
    assert await count(database, orders) == 0
    assert await count(database, tables.inbox) == 0


async def test_a_handlers_own_timeout_error_is_its_failure_not_the_databases(
    broker_url: str, database: Database,
) -> None:
    # TimeoutError is an OSError, as a dropped database connection is: raised by the handler
    # (a slow warehouse) it fails the delivery, which goes to its error destination.
    queue = f"queue:{unique('eo')}"

    @listener(queue, exactly_once="main", redelivery=Redelivery(limit=0))
    async def handler(body: str, session: AsyncSession) -> None:
        await session.execute(orders.insert().values(id=body, quantity=1))
        raise TimeoutError("the warehouse did not answer")

    await send_copies(broker_url, queue, b"o-5", "m-5", copies=1)
    async with running(with_database(broker_url, database), handler):
        moved = await read(broker_url, f"{queue}.DLQ", 1)
    assert moved[0].headers["mdb_error_type"] == "TimeoutError"
    assert await count(database, orders) == 0


async def test_two_copies_processed_at_once_run_the_handler_once(
    server_database: Database,
) -> None:
    database, url = server_database, f"memory://{unique('m')}"
    queue = f"queue:{unique('eo')}"
    calls = Calls()
    release = anyio.Event()

    @listener(queue, exactly_once="main", pool=2)
    async def handler(body: str, session: AsyncSession) -> None:
        await session.execute(orders.insert().values(id=body, quantity=1))
        calls.add("ran", body)
        await release.wait()  # the transaction stays open until the test saw both claims

    await send_copies(url, queue, b"o-4", "m-4", copies=2)
    async with running(with_database(url, database), handler) as container:
        await calls.wait(lambda c: bool(c.of("ran")))
        with anyio.fail_after(WAIT):  # the second copy's claim waits on the inbox's key
            while await lock_waits(database) == 0:
                # The database tells only when asked, and InnoDB refreshes what it shows of
                # its transactions only once they were not read for 0.1 s: asked more often,
                # it would show the first answer for ever.
                await anyio.sleep(0.2)
        release.set()
    stats = container.deployed[0].stats
    assert calls.of("ran") == ["o-4"]
    assert (stats.processed, stats.already_processed, stats.rolled_back) == (1, 1, 0)
    assert await count(database, orders) == 1
    assert await count(database, tables.inbox) == 1


def runner_of(database: Database, producer: Producer) -> Callable[[str], Awaitable[None]]:
    """One exactly-once run per call, on ``database``, of a handler that inserts the order
    it is given and sends one message."""
    guard = Store(database, producer, "this-process").guard(
        listener="l", subscription="s", broker="default",
        error_destination=Destination.parse("queue:eo.DLQ"))

    async def handler(session: AsyncSession, send: SendFunction, body: str) -> None:
        await session.execute(orders.insert().values(id=body, quantity=1))
        await send(Destination.parse("queue:eo.out"), OutgoingMessage(body.encode(), {
            ID: body}), None)

    async def run(body: str) -> None:
        message = Message(f"id-{body}", Destination.parse("queue:eo"), body.encode(), {},
                          redelivered=False, delivery_count=1)
        assert await guard.run(message, lambda session, send: handler(session, send, body),
                               at=time.time())

    return run


@pytest.mark.postgresql
async def test_a_run_costs_one_transaction_and_nothing_after_the_dispatch(
    postgres_database: Database, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What reaches PostgreSQL for one delivery: the run's transaction (the claim, the
    handler's write, and one statement with the outbox row and the delete of the row the last
    run dispatched), nothing after its dispatch. No ping of a connection in steady use, no
    statement of its own for the delete: each would be round trips of their own
    (docs/performance.md, "Exactly-once listeners")."""
    monkeypatch.setattr(database_module, "IDLE_PING", 3600.0)  # however loaded the machine
    database = Database("main", postgres_database.settings)  # its pool: connections made here
    queries: list[str] = []  # simple queries: BEGIN, COMMIT, a ping
    statements: list[str] = []

    def connected(dbapi_connection: Any, _record: object) -> None:
        dbapi_connection.driver_connection.add_query_logger(
            lambda query: queries.append(query.query.split(" ")[0].rstrip(";") or "(ping)"))

    def executing(_connection: object, _cursor: object, statement: str,
                  *_rest: object) -> None:
        statements.append(" ".join(statement.split(" ")[:3]))

    event.listen(database.engine.sync_engine, "connect", connected)
    event.listen(database.engine.sync_engine, "before_cursor_execute", executing)
    async with Producer(settings_for(f"memory://{unique('m')}")) as producer:
        run = runner_of(database, producer)
        await run("o-1")  # its dispatch sweeps what an earlier process may have left
        await run("o-2")  # the first delete on this connection: asyncpg learns its array type
        await anyio.lowlevel.checkpoint()  # asyncpg tells its query loggers soon, not at once
        queries.clear()
        statements.clear()
        await run("o-3")
        await anyio.lowlevel.checkpoint()
    ran, began = list(statements), list(queries)
    async with database.session() as session:
        left = list((await session.execute(select(tables.outbox.c.message_id))).scalars())
    await database.close()
    assert began == ["BEGIN", "COMMIT"]
    assert ran == ["INSERT INTO mdb_inbox", "INSERT INTO orders", "WITH forgotten AS"]
    assert left == ["o-3"]  # sent, for the next run to delete: o-3's run deleted o-2's


_COUNTED = ("Questions", "Com_insert", "Com_delete", "Com_commit", "Com_rollback",
            "Com_set_option", "Com_select")


async def statements_so_far(connection: AsyncConnection) -> dict[str, int]:
    """MariaDB's counts of the statements its clients sent, since it started."""
    rows = await connection.execute(text("SHOW GLOBAL STATUS WHERE Variable_name IN "
                                         f"({', '.join(repr(c) for c in _COUNTED)})"))
    return {name: int(value) for name, value in rows}


@pytest.mark.mariadb
async def test_a_run_on_mariadb_costs_its_statements_and_one_commit(
    mariadb: MariaDB, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What reaches MariaDB for one delivery: the run's three inserts, the delete of the row
    the run before dispatched, and its COMMIT (no BEGIN is sent). Not the pool's rollback of
    each connection it takes back after a commit: five round trips."""
    monkeypatch.setattr(database_module, "IDLE_PING", 3600.0)  # however loaded the machine
    database = await prepared(await anyio.to_thread.run_sync(mariadb.create_database,
                                                              unique("eo")))
    async with Producer(settings_for(f"memory://{unique('m')}")) as producer, \
            database.engine.connect() as observer:
        await observer.execution_options(isolation_level="AUTOCOMMIT")
        run = runner_of(database, producer)
        await run("o-1")  # its dispatch sweeps what an earlier process may have left
        before = await statements_so_far(observer)
        await run("o-2")
        after = await statements_so_far(observer)
    await database.close()
    sent = {name: after[name] - before[name] for name in _COUNTED}
    sent["Questions"] -= 1  # the second SHOW STATUS, counted as it runs
    assert sent == {"Questions": 5, "Com_insert": 3, "Com_delete": 1, "Com_commit": 1,
                    "Com_rollback": 0, "Com_set_option": 0, "Com_select": 0}


@pytest.mark.parametrize(("server", "fault", "recovery"), [
    pytest.param("postgres", "stop_immediately", "start", marks=pytest.mark.postgresql,
                 id="postgresql_stopped_and_started"),
    pytest.param("postgres", "pause", "resume", marks=pytest.mark.postgresql,
                 id="postgresql_hung_and_resumed"),
    pytest.param("mariadb", "crash", "start", marks=pytest.mark.mariadb,
                 id="mariadb_killed_and_started"),
    pytest.param("mariadb", "pause", "resume", marks=pytest.mark.mariadb,
                 id="mariadb_hung_and_resumed"),
])
async def test_an_outage_of_the_database_holds_deliveries_and_the_container_unready(
    request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture, server: str, fault: str,
    recovery: str,
) -> None:
    database_server: PostgreSQL | MariaDB = request.getfixturevalue(server)
    url = await anyio.to_thread.run_sync(database_server.create_database, unique("eo"))
    # A short lease: the upkeep, which notices the outage's end, runs every half second.
    database = await prepared(url, timeout=3.0, outbox_lease=1.5)
    name = unique("m")
    broker, state = f"memory://{name}", broker_state(name)
    queue, out = f"queue:{unique('eo')}", f"queue:{unique('eo_out')}"

    @listener(queue, exactly_once="main", pool=2)
    async def handler(body: str, ctx: Context, session: AsyncSession) -> None:
        await session.execute(orders.insert().values(id=body, quantity=1))
        await ctx.send(out, body)

    def settled(count: int) -> Callable[[BrokerState], bool]:
        def condition(s: BrokerState) -> bool:
            stats = s.stats(queue)
            return stats is not None and (stats.dequeued, stats.depth, stats.in_flight) == (
                count, 0, 0)
        return condition

    caplog.set_level(logging.WARNING, "mdb.database")
    caplog.set_level(logging.INFO, "mdb.delivery")
    async with running(with_database(broker, database), handler) as container:
        await send_bodies(broker, queue, [f"o-{n}" for n in range(10)])
        with anyio.fail_after(WAIT):
            await state.wait_until(settled(10))
        await anyio.to_thread.run_sync(getattr(database_server, fault))
        try:
            await send_bodies(broker, queue, [f"o-{n}" for n in range(10, 20)])
            await until(lambda: not container.health().ready)
            assert container.health().unready()["databases_down"] == ["main"]
        finally:
            await anyio.to_thread.run_sync(getattr(database_server, recovery))
        await until(lambda: container.health().ready)
        with anyio.fail_after(WAIT):
            await state.wait_until(settled(20))
        [health] = container.health().databases
        assert health.state == "up"
    # Held while the database was out of reach, not sent back: not one delivery was used up.
    stats = container.deployed[0].stats
    assert (stats.processed, stats.redelivered, stats.rolled_back) == (20, 0, 0)
    async with database.session() as session:
        effects = (await session.execute(select(orders.c.id))).scalars().all()
    assert sorted(effects) == sorted(f"o-{n}" for n in range(20))
    assert await count(database, tables.inbox) == 20
    assert await count(database, tables.outbox) == 0
    # A row sent and not yet deleted when the database went is sent again, with its id.
    assert {d.body for d in state.browse(out)} == {f"o-{n}".encode() for n in range(20)}
    # Not one delivery failed for the outage (a server starting up is not the message's
    # fault), and none was logged as a warning of its own: the outage is, once.
    assert not [r for r in caplog.records if r.name == "mdb.delivery"
                and ("sqlalchemy" in r.getMessage() or r.levelno >= logging.WARNING)]
    outage = [r.getMessage() for r in caplog.records if r.name == "mdb.database"]
    assert len(outage) == 2, outage  # one line as it began, one as it ended
    assert "hold their deliveries" in outage[0] and "answers again" in outage[1]


async def test_every_slot_holds_a_connection_at_once_whatever_pool_size_says(
    caplog: pytest.LogCaptureFixture, server_url: str,
) -> None:
    # docs/deployment.md, "Connections": a slot holds a connection while its handler runs.
    # More slots than pool_size and SQLAlchemy's ten connections beyond it: a slot that
    # waited for one longer than `timeout` took the database for down (an outage, the
    # container not ready), the run held, its slot's message not handled meanwhile.
    database = await prepared(server_url, pool_size=1, timeout=1.0)
    broker, queue, slots = f"memory://{unique('m')}", f"queue:{unique('eo')}", 12
    holding: list[str] = []
    every_slot = anyio.Event()

    @listener(queue, exactly_once="main", pool=slots)
    async def handler(body: str, session: AsyncSession) -> None:
        await session.execute(orders.insert().values(id=body, quantity=1))
        holding.append(body)
        if len(holding) == slots:
            every_slot.set()
        await every_slot.wait()  # each holds its connection until every slot has one

    caplog.set_level(logging.WARNING, "mdb.database")
    async with running(with_database(broker, database), handler) as container:
        await send_bodies(broker, queue, [f"o-{n}" for n in range(slots)])
        with anyio.fail_after(WAIT):
            await every_slot.wait()
        await until(lambda: container.deployed[0].stats.processed == slots)
        assert container.health().ready
    assert not [r.getMessage() for r in caplog.records if r.name == "mdb.database"]
    assert await count(database, orders) == slots
    await database.close()


# Per server: a login of the application's own, for a test to refuse and let in again.
_LOGIN = {
    "postgresql": ("CREATE ROLE shop LOGIN; GRANT ALL ON ALL TABLES IN SCHEMA public TO shop; "
                   "GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO shop",
                   "ALTER ROLE shop NOLOGIN", "ALTER ROLE shop LOGIN"),
    "mysql": ("CREATE USER shop@'%' IDENTIFIED BY 'shop-pw'; GRANT ALL ON *.* TO shop@'%'",
              "ALTER USER shop@'%' IDENTIFIED BY 'rotated'",
              "ALTER USER shop@'%' IDENTIFIED BY 'shop-pw'"),
}
_SESSIONS = {  # the login's sessions, to end as a server restart does
    "postgresql": "SELECT pid FROM pg_stat_activity WHERE usename = 'shop'",
    "mysql": "SELECT id FROM information_schema.processlist WHERE user = 'shop'",
}
_END = {"postgresql": "SELECT pg_terminate_backend({})", "mysql": "KILL {}"}


async def test_a_login_the_database_refuses_meanwhile_is_an_outage_not_the_handlers_failure(
    caplog: pytest.LogCaptureFixture, server_url: str,
) -> None:
    # docs/deployment.md, "Secrets as files": a password rotated on the server before the
    # settings (or a login locked) refuses the connections mdb makes from then on. The
    # database is out of reach for mdb, as when it is down: its deliveries are held, not
    # failed, redelivered and moved to the error destination one after the other.
    admin = await prepared(server_url)  # the server's own login: the tables, the app's login
    server = admin.engine.dialect.name
    create, refuse, let_in = _LOGIN[server]

    async def run(statements: str) -> None:
        async with admin.engine.begin() as connection:
            for statement in statements.split("; "):
                await connection.execute(text(statement))

    await run(create)
    app = Database("main", DatabaseSettings(url=server_url, username="shop", password="shop-pw",
                                            timeout=2.0, outbox_lease=1.5))
    broker = f"memory://{unique('m')}"
    queue = f"queue:{unique('eo')}"

    @listener(queue, exactly_once="main", redelivery=Redelivery(limit=1, delay=0))
    async def handler(body: str, session: AsyncSession) -> None:
        await session.execute(orders.insert().values(id=body, quantity=1))

    caplog.set_level(logging.WARNING, "mdb.database")
    async with running(with_database(broker, app), handler) as container:
        await send_bodies(broker, queue, ["o-0"])
        await until(lambda: container.deployed[0].stats.processed == 1)
        await run(refuse)
        async with admin.engine.begin() as connection:
            for (session,) in (await connection.execute(text(_SESSIONS[server]))).all():
                await connection.execute(text(_END[server].format(int(session))))
        await send_bodies(broker, queue, ["o-1"])
        await until(lambda: not container.health().ready)
        assert container.health().unready()["databases_down"] == ["main"]
        await run(let_in)
        await until(lambda: container.deployed[0].stats.processed == 2)
    stats = container.deployed[0].stats
    assert (stats.redelivered, stats.to_error_destination) == (0, 0)
    assert await count(admin, orders) == 2
    outage = [r.getMessage() for r in caplog.records if r.name == "mdb.database"]
    assert len(outage) == 2 and "answers again" in outage[1], outage
    await app.close()
    await admin.close()


async def terminate_backends(database: Database) -> None:
    """End every other session on ``database``'s database, as an operator's
    ``pg_terminate_backend`` does, and return once they are gone."""
    async with database.engine.connect() as connection:
        ended = [pid for pid, _ in await connection.execute(text(
            "SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"))]
        with anyio.fail_after(WAIT):
            while (await connection.execute(text(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(:ended)"),
                    {"ended": ended})).scalar_one():
                await connection.commit()  # a transaction sees one snapshot of the activity
                await anyio.sleep(0.01)


async def test_a_row_sent_is_deleted_by_the_next_run_or_sweep_and_never_sent_again(
    database: Database,
) -> None:
    """A dispatch sends its rows and leaves their delete to the next run's transaction; a
    sweep, whose claim would take them again once their lease ran out, deletes them first,
    and so does a stop."""
    broker = f"memory://{unique('m')}"
    out = Destination.parse(f"queue:{unique('eo_out')}")
    async with Producer(settings_for(broker)) as producer:
        dispatcher = Dispatcher(database, producer, "this-process")
        await dispatcher.sweep()  # nothing left by an earlier process: a dispatch sends at once
        async with database.session() as session:
            writer = Writer(session, "this-process", lease=60.0, error_destination=None)
            await writer.send(out, OutgoingMessage(b"o-1", {ID: "id-1"}), None)
        await dispatcher.dispatch(writer.rows)
        async with database.session() as session:  # sent; and its lease ran out
            await session.execute(tables.outbox.update().values(lease_until=0.0))
        assert await count(database, tables.outbox) == 1
        assert await dispatcher.sweep() == 0
        assert await count(database, tables.outbox) == 0
    sent = await read(broker, str(out), 1)
    assert [d.headers[ID] for d in sent] == ["id-1"]
    await assert_drained(broker, str(out))


@pytest.mark.postgresql
async def test_a_sweep_skips_the_rows_a_run_is_deleting(postgres_database: Database) -> None:
    """A run deletes the rows its process sent in its own transaction: a sweep of another
    process skips them rather than wait for that transaction, however long it lasts (a
    process stopped in it)."""
    database = postgres_database
    async with database.session() as session:  # sent by a process, its lease run out
        writer = Writer(session, "this-process", lease=0.0, error_destination=None)
        await writer.send(Destination.parse("queue:eo.out"),
                          OutgoingMessage(b"o-1", {ID: "id-1"}), None)
    # That process's next run, not committed yet, and another process's sweep.
    async with Producer(settings_for(f"memory://{unique('m')}")) as producer, \
            database.session() as run:
        await run.execute(tables.outbox.delete())
        assert await Dispatcher(database, producer, "another-process").sweep() == 0
    assert await count(database, tables.outbox) == 0


@pytest.mark.postgresql
async def test_backends_terminated_mid_stream_leave_no_delivery_unsettled(
    broker_url: str, postgres: PostgreSQL,
) -> None:
    url = await anyio.to_thread.run_sync(postgres.create_database, unique("eo"))
    database = await prepared(url, timeout=3.0, outbox_lease=1.5)
    queue, out = f"queue:{unique('eo')}", f"queue:{unique('eo_out')}"
    rounds, per_round = 6, 10
    calls = Calls()

    @listener(queue, exactly_once="main", pool=2)
    async def handler(body: str, ctx: Context, session: AsyncSession) -> None:
        await session.execute(orders.insert().values(id=body, quantity=1))
        await ctx.send(out, body)
        calls.add("ran", body)

    ids_of: dict[bytes, set[str]] = {}

    async def sent_on(bodies: list[str]) -> None:
        while not {b.encode() for b in bodies} <= ids_of.keys():
            for delivery in await read(broker_url, out, 1):
                ids_of.setdefault(delivery.body, set()).add(delivery.headers[ID])

    async with running(with_database(broker_url, database), handler) as container:
        for r in range(rounds):
            bodies = [f"o-{r}-{n}" for n in range(per_round)]
            await send_bodies(broker_url, queue, bodies)
            # Mid-stream, every connection of the container's dies, whatever it is doing (a
            # session, the delete after a dispatch, idle in the pool): the statements that
            # meet it fail. Once a round: a delivery is held once for an outage.
            midway = r * per_round + per_round // 2
            await calls.wait(lambda c, midway=midway: len(c.seen) >= midway)  # type: ignore[misc]
            await terminate_backends(database)
            await sent_on(bodies)
            # The next round's terminations wait until every delivery of this one is settled
            # and a row sent whose delete met a dead connection was sent again (with its id)
            # and deleted: a held run made again then would meet a second outage, and a
            # delivery is held once only (docs/exactly-once.md).
            with anyio.fail_after(WAIT):
                while (container.deployed[0].stats.in_flight
                       or await count(database, tables.outbox)):
                    await anyio.sleep(0.01)  # PostgreSQL and the stats tell only when asked
    # Each delivery that met a dead connection was held and run again on a new one: not
    # one was sent back to the broker (on RabbitMQ that closes the slots' connection).
    assert container.deployed[0].stats.rolled_back == 0
    async with database.session() as session:
        effects = (await session.execute(select(orders.c.id))).scalars().all()
    assert sorted(effects) == sorted(f"o-{r}-{n}" for r in range(rounds)
                                     for n in range(per_round))
    assert all(len(sent_ids) == 1 for sent_ids in ids_of.values())


@pytest.mark.postgresql
async def test_a_delivery_held_for_a_database_that_is_down_is_left_unsettled_at_a_stop(
    postgres: PostgreSQL,
) -> None:
    url = await anyio.to_thread.run_sync(postgres.create_database, unique("eo"))
    database = await prepared(url, timeout=3.0)
    name = unique("m")
    broker, state = f"memory://{name}", broker_state(name)
    queue = f"queue:{unique('eo')}"

    @listener(queue, exactly_once="main")
    async def handler(body: str, session: AsyncSession) -> None:
        await session.execute(orders.insert().values(id=body, quantity=1))

    settings = with_database(broker, database, shutdown_grace_period=0.5)
    try:
        async with running(settings, handler) as container:
            await anyio.to_thread.run_sync(postgres.stop_immediately)
            await send_bodies(broker, queue, ["o-held"])
            await until(lambda: not container.health().ready)
        assert container.deployed[0].stats.processed == 0
        queued = state.stats(queue)
        assert queued is not None and (queued.depth, queued.in_flight) == (1, 0)  # back
        assert [d.broker_redelivered for d in state.browse(queue)] == [True]
    finally:
        await anyio.to_thread.run_sync(postgres.start)
    assert await count(database, orders) == 0


@pytest.mark.postgresql
async def test_a_statement_of_the_handler_that_never_ends_in_time_is_bounded_by_redeliveries(
    postgres_database: Database,
) -> None:
    database = await prepared(postgres_database.settings.url, timeout=1.0)
    name = unique("m")
    broker, state = f"memory://{name}", broker_state(name)
    queue = f"queue:{unique('eo')}"
    calls = Calls()

    @listener(queue, exactly_once="main", redelivery=Redelivery(limit=1, delay=0))
    async def handler(body: str, session: AsyncSession) -> None:
        calls.add("ran", body)
        await session.execute(text("SELECT pg_sleep(30)"))  # past timeout, every time

    async with running(with_database(broker, database), handler):
        await send_bodies(broker, queue, ["o-slow"])
        with anyio.fail_after(WAIT):
            await state.wait_until(lambda s: s.queue_depth(f"{queue}.DLQ") == 1)
    await database.close()
    # The driver's TimeoutError is raised in the handler: a failure of the delivery, as any
    # exception the handler raises (not an outage): one run per delivery, limit + 1 of them.
    assert len(calls.of("ran")) == 2
    assert await count(postgres_database, tables.inbox) == 0


async def test_ids_that_differ_in_case_or_trailing_spaces_are_two_messages(
    database: Database,
) -> None:
    # MariaDB's usual collations would take them for one: the inbox compares bytes.
    async with database.session() as session:
        for message_id in ("m-1", "M-1", "m-1 "):
            assert await inbox.claim(session, "l", "queue:q", message_id, b"1", 1.0) is None
    async with database.session() as session:
        assert await inbox.claim(session, "l", "queue:q", "M-1", b"1", 2.0) == Taken(True, False)
    assert await count(database, tables.inbox) == 3


async def test_a_claim_made_again_as_of_its_first_time_knows_its_own_row(
    database: Database,
) -> None:
    """A run made again after its commit was in doubt claims as of its first claim's time:
    the database compares the time it keeps exactly (docs/exactly-once.md, "A bad day of the
    database")."""
    first = time.time()
    async with database.session() as session:
        assert await inbox.claim(session, "l", "queue:q", "m-1", b"1", first) is None
    async with database.session() as session:
        assert await inbox.claim(session, "l", "queue:q", "m-1", b"1", first) == Taken(
            True, True)
        assert await inbox.claim(session, "l", "queue:q", "m-1", b"2",
                                 first + 1e-6) == Taken(False, False)
        assert await inbox.claim_all(session, "l", "queue:q", {"m-1": b"1", "m-2": b"2"},
                                     first) == {"m-1": Taken(True, True), "m-2": None}


async def test_the_status_shows_each_databases_outbox(database: Database) -> None:
    async with database.session() as session:  # sends another process is dispatching
        writer = Writer(session, "another-process", lease=3600.0, error_destination=None)
        for n in range(3):
            await writer.send(Destination.parse("queue:elsewhere"),
                              OutgoingMessage(b"x", {ID: f"id-{n}"}), None)

    @listener(f"queue:{unique('eo')}", exactly_once="main")
    async def handler(body: str, session: AsyncSession) -> None:
        pass

    async with running(with_database(f"memory://{unique('m')}", database),
                       handler) as container:
        await until(lambda: container.health().databases[0].outbox == 3)
        [shown] = container.health().databases
    assert (shown.name, shown.state) == ("main", "up")
    assert shown.oldest is not None and shown.oldest >= 0


async def test_rows_a_dead_process_left_are_dispatched_once_their_lease_ran_out(
    broker_url: str, database: Database,
) -> None:
    out = f"queue:{unique('eo_out')}"
    async with database.session() as session:  # a run that committed, then its process died
        writer = Writer(session, "dead-process", lease=0.0, error_destination=None)
        for n in range(3):
            await writer.send(Destination.parse(out), OutgoingMessage(
                f"m{n}".encode(), {ID: f"id-{n}"}), None)
    async with Producer(settings_for(broker_url)) as producer:
        with anyio.fail_after(30):
            while await Dispatcher(database, producer, "live-process").sweep() == 0:
                await anyio.sleep(0.05)  # the lease ends by the clock, no event says so
    sent = await read(broker_url, out, 3)
    assert [(d.body, d.headers[ID]) for d in sent] == [(b"m0", "id-0"), (b"m1", "id-1"),
                                                      (b"m2", "id-2")]
    assert await count(database, tables.outbox) == 0


async def test_a_dispatch_that_begins_late_renews_the_rows_lease_at_once(
    database: Database,
) -> None:
    # Its run committed more than a third of the lease after writing them (a loaded
    # machine, a database out of reach meanwhile): the renewal is due at once. It was a
    # negative wait, which ended the container.
    url, out = f"memory://{unique('m')}", f"queue:{unique('eo_out')}"
    async with Producer(settings_for(url)) as producer:
        dispatcher = Dispatcher(database, producer, "this-process")
        await dispatcher.sweep()  # nothing left by an earlier process: a dispatch sends at once
        async with database.session() as session:
            writer = Writer(session, "this-process", lease=0.0, error_destination=None)
            await writer.send(Destination.parse(out), OutgoingMessage(b"m", {ID: "id-m"}), None)
        await dispatcher.dispatch(writer.rows)
        await dispatcher.sweep()  # deletes the row the dispatch sent, and sends nothing again
    assert [d.body for d in await read(url, out, 1)] == [b"m"]
    assert await count(database, tables.outbox) == 0


async def test_a_container_whose_database_lacks_the_tables_says_so(
    broker_url: str, tmp_path: Path,
) -> None:
    empty = DatabaseSettings(url=f"sqlite+aiosqlite:///{tmp_path / 'empty.db'}")

    @listener(f"queue:{unique('eo')}", exactly_once="main")
    async def handler(body: str, session: AsyncSession) -> None:
        pass

    container = Container(settings_for(broker_url, databases={"main": empty}), specs(handler))
    with pytest.raises(ConfigurationError, match="mdb db upgrade"):
        await container.run()


@pytest.mark.mariadb
async def test_a_mariadb_that_would_drop_a_large_outbox_row_is_refused_at_startup(
    mariadb: MariaDB,
) -> None:
    # The server drops the connection of a statement past max_allowed_packet (16 MiB by
    # default): a large send would be an outage at every run of its message.
    database = await prepared(await anyio.to_thread.run_sync(mariadb.create_database,
                                                              unique("eo")))
    async with database.engine.connect() as connection:
        configured = (await connection.execute(text("SELECT @@max_allowed_packet"))).scalar()
        await connection.execute(text("SET GLOBAL max_allowed_packet = 16777216"))
    try:
        await database.engine.dispose()  # a connection reads the global value as it starts
        with pytest.raises(ConfigurationError, match=r"max_allowed_packet is 16 MiB, less "
                                                     r"than the 144 MiB"):
            await tables.check(database.engine, "main")
    finally:
        async with database.engine.connect() as connection:
            await connection.execute(text(f"SET GLOBAL max_allowed_packet = {configured}"))
        await database.close()
    # What it accepts, a body of 20 MiB included (its bytes escaped: twice as long at most).
    database = await prepared(database.settings.url)
    try:
        await tables.check(database.engine, "main")
        async with database.session() as session:
            writer = Writer(session, "this-process", 30.0, error_destination=None)
            await writer.send(Destination.parse("queue:q"), OutgoingMessage(
                b"\0" * (20 << 20), {ID: "m-1"}), None)
        assert await count(database, tables.outbox) == 1
    finally:
        await database.close()



@pytest.mark.mariadb
async def test_a_statement_past_a_max_allowed_packet_lowered_under_a_container_names_it(
    mariadb: MariaDB, caplog: pytest.LogCaptureFixture,
) -> None:
    """The server's max_allowed_packet lowered while a container runs (a restart with another
    configuration): the server drops the connection of a larger statement, which is no outage
    but the statement's failure, and the log line and the error copy name the setting."""
    database = await prepared(await anyio.to_thread.run_sync(mariadb.create_database,
                                                              unique("eo")), timeout=3.0)
    url = f"memory://{unique('m')}"
    queue, out = f"queue:{unique('eo')}", f"queue:{unique('eo_out')}"

    @listener(queue, exactly_once="main", redelivery=Redelivery(limit=1, delay=0))
    async def handler(body: str, ctx: Context) -> None:
        await ctx.send(out, b"\1" * (20 << 20))  # an outbox row of 20 MiB

    async with database.engine.connect() as connection:
        configured = (await connection.execute(text("SELECT @@max_allowed_packet"))).scalar()
    caplog.set_level(logging.WARNING)
    try:
        async with running(with_database(url, database), handler) as container:
            async with database.engine.connect() as connection:
                await connection.execute(text("SET GLOBAL max_allowed_packet = 16777216"))
                # Its connections end, as at a restart: those made next read the new value.
                for (thread,) in await connection.execute(text(
                        "SELECT id FROM information_schema.processlist "
                        "WHERE db = DATABASE() AND id <> CONNECTION_ID()")):
                    await connection.execute(text(f"KILL {int(thread)}"))
            await send_copies(url, queue, b"big", "m-1", copies=1)
            [moved] = await read(url, f"{queue}.DLQ", 1)
            stats = container.deployed[0].stats
    finally:
        async with database.engine.connect() as connection:
            await connection.execute(text(f"SET GLOBAL max_allowed_packet = {configured}"))
        await database.close()
    assert "max_allowed_packet" in moved.headers["mdb_error_message"]
    assert stats.to_error_destination == 1
    assert any("max_allowed_packet" in r.getMessage() for r in caplog.records
               if r.levelno >= logging.WARNING)
    # The connections killed: one outage, begun and ended; the large statement is none.
    assert len([r for r in caplog.records if "answers again" in r.getMessage()]) <= 1


def test_an_exactly_once_listener_names_a_configured_database() -> None:
    @listener("queue:q", exactly_once="missing")
    async def handler(body: str, session: AsyncSession) -> None:
        pass

    @listener("queue:q")
    async def unguarded(body: str, session: AsyncSession) -> None:
        pass

    with pytest.raises(ConfigurationError, match=r"\[databases.missing\]"):
        Container(settings_for("memory://x"), specs(handler))
    with pytest.raises(ConfigurationError, match="only an exactly_once listener"):
        Container(settings_for("memory://x"), specs(unguarded))


def test_a_name_an_outbox_row_reads_back_is_checked_at_startup() -> None:
    """A name too long for its outbox column that mdb reads back (a broker's, a reply goes
    through it; an error destination) is refused at startup, naming the setting: a key
    column keeps a digest instead (``tables.fitted``)."""
    @listener("queue:q", exactly_once="main")
    async def handler(body: str, session: AsyncSession) -> None:
        pass

    main = {"main": DatabaseSettings()}
    broker = "b" * 201
    with pytest.raises(ConfigurationError, match=rf"setting brokers.{broker}: a name of 201 "
                                                 r"characters, more than the 200"):
        Container(Settings(brokers={broker: BrokerSettings()}, databases=main), specs(handler))

    @listener("queue:q", exactly_once="main", error_destination=f"queue:{'e' * 1000}")
    async def erring(body: str, session: AsyncSession) -> None:
        pass

    with pytest.raises(ConfigurationError, match=r"listener 'erring': its error destination: "
                                                 r"a name of 1006 characters"):
        Container(settings_for("memory://x", databases=main), specs(erring))
