"""A database of the test's own for exactly-once listeners (docs/exactly-once.md): a SQLite
file in the test's folder or a database on the private PostgreSQL or MariaDB server
(``tests.harness.postgresql``, ``tests.harness.mariadb``), with mdb's tables (``mdb db
upgrade``) and the test's own ``orders``."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, func, select

from mdb.database_settings import DatabaseSettings
from mdb.exactly_once import tables
from mdb.exactly_once.database import Database
from mdb.settings import Settings
from tests.harness.in_process import settings_for, unique
from tests.harness.mariadb import MariaDB
from tests.harness.postgresql import PostgreSQL

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


async def count(database: Database, table: Table) -> int:
    async with database.session() as session:
        return int((await session.execute(select(func.count()).select_from(table))).scalar_one())
