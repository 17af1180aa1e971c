"""Exactly-once listeners on bad days, in processes: two stages (``tests.faults.exactly_once_app``)
on a private ActiveMQ broker and a database of the private PostgreSQL server, through a kill -9
of the container between the commit and the ack, a kill -9 of the broker, an immediate stop
of PostgreSQL and a network partition of the container, each mid-stream.

After each: every message's effect is in the database exactly once, every message the first
stage sent through its outbox was processed exactly once by the second, and nothing is left in
the outbox, in the queues or in an error or dead-letter queue (docs/exactly-once.md).
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack

import pytest

from tests.conftest import missing, private_brokers
from tests.contract.test_crash import ContainerProcess
from tests.faults.exactly_once_stages import Stages
from tests.faults.ledger import WAIT
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


def settle(stages: Stages, sent: list[str], *processes: ContainerProcess) -> None:
    """Wait until both stages recorded every message and the outbox is empty, stop the
    processes, and check the ledger, the outbox and the queues."""
    expected = Counter([*(("first", i) for i in sent), *(("second", i) for i in sent)])
    stages.wait(lambda rows, outbox: set(rows) >= set(expected) and not outbox,
                "both stages' effects")
    for process in processes:
        process.process.send_signal(signal.SIGTERM)
        assert process.process.wait(timeout=WAIT) == 0
    rows, outbox = stages.ledger()
    assert rows == expected, {k: n for k, n in rows.items() if n != 1 or k not in expected}
    assert outbox == []
    assert stages.left() == {}


def midway(stages: Stages) -> None:
    """Wait until the first stage committed some of the first ``HALF`` messages, not all:
    the fault comes mid-stream."""
    stages.wait(lambda rows, _: sum(k[0] == "first" for k in rows) >= 3,
                "3 runs of the first stage")
    rows, _ = stages.ledger()
    assert sum(k[0] == "first" for k in rows) < HALF, "the stream ended before the fault"


@pytest.mark.parametrize("before", ["dispatch", "ack"])
def test_a_container_killed_between_the_commit_and_the_ack(
    broker: BrokerProcess, postgres_up: PostgreSQL, before: str,
) -> None:
    with ExitStack() as stack:
        stages = Stages(broker, postgres_up, stack)
        # Frozen once its fifth run committed: before its sends and its ack, or before its ack.
        frozen = stages.start("s1", EO_FREEZE="5", EO_FREEZE_BEFORE=before)
        sent = stages.send(0, HALF)
        [line] = frozen.take(1, "frozen")
        frozen.process.send_signal(signal.SIGKILL)
        frozen.process.wait(timeout=WAIT)
        rows, outbox = stages.ledger()
        # The killed run committed; its send waits in the outbox, or was sent and forgotten.
        assert rows[("first", line["id"])] == 1
        assert (line["id"] in outbox) == (before == "dispatch")
        sent += stages.send(HALF, HALF)
        settle(stages, sent, stages.start("s2"))


def test_a_broker_killed_mid_stream(broker: BrokerProcess, postgres_up: PostgreSQL) -> None:
    def kill_broker(stages: Stages) -> list[str]:
        broker.kill()
        broker.start()  # same port and data: what it stored comes back
        return stages.send(HALF, HALF)

    mid_stream(broker, postgres_up, kill_broker)


def test_postgresql_stopped_mid_stream(broker: BrokerProcess, postgres_up: PostgreSQL) -> None:
    def stop_postgresql(stages: Stages) -> list[str]:
        postgres_up.stop_immediately()
        sent = stages.send(HALF, HALF)  # arriving while it is down
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
            sent = stages.send(HALF, HALF)  # arriving while it is cut off
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
        sent = stages.send(0, HALF)
        midway(stages)
        sent += fault(stages)
        settle(stages, sent, process)
    return process
