"""``mdb.exactly_once.database_url``: the URL mdb connects to a database with, its
credentials included, for an engine of the application's own (docs/exactly-once.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from mdb.config.database_settings import DatabaseSettings
from mdb.exactly_once import database_url
from mdb.exactly_once.database.database import Database
from tests.harness.servers.postgresql import USER, PostgreSQL

pytestmark = pytest.mark.anyio


def test_the_url_carries_the_username_and_the_password_file(tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text("s3cret\n")
    settings = DatabaseSettings(url="postgresql+asyncpg://db:5432/orders", username="shop",
                                password_file=secret)
    url = database_url(settings)
    assert (url.username, url.password, url.host, url.database) == (
        "shop", "s3cret", "db", "orders")
    assert "s3cret" not in str(url)  # shown, it hides the password


def test_the_settings_credentials_replace_those_in_the_url() -> None:
    settings = DatabaseSettings(url="postgresql+asyncpg://old:pw@db/orders", username="shop",
                                password="new")
    url = database_url(settings)
    assert (url.username, url.password) == ("shop", "new")


@pytest.mark.postgresql
async def test_an_engine_of_ones_own_logs_in_as_mdb_does(postgres: PostgreSQL) -> None:
    # No user in the URL: without the settings' username the driver would log in as the
    # operating system's user (root here), which the server does not know.
    settings = DatabaseSettings(url=postgres.url().replace(f"{USER}@", ""), username=USER)
    engine = create_async_engine(database_url(settings))
    try:
        async with engine.connect() as connection:
            assert (await connection.execute(text("SELECT current_user"))).scalar() == USER
    finally:
        await engine.dispose()
    database = Database("main", settings)
    try:
        assert database.engine.url == database_url(settings)  # the one mdb uses
    finally:
        await database.close()
