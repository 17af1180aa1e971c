"""A database that makes mdb wait (docs/exactly-once.md, "A bad day of the database"): a stop
ends the process whatever its statements were doing."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from tests.contract.support import unique
from tests.hostile.test_hung_handlers import MdbRun
from tests.hostile.test_inputs import mdb

# A module run by ``mdb run``: an exactly-once listener on SQLite, its messages put on the
# process's own embedded broker as it is imported.
WAITING_APP = """\
import os, threading

import anyio
from sqlalchemy.ext.asyncio import AsyncSession

from mdb import Producer, Settings, listener

QUEUE = os.environ["WAITING_QUEUE"]


@listener(QUEUE, exactly_once="main", pool=2)
async def on_order(body: str, session: AsyncSession) -> None:
    pass


async def _seed() -> None:
    async with Producer(Settings()) as producer:
        for n in range(2):
            await producer.send(QUEUE, f"o-{n}")

seeding = threading.Thread(target=anyio.run, args=(_seed,))  # not on the container's loop
seeding.start()
seeding.join()
"""


def test_a_stop_ends_the_process_while_statements_wait_for_sqlites_lock(tmp_path: Path) -> None:
    """A stop cancels the deliveries whose claims wait for the write lock another process
    holds: their connections are closed while SQLite still waits, which must not leave a task
    the event loop waits for at exit (aiosqlite's close waited for a thread that had ended)."""
    database = tmp_path / "app.db"
    env = {"MDB_DATABASES__MAIN__URL": f"sqlite+aiosqlite:///{database}",
           "MDB_DATABASES__MAIN__TIMEOUT": "10", "MDB_STATUS_INTERVAL": "0.1",
           "WAITING_QUEUE": f"queue:{unique('waiting')}"}
    assert mdb("db", "upgrade", cwd=tmp_path, env=env).returncode == 0
    holder = sqlite3.connect(database, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")  # another process's write transaction, left open
        run = MdbRun(tmp_path, env, app=WAITING_APP)
        run.wait_for("in flight 2")  # both claims wait for the lock
        assert run.stop() == 0, "".join(run.seen)
    finally:
        holder.close()
    assert "Task was destroyed" not in "".join(run.seen)
