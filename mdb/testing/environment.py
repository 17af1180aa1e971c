"""What a test of the kit runs on: its broker (``broker_url``: ``MDB_TEST_BROKER_URL``, else a
memory broker of its own) and mdb's tables in its databases (``made_tables``).
"""

from __future__ import annotations

import os
import uuid

from mdb.config.settings import Settings
from mdb.exactly_once import tables
from mdb.exactly_once.database.database import Database, translated

BROKER_URL_VARIABLE = "MDB_TEST_BROKER_URL"
"""When set, the broker URL the kit's tests run on (e.g. ``stomp+activemq://user:pw@host:61613``)
instead of a fresh memory broker per test."""


def broker_url() -> str:
    """``MDB_TEST_BROKER_URL`` when set, else a new memory broker of its own."""
    return os.environ.get(BROKER_URL_VARIABLE) or f"memory://test-{uuid.uuid4().hex[:10]}"


async def made_tables(settings: Settings) -> None:
    """mdb's tables in each database of ``settings``, made as ``mdb db upgrade`` makes them
    (only in tests: a container never makes them)."""
    for name, database_settings in settings.databases.items():
        database = Database(name, database_settings)
        try:
            async with translated(database):
                await tables.upgrade(database.engine)
        finally:
            await database.close()
