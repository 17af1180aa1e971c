"""A database's SQLAlchemy async engine, made from its settings (``engine_for``), and the URL mdb
connects with (``database_url``, for an application's own engine on the same database): the
pool, the driver's timeouts and the session settings each dialect needs, and a clear error for
a driver that is missing or not async.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, InvalidRequestError, NoSuchModuleError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import ConnectionPoolEntry, PoolResetState

from mdb.config.database_settings import URL_EXAMPLES, DatabaseSettings
from mdb.errors import ConfigurationError
from mdb.exactly_once import sqlite
from mdb.exactly_once.database.driver_errors import first_line
from mdb.observability.redaction import redact_url

# The extra of mdb that installs a driver (pyproject.toml); SQLite's comes with mdb.
_DRIVER_EXTRAS = {"asyncpg": "mdb[postgres]", "asyncmy": "mdb[mysql]"}


def database_url(settings: DatabaseSettings) -> URL:
    """The URL mdb connects to the database of ``settings`` with: ``url`` with the
    ``username`` and the password (``password``, or the content of ``password_file``) of the
    settings in place of any the URL holds. For an engine of the application's own, on the
    same database with the same login (docs/exactly-once.md); shown with ``str()``, it hides
    the password."""
    url = make_url(settings.url)
    if settings.username is not None:
        url = url.set(username=settings.username)
    if settings.password is not None:
        url = url.set(password=settings.password.get_secret_value())
    return url


def engine_for(name: str, settings: DatabaseSettings, slots: int) -> AsyncEngine:
    """The engine of database ``name`` (its key in ``databases``), whose pool serves ``slots``
    pool slots and the outbox's upkeep."""
    url = database_url(settings)
    # A statement's parameters are a message's body and headers (a producer's) and what a
    # handler writes: SQLAlchemy puts them in the text of its errors, which reach the log,
    # spans and the error header mdb_error_message (docs/security.md, "Secrets").
    options: dict[str, Any] = {"hide_parameters": True}
    if url.get_backend_name() == "sqlite":
        # SQLite's busy handler: how long a wait for a lock lasts before mdb tries again.
        options["connect_args"] = {"timeout": sqlite.BUSY_TIMEOUT}
        options["pool_reset_on_return"] = None  # ``_reset_if_open`` instead
    else:
        # A connection for each slot and one for the outbox's upkeep: a slot that waited for
        # one, its claim's time running meanwhile, took the database for down. Last in, first
        # out: under load the same few connections are used again at once (not pinged); the
        # others wait, and are pinged when they are needed.
        options.update(pool_size=max(settings.pool_size, slots + 1),
                       pool_timeout=settings.timeout, pool_use_lifo=True)
        if url.get_driver_name() == "asyncpg":
            options["connect_args"] = {"timeout": settings.timeout,
                                       "command_timeout": settings.timeout}
        elif url.get_backend_name() in ("mysql", "mariadb"):
            # READ COMMITTED, PostgreSQL's: a locking read (the outbox sweep's) locks the rows
            # it reads, not the gaps between them where handlers insert.
            options["isolation_level"] = "READ COMMITTED"
            # A statement ends on the server a second after ``timeout``: a handler's own with
            # an error that is its failure (asyncpg's command_timeout on PostgreSQL), one mdb
            # stopped waiting for at ``timeout`` (its connection dropped: the server notices
            # only when it answers) with its locks, the inbox row's among them. A lock wait
            # on MariaDB and MySQL, any statement on MariaDB (``/*M!``: MySQL skips it).
            bound = math.ceil(settings.timeout) + 1
            options["connect_args"] = {
                "connect_timeout": settings.timeout,
                "init_command": f"SET SESSION innodb_lock_wait_timeout = {bound} "
                                f"/*M! , SESSION max_statement_time = {bound} */"}
            options["pool_reset_on_return"] = None  # ``_reset_if_open`` instead
    setting = f"setting databases.{name}.url: {redact_url(settings.url)!r}"
    try:
        engine = create_async_engine(url, **options)
    except ImportError as exc:
        driver = exc.name or url.get_driver_name()
        extra = _DRIVER_EXTRAS.get(driver)
        raise ConfigurationError(
            f"{setting} needs the driver {driver}, which is not installed: "
            f"{f'pip install {extra!r}' if extra else 'install it'}") from None
    except NoSuchModuleError:
        raise ConfigurationError(
            f"{setting}: SQLAlchemy has no driver {url.get_driver_name()!r} for "
            f"{url.get_backend_name()}; write e.g. {URL_EXAMPLES}") from None
    except InvalidRequestError:  # the asyncio extension refuses a driver that is not async
        raise ConfigurationError(
            f"{setting} names the driver {url.get_driver_name()}, which is not async: write "
            f"e.g. {URL_EXAMPLES}") from None
    except ArgumentError as exc:  # the dialect refuses the URL (its text hides the password)
        raise ConfigurationError(f"{setting}: {first_line(exc)}") from None
    if url.get_backend_name() == "sqlite":
        # aiosqlite logs each call at DEBUG with its arguments, a statement's parameters among
        # them (docs/security.md, "Secrets"); its other lines say nothing mdb does not.
        logging.getLogger("aiosqlite").setLevel(logging.INFO)
    if options.get("pool_reset_on_return", "rollback") is None:
        event.listen(engine.sync_engine, "reset", _reset_if_open)
    return engine


_IN_TRANSACTION = 1  # SERVER_STATUS_IN_TRANS, in the status of MariaDB's and MySQL's answers


def _reset_if_open(dbapi_connection: Any, _record: ConnectionPoolEntry,
                   state: PoolResetState) -> None:
    """Roll back a connection the pool takes back only if a transaction is open on it: as
    MariaDB's and MySQL's server last said, or as SQLite's connection says. The pool's own
    reset rolls back every connection whose transaction was committed before it came back: a
    round trip each on MariaDB, a trip to aiosqlite's thread on SQLite (asyncpg knows there is
    nothing to roll back), two a delivery."""
    if not state.asyncio_safe or state.transaction_was_reset:
        return
    if _open(dbapi_connection.driver_connection):
        dbapi_connection.rollback()


def _open(driver: Any) -> bool:
    """Whether a transaction is open on the driver's connection ``driver`` (when it cannot
    tell: open)."""
    if isinstance(driver, sqlite.SqliteConnection):
        try:
            return bool(driver.in_transaction)
        except ValueError:  # closed: its rollback says so, as the pool's own would
            return True
    return bool(getattr(driver, "server_status", _IN_TRANSACTION) & _IN_TRANSACTION)
