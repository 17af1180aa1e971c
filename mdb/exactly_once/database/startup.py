"""The first statements a container or ``mdb db upgrade`` makes (``at_startup``): a database
that cannot be reached or refuses mdb's login is a ``ConfigurationError`` naming the settings
to check, not an outage to wait out.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from mdb.errors import ConfigurationError, DatabaseUnavailable
from mdb.exactly_once.database.database import Database, translated
from mdb.exactly_once.database.driver_errors import first_line


@asynccontextmanager
async def at_startup(database: Database) -> AsyncIterator[None]:
    """Around the first statements a container or ``mdb db upgrade`` makes: a database that
    cannot be reached, refuses mdb's login or does not answer in ``timeout`` is a
    ``ConfigurationError`` naming the settings to check (docs/exactly-once.md: nothing runs
    until they or the server are set right)."""
    name = database.name
    embedded = make_url(database.settings.url).get_backend_name() == "sqlite"
    check = (f"may mdb create and write the file (databases.{name}.url)?" if embedded else
             f"is it running, and are databases.{name}.url, databases.{name}.username and "
             f"databases.{name}.password (or password_file) right?")
    if embedded:
        _sqlite_folder(database)
    try:
        with database.deadline():
            async with translated(database):
                yield
    except DatabaseUnavailable as exc:
        raise ConfigurationError(f"{exc}; {check}") from None
    except DBAPIError as exc:  # a refused login, a database that does not exist...
        raise ConfigurationError(
            f"database {name} ({database.shown}): {first_line(exc)}; {check}") from None


def _sqlite_folder(database: Database) -> None:
    # Said before connecting, too: aiosqlite's thread of a connection that failed may outlive
    # the event loop and print a traceback of its own as the process ends.
    path = make_url(database.settings.url).database
    if not path or path == ":memory:" or path.startswith("file:"):
        return
    folder = Path(path).absolute().parent
    if not folder.is_dir():
        why = "does not exist: create it, or correct"
    elif not os.access(folder, os.W_OK | os.X_OK):
        why = "may not be written by this process: grant it, or correct"
    else:
        return
    raise ConfigurationError(f"database {database.name} ({database.shown}): folder {folder} "
                             f"{why} databases.{database.name}.url")
