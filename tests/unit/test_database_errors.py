"""Driver errors at the edge of ``mdb.exactly_once.database``: what says the database is out of
reach becomes ``DatabaseUnavailable`` (the delivery stays unsettled, never a strike against the
message); what says the statement is wrong stays the handler's failure."""

from __future__ import annotations

import re
import sys

import pytest
from pydantic import ValidationError
from sqlalchemy.exc import DBAPIError, OperationalError

from mdb.config.database_settings import DatabaseSettings
from mdb.errors import ConfigurationError, DatabaseUnavailable
from mdb.exactly_once.database.database import Database, translated

pytestmark = pytest.mark.anyio


class DriverError(Exception):
    """A driver's error carrying a SQLSTATE, as SQLAlchemy's asyncpg and psycopg adapters
    give it."""

    def __init__(self, message: str, sqlstate: str) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


def failure(sqlstate: str, message: str) -> DBAPIError:
    return DBAPIError("INSERT INTO mdb_inbox ...", None, DriverError(message, sqlstate))


@pytest.mark.parametrize(("sqlstate", "message"), [
    ("57P03", "the database system is starting up"),
    ("57P01", "terminating connection due to administrator command"),
    ("08006", "connection failure"),
    ("53300", "sorry, too many clients already"),
])
async def test_a_server_that_cannot_take_statements_now_is_unavailable(
    sqlstate: str, message: str,
) -> None:
    database = Database("main", DatabaseSettings(url="sqlite+aiosqlite:///unused.db"))
    with pytest.raises(DatabaseUnavailable, match=message):
        async with translated(database):
            raise failure(sqlstate, message)


async def test_a_statement_the_database_refuses_stays_the_handlers_failure() -> None:
    database = Database("main", DatabaseSettings(url="sqlite+aiosqlite:///unused.db"))
    with pytest.raises(DBAPIError):
        async with translated(database):
            raise failure("23505", "duplicate key value violates unique constraint")


async def test_the_drivers_own_timeout_says_what_happened() -> None:
    database = Database("main", DatabaseSettings(url="sqlite+aiosqlite:///unused.db", timeout=4))
    with pytest.raises(DatabaseUnavailable, match="no answer in 4 s"):
        async with translated(database):
            raise TimeoutError  # asyncpg's command_timeout, which has no message


def test_a_missing_driver_names_the_extra_that_brings_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "asyncpg", None)  # as if `mdb[postgres]` was not installed
    with pytest.raises(ConfigurationError) as raised:
        Database("main", DatabaseSettings(url="postgresql+asyncpg://db:5432/orders"))
    assert str(raised.value) == (
        "setting databases.main.url: 'postgresql+asyncpg://db:5432/orders' needs the driver "
        "asyncpg, which is not installed: pip install 'mdb[postgres]'")


class MySQLError(Exception):
    """asyncmy's error: its arguments are the error's number and its text."""


def mysql_failure(code: int, message: str) -> OperationalError:
    # asyncmy raises OperationalError for every server error number it has no class for.
    return OperationalError("INSERT INTO mdb_inbox ...", None, MySQLError(code, message))


@pytest.mark.parametrize(("code", "message"), [
    (2013, "Lost connection to server during query"),
    (2003, "Can't connect to MySQL server on '127.0.0.1'"),
    (1053, "Server shutdown in progress"),
    (1040, "Too many connections"),
])
async def test_a_mariadb_that_cannot_take_statements_now_is_unavailable(
        code: int, message: str) -> None:
    database = Database("main", DatabaseSettings(url="sqlite+aiosqlite:///unused.db"))
    with pytest.raises(DatabaseUnavailable, match=message):
        async with translated(database):
            raise mysql_failure(code, message)


@pytest.mark.parametrize(("code", "message"), [
    (1213, "Deadlock found when trying to get lock; try restarting transaction"),
    # a handler's own statement past ``timeout`` (mdb's are cancelled before the server's
    # bound): its failure, as asyncpg's TimeoutError is on PostgreSQL
    (1205, "Lock wait timeout exceeded; try restarting transaction"),
    (1969, "Query execution was interrupted (max_statement_time exceeded)"),
    (1644, "a handler's own SIGNAL"),
])
async def test_a_statement_mariadb_refuses_stays_the_handlers_failure(
        code: int, message: str) -> None:
    database = Database("main", DatabaseSettings(url="sqlite+aiosqlite:///unused.db"))
    with pytest.raises(OperationalError, match=re.escape(message)):
        async with translated(database):
            raise mysql_failure(code, message)


def test_a_missing_mysql_driver_names_the_extra_that_brings_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "asyncmy", None)  # as if `mdb[mysql]` was not installed
    with pytest.raises(ConfigurationError, match=r"needs the driver asyncmy, which is not "
                                                 r"installed: pip install 'mdb\[mysql\]'$"):
        Database("main", DatabaseSettings(url="mysql+asyncmy://db:3306/orders"))


def test_a_driver_mdb_has_no_extra_for_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "aiomysql", None)
    with pytest.raises(ConfigurationError, match=r"needs the driver aiomysql, which is not "
                                                 r"installed: install it$"):
        Database("main", DatabaseSettings(url="mysql+aiomysql://db:3306/orders"))


def test_a_driver_sqlalchemy_does_not_know_is_named() -> None:
    with pytest.raises(ConfigurationError, match=r"setting databases.main.url: "
                       r"'postgresql\+nosuch://db:5432/orders': SQLAlchemy has no driver "
                       r"'nosuch' for postgresql"):
        Database("main", DatabaseSettings(url="postgresql+nosuch://db:5432/orders"))


def test_a_driver_that_is_not_async_is_refused_naming_those_that_are() -> None:
    with pytest.raises(ConfigurationError, match=r"setting databases.main.url: "
                       r"'sqlite:///orders.db' names the driver pysqlite, which is not async: "
                       r"write e.g. 'sqlite\+aiosqlite:///"):
        Database("main", DatabaseSettings(url="sqlite:///orders.db"))


def test_a_url_sqlalchemy_refuses_is_named() -> None:
    with pytest.raises(ConfigurationError, match=r"setting databases.main.url: "
                       r"'sqlite\+aiosqlite://host/orders.db': Invalid SQLite URL"):
        Database("main", DatabaseSettings(url="sqlite+aiosqlite://host/orders.db"))


@pytest.mark.parametrize("login", [{"username": "shop"}, {"password": "s3cret"}])
def test_sqlite_takes_no_login(login: dict[str, str]) -> None:
    with pytest.raises(ValidationError, match="SQLite takes no username or password"):
        DatabaseSettings(url="sqlite+aiosqlite:///orders.db", **login)
