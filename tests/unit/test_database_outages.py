"""Which connections ``mdb.exactly_once.database`` hands out after the database failed: none
that may have died with it, so that a delivery held for an outage is not run again on a dead
connection and sent back to the broker."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import event, text
from sqlalchemy.pool import ConnectionPoolEntry

from mdb.config.database_settings import DatabaseSettings
from mdb.errors import DatabaseUnavailable
from mdb.exactly_once.database.database import Database

pytestmark = pytest.mark.anyio


async def test_a_connection_being_made_when_the_database_failed_is_replaced(
    tmp_path: Path,
) -> None:
    """A server that ends every session (PostgreSQL's ``pg_terminate_backend`` of each, a
    restart) also ends the one a driver is still setting up; the pool must not take that
    connection for one made after the failure because it was ready after it."""
    database = Database("main", DatabaseSettings(url=f"sqlite+aiosqlite:///{tmp_path}/eo.db"))
    made: list[ConnectionPoolEntry] = []

    def connecting(_dialect: object, record: ConnectionPoolEntry, *_args: object) -> None:
        if not made:  # while the first connection is being made, the database fails
            database.unavailable(DatabaseUnavailable("database main: every session ended"))
        made.append(record)

    event.listen(database.engine.sync_engine, "do_connect", connecting)
    async with database.session() as session:
        assert (await session.execute(text("SELECT 1"))).scalar_one() == 1
    await database.close()
    assert len(made) == 2  # the first was replaced before it was used
    assert database.down is None  # and the session on the second ended the outage


async def test_connections_made_while_the_database_keeps_failing_are_an_outage(
    tmp_path: Path,
) -> None:
    """While a server restarts, other sessions keep failing as each new connection is made:
    the pool retires each as made before the last failure, gives up after its retries and
    says "This connection is closed". That is the database out of reach (the delivery held,
    the upkeep trying again), not an error of mdb's to end the container with."""
    database = Database("main", DatabaseSettings(url=f"sqlite+aiosqlite:///{tmp_path}/eo.db"))

    def connecting(_dialect: object, _record: ConnectionPoolEntry, *_args: object) -> None:
        database.unavailable(DatabaseUnavailable("database main: every session ended"))

    event.listen(database.engine.sync_engine, "do_connect", connecting)
    try:
        with pytest.raises(DatabaseUnavailable):
            async with database.session() as session:
                await session.execute(text("SELECT 1"))
    finally:
        await database.close()
