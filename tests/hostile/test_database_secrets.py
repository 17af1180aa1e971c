"""Secrets around an exactly-once listener's database (docs/security.md, "Secrets"): a
password in the query of a database URL, as asyncpg takes it, never shown by ``mdb db
upgrade``, the startup error or the outage lines."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from sqlalchemy import text

from mdb.database_settings import DatabaseSettings
from mdb.errors import DatabaseUnavailable
from mdb.exactly_once.database import Database
from mdb.redaction import mask_secrets, redact_url
from tests.harness.postgresql import PostgreSQL
from tests.harness.process import free_port
from tests.hostile.test_inputs import mdb, one_line

QUERY_PASSWORD = "S3cr3t-in-the-query"


@pytest.mark.parametrize("query", [
    "?password={}", "?user=u&password={}", "?PASSWORD={}&ssl=require", "?sslpassword={}",
    "?passwd={}", "?x=1;pwd={}", "?access_token={}", "?client_secret={}",
])
def test_a_secret_in_a_urls_query_is_masked_whatever_its_name(query: str) -> None:
    url = "postgresql+asyncpg://u:pw@db:5432/orders" + query.format(QUERY_PASSWORD + "#;x")
    for shown in (redact_url(url), mask_secrets(f"connecting to {url} failed")):
        assert QUERY_PASSWORD not in shown and "=***" in shown and "u:***@" in shown
    assert "ssl=require" in redact_url(url) or "ssl=" not in url


def test_mdb_db_upgrade_never_shows_a_password_in_the_urls_query(tmp_path: Path) -> None:
    url = (f"postgresql+asyncpg://127.0.0.1:{free_port()}/orders"
           f"?user=u&password={QUERY_PASSWORD}")
    result = mdb("db", "upgrade", cwd=tmp_path, env={"MDB_DATABASES__MAIN__URL": url})
    assert result.returncode == 2
    assert "password=***" in one_line(result.stderr)
    assert QUERY_PASSWORD not in (result.stdout + result.stderr).decode()


@pytest.mark.postgresql
def test_mdb_db_upgrade_that_reached_the_database_never_shows_the_password_either(
        tmp_path: Path, postgres: PostgreSQL) -> None:
    # The test server trusts its clients: the password is sent, and not needed.
    url = f"{postgres.create_database('secrets')}?password={QUERY_PASSWORD}"
    result = mdb("db", "upgrade", cwd=tmp_path, env={"MDB_DATABASES__MAIN__URL": url})
    assert result.returncode == 0, result.stderr
    assert "password=***" in result.stdout.decode()
    assert QUERY_PASSWORD not in (result.stdout + result.stderr).decode()


def test_mdb_run_never_shows_a_password_in_the_urls_query(tmp_path: Path) -> None:
    (tmp_path / "secret_listeners.py").write_text(
        "from sqlalchemy.ext.asyncio import AsyncSession\n"
        "from mdb import listener\n\n"
        "@listener('queue:orders', exactly_once='main')\n"
        "async def on_order(body: bytes, session: AsyncSession) -> None:\n"
        "    pass\n")
    url = f"postgresql+asyncpg://127.0.0.1:{free_port()}/orders?password={QUERY_PASSWORD}"
    result = mdb("run", "secret_listeners", cwd=tmp_path,
                 env={"MDB_DATABASES__MAIN__URL": url})
    assert result.returncode != 0
    assert QUERY_PASSWORD not in (result.stdout + result.stderr).decode()


@pytest.mark.anyio
async def test_an_outage_never_shows_a_password_in_the_urls_query(
        caplog: pytest.LogCaptureFixture) -> None:
    url = f"postgresql+asyncpg://127.0.0.1:{free_port()}/orders?password={QUERY_PASSWORD}"
    database = Database("main", DatabaseSettings(url=url, timeout=5))
    caplog.set_level(logging.INFO)
    try:
        with pytest.raises(DatabaseUnavailable) as raised:
            async with database.session() as session:
                await session.execute(text("SELECT 1"))
        database.answered()  # the outage's end, as a session that reached it says it
    finally:
        await database.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "mdb.database"]
    assert len(lines) == 2 and all("password=***" in line for line in lines), lines
    assert QUERY_PASSWORD not in f"{raised.value} {caplog.text}"

