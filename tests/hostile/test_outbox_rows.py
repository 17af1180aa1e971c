"""Large rows in the outbox (docs/exactly-once.md, "The outbox and large messages"): a sweep
holds one message's body at a time, however many and however large the rows waiting."""

from __future__ import annotations

import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from mdb.destinations import Destination
from mdb.exactly_once.database import Database
from mdb.exactly_once.outbox import Dispatcher, Writer
from mdb.message import ID, OutgoingMessage
from mdb.producer import Producer
from tests.contract.support import settings_for, unique
from tests.contract.test_exactly_once import database_url, prepared

pytestmark = pytest.mark.anyio

MiB = 1 << 20


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgresql)])
async def database(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Database]:
    """A database of the test's own, SQLite or PostgreSQL, with mdb's tables."""
    made = await prepared(await database_url(request, tmp_path))
    yield made
    await made.close()


async def left_by_a_dead_process(database: Database, destination: str, count: int,
                                 size: int) -> list[str]:
    """``count`` rows of ``size`` bytes each, their lease run out (their process died); their
    ids."""
    async with database.session() as session:
        writer = Writer(session, "dead-process", lease=0.0, error_destination=None)
        for n in range(count):
            await writer.send(Destination.parse(destination), OutgoingMessage(
                bytes([n]) * size, {ID: f"id-{n}"}), None)
    return [f"id-{n}" for n in range(count)]


async def test_a_sweep_holds_one_body_at_a_time(database: Database) -> None:
    """40 rows of 1 MiB: a sweep used to read all of them (up to 100) in one statement, whose
    memory grew with the rows (1 GB of them took 705 MB) and which, past the database's
    ``timeout``, never ended in time: the rows were never sent."""
    # A topic nobody subscribes to: the broker keeps nothing of what it is sent, so what the
    # sweep holds is all that is measured.
    ids = await left_by_a_dead_process(database, "topic:nobody", 40, MiB)
    async with Producer(settings_for(f"memory://{unique('m')}")) as producer:
        dispatcher = Dispatcher(database, producer, "live-process")
        tracemalloc.start()
        try:
            sent = await dispatcher.sweep()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert sent == len(ids)
    assert peak < 8 * MiB, f"{peak / MiB:.1f} MiB held by a sweep of 40 rows of 1 MiB"
