"""Exactly-once listeners on bad days, in processes: two stages (``tests.faults.exactly_once_app``)
on a private ActiveMQ broker and a database of the private PostgreSQL server, through a kill -9
of the container between the commit and the ack, a kill -9 of the broker, an immediate stop
of PostgreSQL and a network partition of the container, each mid-stream.

After each: every message's effect is in the database exactly once, every message the first
stage sent through its outbox was processed exactly once by the second, and nothing is left in
the outbox, in the queues or in an error or dead-letter queue (docs/exactly-once.md).
"""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack

import anyio
import pytest
from sqlalchemy import select

from mdb.database_settings import DatabaseSettings
from mdb.exactly_once import tables
from mdb.exactly_once.database import Database
from tests.conftest import missing, private_brokers
from tests.contract.support import unique
from tests.contract.test_crash import ContainerProcess
from tests.contract.test_delivery import send_all
from tests.faults.exactly_once_app import effects, ledger_tables
from tests.faults.ledger import WAIT, browse
from tests.harness.activemq import ActiveMQ
from tests.harness.netns import Network
from tests.harness.postgresql import PostgreSQL, postgresql_available
from tests.harness.process import BrokerProcess, started_together

pytestmark = [pytest.mark.activemq, pytest.mark.postgresql]

HALF = 15  # messages sent before the fault, and again after it
SLOW = "0.1"  # seconds each run of the first stage takes: work is in flight at the fault
# Seconds a container's link stays cut: longer than the broker tolerates silence (2 to 3 of the
# container's 1 s heart-beat intervals, docs/failover.md) and than the database timeout (3 s).
CUT = 4.0


@pytest.fixture(scope="module")
def broker() -> Iterator[BrokerProcess]:
    """This module's own broker: a test kills it."""
    with private_brokers("activemq") as [started]:
        yield started


@pytest.fixture
def postgres_up(postgres: PostgreSQL) -> Iterator[PostgreSQL]:
    """The session's server, running again after the test whatever it did."""
    yield postgres
    if not postgres.running:
        postgres.start()


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
                    "url": self.url, "timeout": 3, "outbox_lease": 1.5}}),
                "MDB_BROKERS__DEFAULT__HEARTBEAT_MS": "1000",
                "MDB_BROKERS__DEFAULT__RECONNECT_DELAY": "0.2",
                "MDB_BROKERS__DEFAULT__RECONNECT_MAX_DELAY": "1.0",
                **env}))
        process.take(1, "ready")
        return process

    def send(self, first: int) -> list[str]:
        """``HALF`` messages to the first stage; their ids."""
        return anyio.run(send_all, str(self.broker.url), f"queue:{self.queue}",
                         [f"m{n}" for n in range(first, first + HALF)])

    def ledger(self) -> tuple[Counter[tuple[str, str]], list[str]]:
        """The effect ledger's rows, counted per (stage, key), and the bodies (ids of the
        first stage's messages) waiting in the outbox."""
        async def read() -> tuple[Counter[tuple[str, str]], list[str]]:
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

    def wait(self, condition: Callable[[Counter[tuple[str, str]], list[str]], bool],
             what: str) -> None:
        """Poll the ledger until ``condition(rows, outbox)`` holds: the database tells only
        when asked."""
        deadline = time.monotonic() + WAIT
        while not condition(*self.ledger()):
            assert time.monotonic() < deadline, f"waited {WAIT} s for {what}"
            time.sleep(0.2)

    def settle(self, sent: list[str], *processes: ContainerProcess) -> None:
        """Wait until both stages recorded every message and the outbox is empty, stop the
        processes, and check the ledger, the outbox and the queues."""
        expected = Counter([*(("first", i) for i in sent), *(("second", i) for i in sent)])
        self.wait(lambda rows, outbox: set(rows) >= set(expected) and not outbox,
                  "both stages' effects")
        for process in processes:
            process.process.send_signal(signal.SIGTERM)
            assert process.process.wait(timeout=WAIT) == 0
        rows, outbox = self.ledger()
        assert rows == expected, {k: n for k, n in rows.items() if n != 1 or k not in expected}
        assert outbox == []
        names = [self.queue, f"{self.queue}.second", f"{self.queue}.DLQ",
                 f"{self.queue}.second.DLQ", "ActiveMQ.DLQ"]
        assert {name: browse(self.broker, name) for name in names} == {n: [] for n in names}

    def midway(self) -> None:
        """Wait until the first stage committed some of the first ``HALF`` messages, not all:
        the fault comes mid-stream."""
        self.wait(lambda rows, _: sum(k[0] == "first" for k in rows) >= 3,
                  "3 runs of the first stage")
        rows, _ = self.ledger()
        assert sum(k[0] == "first" for k in rows) < HALF, "the stream ended before the fault"


