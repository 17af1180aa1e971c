"""The pytest plugin of ``mdb.testing`` (entry point ``pytest11``: ``pip install 'mdb[testing]'``).

Fixtures: ``mdb_broker_url`` (``MDB_TEST_BROKER_URL``, else a fresh memory broker; override it
in a conftest to choose per test) and ``mdb_runner`` (a ``SyncRunner`` on it, closed after the
test).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from mdb.testing.environment import broker_url
from mdb.testing.sync import SyncRunner


@pytest.fixture
def mdb_broker_url() -> str:
    """The broker a test's ``mdb_runner`` uses."""
    return broker_url()


@pytest.fixture
def mdb_runner(mdb_broker_url: str) -> Iterator[SyncRunner]:
    """Runs the application's listeners in the test: ``async with mdb_runner.run(...)`` or
    ``mdb_runner.start(...)`` (see ``mdb.testing``)."""
    runner = SyncRunner(mdb_broker_url)
    try:
        yield runner
    finally:
        runner.close()
