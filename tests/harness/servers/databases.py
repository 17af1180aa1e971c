"""A database of the test's own for exactly-once listeners (docs/exactly-once.md): a SQLite
file in the test's folder or a database on the private PostgreSQL or MariaDB server
(``tests.harness.servers.postgresql``, ``tests.harness.servers.mariadb``), with mdb's tables (``mdb
db upgrade``) and the test's own ``orders``."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from mdb.config.database_settings import DatabaseSettings
from mdb.config.settings import Settings
from mdb.exactly_once import tables
from mdb.exactly_once.database.database import Database
from tests.harness.apps.in_process import Calls, settings_for, unique
from tests.harness.servers.mariadb import MariaDB
from tests.harness.servers.postgresql import PostgreSQL

user_tables = MetaData()
orders = Table("orders", user_tables, Column("id", String(100), primary_key=True),
               Column("quantity", Integer, nullable=False))


async def prepared(url: str, **settings: float) -> Database:
    db = Database("main", DatabaseSettings(url=url, **settings))
    await tables.upgrade(db.engine)
    async with db.engine.begin() as connection:
        await connection.run_sync(user_tables.create_all)
    return db


async def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of a new database: ``request.param`` is ``"sqlite"``, ``"postgresql"`` or
    ``"mariadb"`` (the session's ``postgres`` or ``mariadb`` server, ``tests/conftest.py``)."""
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'app.db'}"
    server: PostgreSQL | MariaDB = request.getfixturevalue(
        "postgres" if request.param == "postgresql" else request.param)
    return await anyio.to_thread.run_sync(server.create_database, unique("eo"))


def with_database(url: str, database: Database, **values: object) -> Settings:
    return settings_for(url, databases={"main": database.settings}, **values)


async def ran(session: AsyncSession, calls: Calls, body: str, separator: str = "-") -> None:
    """A handler's run of ``body``: told to ``calls`` (``"ran"``), and its row in ``orders``,
    one per run (``<body><separator><a count>``), so that a run made twice shows."""
    calls.add("ran", body)
    await session.execute(orders.insert().values(id=f"{body}{separator}{len(calls.seen)}",
                                                 quantity=1))


async def count(database: Database, table: Table) -> int:
    async with database.session() as session:
        return int((await session.execute(select(func.count()).select_from(table))).scalar_one())
