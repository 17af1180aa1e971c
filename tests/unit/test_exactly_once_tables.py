"""mdb's tables and the settings that bound how long their rows are kept and leased."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError
from sqlalchemy import text

from mdb.database_settings import DatabaseSettings
from mdb.errors import ConfigurationError
from mdb.exactly_once import tables
from mdb.exactly_once.database import Database

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("setting", [{"outbox_lease": 0.001}, {"inbox_retention": 60.0}])
def test_a_lease_or_a_retention_too_short_to_keep_the_promise_is_refused(
    setting: dict[str, float],
) -> None:
    # A lease shorter than a dispatch's renewal can keep up with hands rows being sent to
    # another process; a retention shorter than a broker outage runs its copies again.
    with pytest.raises(ValidationError, match=next(iter(setting))):
        DatabaseSettings(**setting)


async def test_upgrade_adds_the_columns_a_table_of_an_earlier_mdb_lacks(tmp_path: Path) -> None:
    database = Database("main", DatabaseSettings(url=f"sqlite+aiosqlite:///{tmp_path}/eo.db"))
    try:
        await tables.upgrade(database.engine)
        async with database.engine.begin() as connection:  # the inbox as an earlier mdb made it
            await connection.execute(text("DROP TABLE mdb_inbox"))
            await connection.execute(text(
                "CREATE TABLE mdb_inbox (listener VARCHAR(200), subscription VARCHAR(400), "
                "message_id VARCHAR(200), processed_at FLOAT NOT NULL, "
                "PRIMARY KEY (listener, subscription, message_id))"))
            await connection.execute(text(
                "INSERT INTO mdb_inbox VALUES ('l', 's', 'm-1', 1.0)"))
        with pytest.raises(ConfigurationError, match=r"mdb_inbox\.digest missing.*mdb db upgrade"):
            await tables.check(database.engine, "main")
        assert await tables.upgrade(database.engine) == ["mdb_inbox.digest"]
        await tables.check(database.engine, "main")
        assert await tables.upgrade(database.engine) == []
        async with database.engine.connect() as connection:  # the row written before is kept
            assert (await connection.execute(text(
                "SELECT message_id, digest FROM mdb_inbox"))).all() == [("m-1", None)]
    finally:
        await database.close()
