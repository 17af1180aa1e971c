"""SQLite's statements through aiosqlite's connection thread (``mdb.exactly_once.sqlite``): each
one trip there and back, its rows with it, and every way SQLAlchemy reads rows still reads
them all."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiosqlite
import pytest
from sqlalchemy import Column, Integer, MetaData, Table, select

from mdb.config.database_settings import DatabaseSettings
from mdb.exactly_once.database.database import Database

pytestmark = pytest.mark.anyio

tables = MetaData()
numbers = Table("numbers", tables, Column("n", Integer, primary_key=True))


@pytest.fixture
async def database(tmp_path: Path) -> AsyncIterator[Database]:
    database = Database("main", DatabaseSettings(url=f"sqlite+aiosqlite:///{tmp_path}/eo.db"))
    async with database.engine.begin() as connection:
        await connection.run_sync(tables.create_all)
        await connection.execute(numbers.insert(), [{"n": n} for n in range(200)])
    yield database
    await database.close()


async def test_a_statement_and_its_rows_cost_one_trip_to_the_connections_thread(
    database: Database, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each trip wakes the event loop from the thread: four a statement (the cursor, the
    # statement, its rows, the close) made an exactly-once run on SQLite twice as dear.
    trips: list[str] = []
    execute = aiosqlite.Connection._execute

    async def counted(self: aiosqlite.Connection, fn: Any, *args: Any, **kwargs: Any) -> Any:
        trips.append(getattr(fn, "__name__", repr(fn)))
        return await execute(self, fn, *args, **kwargs)  # type: ignore[no-untyped-call]

    async with database.session() as session:
        monkeypatch.setattr(aiosqlite.Connection, "_execute", counted)
        rows = (await session.execute(select(numbers.c.n).where(numbers.c.n < 5))).all()
        await session.execute(numbers.insert().values(n=1000))
        assert len(trips) == 2, trips
    assert [n for (n,) in rows] == [0, 1, 2, 3, 4]


async def test_rows_read_a_few_at_a_time_are_all_read(database: Database) -> None:
    # A server-side cursor (stream_results) fetches a few at a time, from the rows the
    # statement's one trip brought back.
    async with database.engine.connect() as connection:
        streamed = await connection.stream(select(numbers.c.n).order_by(numbers.c.n))
        seen = [n async for partition in streamed.partitions(7) for (n,) in partition]
    assert seen == list(range(200))
    async with database.session() as session:
        result = await session.execute(select(numbers.c.n).order_by(numbers.c.n))
        assert result.fetchone() == (0,)
        assert [n for (n,) in result.fetchmany(3)] == [1, 2, 3]
        assert len(result.fetchall()) == 196


async def test_a_connection_committed_before_it_comes_back_costs_no_rollback(
    database: Database, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The pool's own reset rolled back every connection it took back, committed or not: a
    # trip to the connection's thread after each delivery's commit.
    rollbacks: list[object] = []
    rollback = aiosqlite.Connection.rollback

    async def counted(self: aiosqlite.Connection) -> None:
        rollbacks.append(self)
        await rollback(self)

    monkeypatch.setattr(aiosqlite.Connection, "rollback", counted)
    async with database.session() as session:
        await session.execute(numbers.insert().values(n=1000))
    assert rollbacks == []


async def test_a_connection_given_back_with_its_transaction_open_is_rolled_back(
    database: Database,
) -> None:
    # Begun behind SQLAlchemy's back (an application's raw use of the driver): the pool finds
    # it open as it takes the connection back, and its write lock goes with the rollback.
    async with database.engine.connect() as connection:
        driver = (await connection.get_raw_connection()).driver_connection
        assert driver is not None
        await driver.execute("BEGIN IMMEDIATE")
        await driver.execute("INSERT INTO numbers (n) VALUES (5000)")
    async with database.session() as session:
        await session.execute(numbers.insert().values(n=5001))
        found = (await session.execute(select(numbers.c.n).where(numbers.c.n >= 5000))).all()
    assert found == [(5001,)]
