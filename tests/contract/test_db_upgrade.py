"""``mdb db upgrade`` run by several processes at once, as a rollout's init containers or two
Jobs run it (docs/deployment.md, "Exactly-once"): each ends, one creates the tables, the
others find them made; on SQLite, PostgreSQL and MariaDB."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from mdb.config.database_settings import DatabaseSettings
from mdb.exactly_once import tables
from mdb.exactly_once.database.database import Database
from mdb.exactly_once.database.startup import at_startup
from tests.harness.servers.databases import database_url

pytestmark = pytest.mark.anyio

AT_ONCE = 8


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgresql),
                        pytest.param("mariadb", marks=pytest.mark.mariadb)])
async def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A new database without mdb's tables."""
    return await database_url(request, tmp_path)


async def test_upgrades_at_once_each_end_and_the_tables_are_made_once(url: str) -> None:
    databases = [Database("main", DatabaseSettings(url=url)) for _ in range(AT_ONCE)]
    created: list[list[str]] = []

    async def upgrade(database: Database) -> None:
        async with at_startup(database):  # as `mdb db upgrade` runs it
            created.append(await tables.upgrade(database.engine))

    try:
        async with anyio.create_task_group() as group:
            for database in databases:
                group.start_soon(upgrade, database)
        assert sorted(created) == [[]] * (AT_ONCE - 1) + [
            ["mdb_inbox", "mdb_outbox", "mdb_secret", "the identity secret"]]
        await tables.check(databases[0].engine, "main")
    finally:
        for database in databases:
            await database.close()