@pytest.mark.parametrize("before", ["dispatch", "ack"])
def test_a_container_killed_between_the_commit_and_the_ack(
    broker: BrokerProcess, postgres_up: PostgreSQL, before: str,
) -> None:
    with ExitStack() as stack:
        stages = Stages(broker, postgres_up, stack)
        # Frozen once its fifth run committed: before its sends and its ack, or before its ack.
        frozen = stages.start("s1", EO_FREEZE="5", EO_FREEZE_BEFORE=before)
        sent = stages.send(0)
        [line] = frozen.take(1, "frozen")
        frozen.process.send_signal(signal.SIGKILL)
        frozen.process.wait(timeout=WAIT)
        rows, outbox = stages.ledger()
        # The killed run committed; its send waits in the outbox, or was sent and forgotten.
        assert rows[("first", line["id"])] == 1
        assert (line["id"] in outbox) == (before == "dispatch")
        sent += stages.send(HALF)
        stages.settle(sent, stages.start("s2"))


def test_a_broker_killed_mid_stream(broker: BrokerProcess, postgres_up: PostgreSQL) -> None:
    def kill_broker(stages: Stages) -> list[str]:
        broker.kill()
        broker.start()  # same port and data: what it stored comes back
        return stages.send(HALF)

    mid_stream(broker, postgres_up, kill_broker)


def test_postgresql_stopped_mid_stream(broker: BrokerProcess, postgres_up: PostgreSQL) -> None:
    def stop_postgresql(stages: Stages) -> list[str]:
        postgres_up.stop_immediately()
        sent = stages.send(HALF)  # arriving while it is down
        postgres_up.start()
        return sent

    mid_stream(broker, postgres_up, stop_postgresql)


@pytest.fixture(scope="module")
def bridged(network: Network) -> Iterator[tuple[BrokerProcess, PostgreSQL]]:
    """A broker and a PostgreSQL server of this module's own, on the network's bridge."""
    if not postgresql_available():
        missing("PostgreSQL")
    with started_together(lambda: ActiveMQ(host=network.address), 1) as [broker], \
            PostgreSQL(host=network.address) as postgres:
        yield broker, postgres


def test_a_container_cut_off_mid_stream(
    network: Network, bridged: tuple[BrokerProcess, PostgreSQL],
) -> None:
    """The container in a network namespace whose link is cut (every packet dropped, nothing
    reset: the broker and the database both unreachable) for longer than the broker tolerates
    its silence, then healed: TCP retransmits what each side wrote meanwhile."""
    broker, postgres = bridged
    room = network.namespace()

    def cut_off(stages: Stages) -> list[str]:
        room.cut()
        try:
            sent = stages.send(HALF)  # arriving while it is cut off
            time.sleep(CUT)  # the fault's duration
        finally:
            room.heal()
        return sent

    process = mid_stream(broker, postgres, cut_off, prefix=room.prefix)
    logged = []
    while not process.lines.empty():
        logged.append(process.lines.get_nowait()["event"])
    assert "connection-lost" in logged  # the container noticed the cut


def mid_stream(broker: BrokerProcess, postgres: PostgreSQL,
               fault: Callable[[Stages], list[str]],
               prefix: Sequence[str] = ()) -> ContainerProcess:
    """Both stages in one process (``prefix`` before its command), ``fault`` once the first
    stage is midway through the first ``HALF`` (it sends the second half, returning their
    ids), then the checks of ``settle``; the process, ended."""
    with ExitStack() as stack:
        stages = Stages(broker, postgres, stack)
        process = stages.start("s1", prefix, EO_DELAY=SLOW)
        sent = stages.send(0)
        stages.midway()
        sent += fault(stages)
        stages.settle(sent, process)
    return process
