"""A producer's outbox (``mdb.exactly_once.Outbox``) and the order the outbox keeps, on the
memory broker and SQLite: a send commits with the caller's transaction and goes after it;
while the broker is down the messages wait, and go in order once it is back
(docs/exactly-once.md, "Producers: the outbox and store-and-forward")."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, func, select

from mdb import BrokerError, ConfigurationError
from mdb.config.broker_settings import BrokerSettings
from mdb.config.database_settings import DatabaseSettings
from mdb.config.settings import Settings
from mdb.exactly_once import Outbox, tables
from mdb.exactly_once.database.database import Database
from mdb.exactly_once.outbox.dispatcher import Dispatcher
from mdb.exactly_once.outbox.writer import Writer
from mdb.messages.destinations import Destination
from mdb.messages.headers import ID
from mdb.messages.message import OutgoingMessage
from mdb.routing.producer import Producer
from mdb_memory import BrokerState, broker_state

pytestmark = pytest.mark.anyio

user_tables = MetaData()
orders = Table("orders", user_tables, Column("id", String(100), primary_key=True),
               Column("quantity", Integer, nullable=False))


@pytest.fixture
async def settings(tmp_path: Path) -> AsyncIterator[Settings]:
    """A memory broker that gives up a send at once while it is down, and a SQLite database
    with mdb's tables (``mdb db upgrade``) and the test's own."""
    made = Settings(
        brokers={"default": BrokerSettings(url=f"memory://{tmp_path.name}",
                                           send_wait_for_reconnect=0, reconnect_delay=0.01,
                                           reconnect_max_delay=0.01)},
        databases={"main": DatabaseSettings(url=f"sqlite+aiosqlite:///{tmp_path / 'app.db'}")})
    database = Database("main", made.databases["main"])
    await tables.upgrade(database.engine)
    async with database.engine.begin() as connection:
        await connection.run_sync(user_tables.create_all)
    await database.close()
    yield made


def state_of(settings: Settings) -> BrokerState:
    return broker_state(str(settings.brokers["default"].url).removeprefix("memory://"))


def bodies(settings: Settings, queue: str) -> list[bytes]:
    return [d.body for d in state_of(settings).browse(queue)]


def broker_down(settings: Settings, down: bool = True) -> None:
    state = state_of(settings)
    state.refuse_connections(down)
    if down:
        state.drop_connections()


async def rows(outbox: Outbox, table: Table) -> int:
    async with outbox.database.session() as session:
        return int((await session.execute(select(func.count()).select_from(table)))
                   .scalar_one())


async def test_a_send_commits_with_the_callers_transaction_and_goes_after_it(
        settings: Settings) -> None:
    async with Producer(settings) as producer, Outbox(producer) as outbox:
        async with outbox.database.session() as session:
            await session.execute(orders.insert().values(id="o-1", quantity=2))
            await outbox.send(session, "queue:orders", {"order": "o-1"})
        with pytest.raises(ValueError):
            async with outbox.database.session() as session:
                await session.execute(orders.insert().values(id="o-2", quantity=2))
                await outbox.send(session, "queue:orders", {"order": "o-2"})
                raise ValueError("the request fails: neither its row nor its message")
        assert bodies(settings, "queue:orders") == []
        assert await outbox.dispatch() == 1
        assert bodies(settings, "queue:orders") == [b'{"order":"o-1"}']
        assert await rows(outbox, orders) == 1
        assert await rows(outbox, tables.outbox) == 0


async def test_messages_wait_while_the_broker_is_down_and_go_in_order_per_key(
        settings: Settings) -> None:
    async with Producer(settings) as producer, Outbox(producer) as outbox:

        async def send(body: str, key: str) -> None:
            async with outbox.database.session() as session:
                await outbox.send(session, "queue:events", body, key=key)
            await outbox.dispatch()

        broker_down(settings)
        for body in ["A1", "B1", "A2", "B2", "A3"]:
            await send(body, body[0])
        assert await rows(outbox, tables.outbox) == 5
        broker_down(settings, False)
        await send("B3", "B")  # the first after the outage goes behind those that waited
    sent = [b.decode() for b in bodies(settings, "queue:events")]
    assert [b for b in sent if b[0] == "A"] == ["A1", "A2", "A3"]
    assert [b for b in sent if b[0] == "B"] == ["B1", "B2", "B3"]


async def test_during_an_outage_only_one_caller_at_a_time_waits_for_the_broker(
        settings: Settings) -> None:
    # A web app's requests: once the broker is known down, a request whose dispatch finds
    # another waiting for the broker returns at once; its message waits in the outbox.
    patient = settings.model_copy(update={"brokers": {"default": settings.brokers[
        "default"].model_copy(update={"send_wait_for_reconnect": 600.0})}})
    async with Producer(patient) as producer, Outbox(producer) as outbox:

        async def write(body: str) -> None:
            async with outbox.database.session() as session:
                await outbox.send(session, "queue:events", body)

        broker_down(settings)
        outbox._failing = True  # as after a first dispatch that failed
        await write("first")
        async with anyio.create_task_group() as requests:
            requests.start_soon(outbox.dispatch)  # waits for the broker
            await anyio.wait_all_tasks_blocked()
            await write("second")
            with anyio.fail_after(30):  # a bound against hanging, not a timing
                assert await outbox.dispatch() == 0
            broker_down(settings, False)  # the first request's dispatch sends both
        assert await rows(outbox, tables.outbox) == 0
    assert bodies(settings, "queue:events") == [b"first", b"second"]


async def test_a_runs_rows_wait_behind_older_rows_of_their_destination_that_could_not_go(
        settings: Settings) -> None:
    # A listener's run dispatches its own rows at once; older rows of the same destination,
    # released when the broker was down, must go first.
    database = Database("main", settings.databases["main"])
    try:
        async with Producer(settings) as producer:
            dispatcher = Dispatcher(database, producer, "this-process")

            async def run(body: str) -> Writer:
                async with database.session() as session:
                    writer = Writer(session, "this-process", 30.0, error_destination=None)
                    await writer.send(Destination.parse("queue:events"),
                                      OutgoingMessage(body.encode(), {ID: body}), "A")
                return writer

            broker_down(settings)
            first = await run("A1")
            with pytest.raises(BrokerError):
                await dispatcher.dispatch(first.rows)
            broker_down(settings, False)
            await dispatcher.dispatch((await run("A2")).rows)
    finally:
        await database.close()
    assert bodies(settings, "queue:events") == [b"A1", b"A2"]


async def test_an_outbox_names_a_configured_database_and_checks_the_sessions(
        settings: Settings, tmp_path: Path) -> None:
    async with Producer(settings) as producer:
        with pytest.raises(ConfigurationError, match="'other' is not one"):
            Outbox(producer, "other")
        other = Database("other", DatabaseSettings(url=f"sqlite+aiosqlite:///{tmp_path}/o.db"))
        async with Outbox(producer) as outbox, other.session() as session:
            with pytest.raises(ConfigurationError, match="another database"):
                await outbox.send(session, "queue:orders", "lost")
        await other.close()

