"""mdb's tables and the settings that bound how long their rows are kept and leased."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError
from sqlalchemy import text
from sqlalchemy.dialects import mysql
from sqlalchemy.schema import CreateTable

from mdb.config.database_settings import DatabaseSettings
from mdb.errors import ConfigurationError
from mdb.exactly_once import tables
from mdb.exactly_once.database.database import Database

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


def test_on_mariadb_the_inbox_key_fits_innodb_and_compares_byte_for_byte() -> None:
    # InnoDB bounds a key at 3072 bytes; VARCHAR in utf8mb4 counts 4 a character, and its
    # usual collations take 'M-1', 'm-1' and 'm-1 ' for one message id.
    dialect = mysql.dialect()
    ddl = str(CreateTable(tables.inbox).compile(dialect=dialect))
    assert "listener VARBINARY(800) NOT NULL" in ddl
    assert "processed_at DOUBLE NOT NULL" in ddl  # FLOAT is single precision: minutes off
    assert "ENGINE=InnoDB" in ddl
    key = re.findall(r"(?:listener|subscription|message_id) VARBINARY\((\d+)\)", ddl)
    assert len(key) == 3 and sum(map(int, key)) <= 3072
    assert "source VARBINARY(3072)" in str(CreateTable(tables.outbox).compile(dialect=dialect))


def test_on_mariadb_a_key_longer_than_its_column_is_refused_not_truncated() -> None:
    dialect = mysql.dialect()
    bind = tables.inbox.c.message_id.type.dialect_impl(dialect).bind_processor(dialect)
    assert bind is not None
    assert bind("\N{GRINNING FACE}" * 200) == ("\N{GRINNING FACE}" * 200).encode()
    with pytest.raises(ValueError, match="201 characters, 201 bytes in UTF-8"):
        bind("m" * 201)  # as PostgreSQL refuses it
    bind = tables.inbox.c.subscription.type.dialect_impl(dialect).bind_processor(dialect)
    assert bind is not None
    with pytest.raises(ValueError, match="368 characters, 1472 bytes in UTF-8"):
        bind("\N{GRINNING FACE}" * 368)  # InnoDB's key would not hold it
