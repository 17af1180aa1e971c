"""Two exactly-once stages (``tests.faults.exactly_once_app``) as container processes on an
ActiveMQ broker and a new database of a private PostgreSQL server, and the checks of their
effect ledger: what the exactly-once fault tests and the random fault run's
``--exactly-once`` mode share (docs/exactly-once.md, "Testing").

The contract after any fault: every message whose send returned has one row of each stage
in the ledger, a message whose send raised has none or one of each, the second stage has a
row for each the first ran, nothing is left in the outbox, and nothing in the queues, their
error queues or ``ActiveMQ.DLQ``.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field

import anyio
from sqlalchemy import func, select

from mdb.database_settings import DatabaseSettings
from mdb.errors import DatabaseUnavailable
from mdb.exactly_once import tables
from mdb.exactly_once.database import Database
from tests.contract.support import unique
from tests.contract.test_crash import ContainerProcess
from tests.contract.test_delivery import send_all
from tests.faults.exactly_once_app import effects, ledger_tables
from tests.faults.ledger import WAIT, browse
from tests.harness.postgresql import PostgreSQL
from tests.harness.process import BrokerProcess

STAGES = ("first", "second")
TIMEOUT = 3.0  # the database's ``timeout`` in the containers' settings

Rows = Counter[tuple[str, str]]  # rows of the effect ledger per (stage, key)


class Stages:
    """The two stages' container processes on ``broker`` and a new database of ``postgres``."""

    def __init__(self, broker: BrokerProcess, postgres: PostgreSQL, stack: ExitStack) -> None:
        self.broker, self.stack = broker, stack
        self.queue = unique("eo")
        self.url = postgres.create_database(self.queue)
        anyio.run(self._prepare)

    async def _prepare(self) -> None:
        database = self.database()
        try:
            await tables.upgrade(database.engine)
            async with database.engine.begin() as connection:
                await connection.run_sync(ledger_tables.create_all)
        finally:
            await database.close()

    def database(self) -> Database:
        return Database("main", DatabaseSettings(url=self.url))

    def start(self, server: str, prefix: Sequence[str] = (), **env: str) -> ContainerProcess:
        """A container process of both stages, once it said it is ready; ``prefix`` goes
        before its command (``Namespace.prefix`` runs it in a network namespace)."""
        process = self.stack.enter_context(ContainerProcess(
            str(self.broker.url), "unused", "eo", server, hang=False, prefix=prefix,
            module="tests.faults.exactly_once_app", env={
                "EO_QUEUE": self.queue,
                # Short timeouts, lease and reconnect delays: a fault is noticed and over soon.
                "MDB_DATABASES": json.dumps({"main": {
                    "url": self.url, "timeout": TIMEOUT, "outbox_lease": 1.5}}),
                "MDB_BROKERS__DEFAULT__HEARTBEAT_MS": "1000",
                "MDB_BROKERS__DEFAULT__RECONNECT_DELAY": "0.2",
                "MDB_BROKERS__DEFAULT__RECONNECT_MAX_DELAY": "1.0",
                **env}))
        process.take(1, "ready")
        return process

    def send(self, first: int, count: int) -> list[str]:
        """``count`` messages to the first stage; their ids."""
        return anyio.run(send_all, str(self.broker.url), f"queue:{self.queue}",
                         [f"m{n}" for n in range(first, first + count)])

    def ledger(self) -> tuple[Rows, list[str]]:
        """The effect ledger's rows, counted per (stage, key), and the bodies (ids of the
        first stage's messages) waiting in the outbox."""
        async def read() -> tuple[Rows, list[str]]:
            database = self.database()
            try:
                async with database.session() as session:
                    rows = (await session.execute(select(effects.c.stage, effects.c.key))).all()
                    waiting = (await session.execute(select(tables.outbox.c.body))).scalars()
                    bodies = [body.decode() for body in waiting]
            finally:
                await database.close()
            return Counter((stage, key) for stage, key in rows), bodies
        return anyio.run(read)

    def since(self, seq: int) -> tuple[int, list[tuple[str, str, str | None]]]:
        """The ledger's rows numbered after ``seq`` as (stage, key, server), and the highest
        number: what the stages did lately, without reading the whole ledger."""
        async def read() -> tuple[int, list[tuple[str, str, str | None]]]:
            database = self.database()
            try:
                async with database.session() as session:
                    rows = (await session.execute(
                        select(effects.c.stage, effects.c.key, effects.c.server)
                        .where(effects.c.seq > seq))).all()
                    top = (await session.execute(select(func.max(effects.c.seq)))).scalar()
            finally:
                await database.close()
            return top or seq, [(stage, key, server) for stage, key, server in rows]
        return anyio.run(read)

    def wait(self, condition: Callable[[Rows, list[str]], bool], what: str,
             timeout: float = WAIT) -> None:
        """Poll the ledger until ``condition(rows, outbox)`` holds: the database tells only
        when asked."""
        deadline = time.monotonic() + timeout
        while not condition(*self.ledger()):
            assert time.monotonic() < deadline, f"waited {timeout} s for {what}"
            time.sleep(0.2)

    def poll(self, condition: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
        """Ask ``condition`` until it holds, taking a database not answering yet (just
        started, resumed) as a no; fail after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if condition():
                    return
            except DatabaseUnavailable:
                pass
            assert time.monotonic() < deadline, f"waited {timeout} s for {what}"
            time.sleep(0.3)

    def left(self) -> dict[str, list[str]]:
        """The ``mdb_id`` of each message still in a queue of the stages, their error queues
        or ``ActiveMQ.DLQ``, per queue that holds any."""
        names = [self.queue, f"{self.queue}.second", f"{self.queue}.DLQ",
                 f"{self.queue}.second.DLQ", "ActiveMQ.DLQ"]
        return {name: ids for name in names if (ids := browse(self.broker, name))}


@dataclass
class Once:
    """One stage's account against what it owes: ``owed`` keys must have one row each."""

    owed: int
    once: int  # owed keys with exactly one row
    missing: list[str] = field(default_factory=list)  # owed keys without a row
    repeated: list[str] = field(default_factory=list)  # keys with more than one row
    #: Keys with a row not owed: for the first stage, a send that raised yet was stored (one
    #: row is fine); for the second stage, never.
    extra: list[str] = field(default_factory=list)

    def ok(self, extra_allowed: Collection[str] = ()) -> bool:
        return (not self.missing and not self.repeated
                and set(self.extra) <= set(extra_allowed))


def check_once(rows: Rows, told: Collection[str],
               raised: Collection[str]) -> tuple[dict[str, Once], list[str]]:
    """Each stage's account: the first owes each ``told`` id one row, and may have one of an
    id whose send ``raised``; the second owes one row per key of the first. Also the keys
    that break the contract (repeated, missing, extra not allowed), sorted."""
    keys = {stage: Counter({k: n for (s, k), n in rows.items() if s == stage})
            for stage in STAGES}
    owed = {"first": set(told), "second": set(keys["first"])}
    found: dict[str, Once] = {}
    bad: set[str] = set()
    for stage in STAGES:
        have = keys[stage]
        once = Once(owed=len(owed[stage]), once=sum(have[k] == 1 for k in owed[stage]),
                    missing=sorted(owed[stage] - have.keys()),
                    repeated=sorted(k for k, n in have.items() if n > 1),
                    extra=sorted(have.keys() - owed[stage]))
        allowed = set(raised) if stage == "first" else set()
        bad |= {*once.missing, *once.repeated, *(set(once.extra) - allowed)}
        found[stage] = once
    return found, sorted(bad)
