"""Exactly-once listeners on bad days, in processes: two stages
(``tests.harness.apps.exactly_once_app``) in two container processes of one app, both stages
partitioned over three private ActiveMQ brokers, a database of the private PostgreSQL server, and a
foreign producer (plain stomp.py: no ``mdb_id``) spreading business ids over the first stage's
members (``tests.harness.processes.exactly_once_stages``).

The faults, each mid-stream: a kill -9 of the container after a run's commit, before its
dispatch or its ack; a kill -9 of the broker the run's delivery came from at the same point,
the broker started again on its data (the message comes back flagged redelivered, perhaps to
the other process) and the container resumed; an immediate stop of PostgreSQL; the
container's network cut off. On a private MariaDB server instead (its own tests): a kill -9
of mariadbd, and mariadbd hung with SIGSTOP past the database's ``timeout``. After each:
every business id's effect is in the database exactly once in both stages, nothing is left
in the outbox, in the queues or in an error or dead-letter queue (docs/exactly-once.md,
"What happens to a message").

Two foreign messages with the same body are two messages: both run. And a listener broken on
purpose (its effect written outside mdb's transaction) is seen to run twice by the same
checks, under the broker's kill: a green run means something.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass

import pytest

from tests.harness.processes.container_process import ContainerProcess
from tests.harness.processes.exactly_once_stages import TIMEOUT, Once, Rows, Stages, check_once
from tests.harness.processes.fleet import WAIT
from tests.harness.servers.activemq import ActiveMQ
from tests.harness.servers.brokers import missing
from tests.harness.servers.mariadb import MariaDB
from tests.harness.servers.netns import Network
from tests.harness.servers.postgresql import PostgreSQL, postgresql_available
from tests.harness.servers.process import BrokerProcess, started_together
from tests.harness.traffic.foreign import ForeignProducer

pytestmark = pytest.mark.activemq

HALF = 30  # messages sent before the fault, and again after it
FREEZE = "3"  # the run of the first stage after whose commit a process stops (of ~HALF/2)
# Seconds each run of the first stage takes: work is in flight at the fault, and HALF takes
# the 12 pool slots of the first stage (2 processes, 3 members, pool 2) 3 s.
SLOW = "1.0"
# Seconds a container's link stays cut: longer than the broker tolerates silence (2 to 3 of the
# container's 1 s heart-beat intervals, docs/failover.md) and than the database timeout (3 s).
CUT = 4.0
HUNG = TIMEOUT + 1.0  # seconds a database server stays hung: its statements time out


@pytest.fixture
def postgres_up(postgres: PostgreSQL) -> Iterator[PostgreSQL]:
    """The session's server, running again after the test whatever it did."""
    yield postgres
    if not postgres.running:
        postgres.start()


@pytest.fixture
def stages(trio: list[BrokerProcess], postgres_up: PostgreSQL) -> Iterator[Stages]:
    """The two stages on the module's brokers and the session's PostgreSQL; the processes a
    test started are killed when it ends."""
    with ExitStack() as stack:
        yield Stages(trio, postgres_up, stack)


@dataclass
class Ending:
    """What the stages left once nothing was under way and their processes stopped."""

    accounts: dict[str, Once]  # each stage's (``check_once``)
    bad: list[str]  # business ids breaking the contract
    rows: Rows
    outbox: list[str]
    left: dict[str, list[str]]
    inbox: Counter[tuple[str, str, str]]  # rows per (listener, subscription, kind of key)

    def __str__(self) -> str:
        repeated = {f"{stage} {key}": n for (stage, key), n in sorted(self.rows.items())
                    if n > 1}
        return (f"{self.accounts}; rows of business ids run more than once: {repeated}; left "
                f"in the outbox: {self.outbox}, in the queues: {self.left}; inbox rows per "
                f"(listener, subscription, key): {dict(self.inbox)}")


def ended(stages: Stages, sent: Sequence[str], *processes: ContainerProcess) -> Ending:
    """Wait until nothing is under way (every message run by both stages, the outbox and
    the queues empty), stop the processes (each must exit 0), and read what they left."""
    stages.drain(sent)
    for process in processes:
        process.process.send_signal(signal.SIGTERM)
    assert [p.process.wait(timeout=WAIT) for p in processes] == [0] * len(processes)
    rows, outbox = stages.ledger()
    accounts, bad = check_once(rows, sent, ())
    return Ending(accounts, bad, rows, outbox, stages.left(), stages.inbox())


def settle(stages: Stages, sent: Sequence[str], *processes: ContainerProcess) -> None:
    """``ended``, and each business id has one row of each stage, nothing is left."""
    end = ended(stages, sent, *processes)
    assert (end.bad, end.outbox, end.left) == ([], [], {}), str(end)


def both(stages: Stages, **env: str) -> tuple[ContainerProcess, ContainerProcess]:
    """Two processes of the stages: ``s1`` stops itself after the commit of its ``FREEZE``-th
    run of the first stage (before the step ``env`` names, ``EO_FREEZE_BEFORE``); ``s2``
    goes on."""
    return stages.start("s1", EO_FREEZE=FREEZE, **env), stages.start("s2")


@pytest.mark.postgresql
@pytest.mark.parametrize("before", ["dispatch", "ack"])
def test_a_container_killed_between_the_commit_and_the_ack(
    stages: Stages, before: str,
) -> None:
    frozen, other = both(stages, EO_FREEZE_BEFORE=before)
    sent = stages.send(0, HALF)
    [line] = frozen.take(1, "frozen")
    rows, outbox = stages.ledger()
    # The frozen run committed (a second row is judged at the end); its send waits in the
    # outbox, or was sent and waits there for the next run's transaction to delete it (the
    # other process sends it again, with its id, once its lease ran out). Read at once: the
    # row's lease (1.5 s) still holds.
    assert rows[("first", line["id"])] >= 1
    assert line["id"] in outbox
    frozen.process.send_signal(signal.SIGKILL)
    frozen.process.wait(timeout=WAIT)
    sent += stages.send(HALF, HALF)
    settle(stages, sent, other)


def kill_the_broker_after_a_commit(stages: Stages, before: str,
                                   **env: str) -> tuple[list[str], str, list[ContainerProcess]]:
    """Stop ``s1`` after a run's commit (``before`` its dispatch or its ack), kill -9 the
    broker of that run's delivery and start it again on its data, resume ``s1``, send the
    second half; what was sent, the frozen run's business id and the processes."""
    frozen, other = both(stages, EO_FREEZE_BEFORE=before, **env)
    sent = stages.send(0, HALF)
    [line] = frozen.take(1, "frozen")
    assert line["broker"] == stages.member_of(line["id"]).name  # the hook named the right one
    broker = stages.brokers[line["broker"]]
    broker.kill()
    broker.start()  # same port and data: the unacked delivery comes back, flagged
    frozen.process.send_signal(signal.SIGCONT)
    sent += stages.send(HALF, HALF)
    return sent, line["id"], [frozen, other]


@pytest.mark.postgresql
@pytest.mark.parametrize("before", ["dispatch", "ack"])
def test_a_broker_killed_between_the_commit_and_the_ack(
    stages: Stages, before: str,
) -> None:
    sent, _, processes = kill_the_broker_after_a_commit(stages, before)
    settle(stages, sent, *processes)


@pytest.mark.postgresql
def test_the_checks_see_a_listener_writing_outside_the_transaction_run_twice(
    stages: Stages,
) -> None:
    """The first stage broken on purpose (``EO_BROKEN``: its effect committed through an
    engine of its own, before the handler returns), the broker killed after that commit:
    the redelivery runs it again, and the checks say so."""
    sent, key, processes = kill_the_broker_after_a_commit(stages, "ack", EO_BROKEN="1")
    end = ended(stages, sent, *processes)
    assert key in end.accounts["first"].repeated, str(end)
    assert key in end.bad


@pytest.mark.postgresql
def test_two_foreign_messages_with_the_same_body_both_run(
    stages: Stages,
) -> None:
    """Same bytes, two messages (two orders of the same content, say): each is run, once."""
    process = stages.start("s1")
    with ForeignProducer() as producer:
        for _ in range(2):
            producer.send(stages.members()[0], "twin")
    stages.drain(["twin"])
    process.process.send_signal(signal.SIGTERM)
    assert process.process.wait(timeout=WAIT) == 0
    rows, outbox = stages.ledger()
    assert (rows[("first", "twin")], rows[("second", "twin")]) == (2, 2), (
        f"rows {dict(rows)}; inbox {dict(stages.inbox())}")
    assert outbox == []
    assert stages.left() == {}


@pytest.mark.postgresql
def test_postgresql_stopped_mid_stream(trio: list[BrokerProcess],
                                       postgres_up: PostgreSQL) -> None:
    def stop_postgresql(stages: Stages) -> list[str]:
        postgres_up.stop_immediately()
        sent = stages.send(HALF, HALF)  # arriving while it is down
        postgres_up.start()
        return sent

    mid_stream(trio, postgres_up, stop_postgresql)


@pytest.fixture
def mariadb_up(mariadb: MariaDB) -> Iterator[MariaDB]:
    """The session's MariaDB server, running (and not paused) after the test whatever it
    did."""
    yield mariadb
    mariadb.resume()
    if not mariadb.running:
        mariadb.start()


@pytest.mark.mariadb
@pytest.mark.parametrize("fault", ["kill -9", "SIGSTOP"])
def test_mariadb_killed_or_hung_mid_stream(trio: list[BrokerProcess], mariadb_up: MariaDB,
                                           fault: str) -> None:
    """What PostgreSQL's tests do not show of MariaDB: its driver's errors when the server
    dies mid-statement (kill -9 of mariadbd, InnoDB recovering at the start) or stops
    answering (SIGSTOP for longer than the database's ``timeout``) are outages, and
    InnoDB's row locks keep the copies the brokers redeliver meanwhile from running twice."""
    def upset(stages: Stages) -> list[str]:
        if fault == "kill -9":
            mariadb_up.crash()
            sent = stages.send(HALF, HALF)  # arriving while it is down
            mariadb_up.start()
            return sent
        mariadb_up.pause()
        try:
            sent = stages.send(HALF, HALF)  # arriving while it is hung
            time.sleep(HUNG)  # the fault's duration
        finally:
            mariadb_up.resume()
        return sent

    mid_stream(trio, mariadb_up, upset)


@pytest.fixture(scope="module")
def bridged(network: Network) -> Iterator[tuple[list[BrokerProcess], PostgreSQL]]:
    """Three brokers and a PostgreSQL server of this module's own, on the network's bridge."""
    if not postgresql_available():
        missing("PostgreSQL")
    with started_together(lambda: ActiveMQ(host=network.address), 3) as brokers, \
            PostgreSQL(host=network.address) as postgres:
        yield brokers, postgres


@pytest.mark.postgresql
def test_a_container_cut_off_mid_stream(
    network: Network, bridged: tuple[list[BrokerProcess], PostgreSQL],
) -> None:
    """One container in a network namespace whose link is cut (every packet dropped,
    nothing reset: the brokers and the database all unreachable) for longer than the brokers
    tolerate its silence, then healed: TCP retransmits what each side wrote meanwhile."""
    brokers, postgres = bridged
    room = network.namespace()

    def cut_off(stages: Stages) -> list[str]:
        room.cut()
        try:
            sent = stages.send(HALF, HALF)  # arriving while it is cut off
            time.sleep(CUT)  # the fault's duration
        finally:
            room.heal()
        return sent

    process = mid_stream(brokers, postgres, cut_off, prefix=room.prefix)
    logged = []
    while not process.lines.empty():
        logged.append(process.lines.get_nowait()["event"])
    assert "connection-lost" in logged  # the container noticed the cut


def mid_stream(brokers: Sequence[BrokerProcess], postgres: PostgreSQL | MariaDB,
               fault: Callable[[Stages], list[str]],
               prefix: Sequence[str] = ()) -> ContainerProcess:
    """Two processes of both stages (``s1`` with ``prefix`` before its command), ``fault``
    once the first stage is midway through the first ``HALF`` (it sends the second half,
    returning their ids), then the checks of ``settle``; ``s1``, ended."""
    with ExitStack() as stack:
        stages = Stages(brokers, postgres, stack)
        first = stages.start("s1", prefix, EO_DELAY=SLOW)
        second = stages.start("s2", EO_DELAY=SLOW)
        sent = stages.send(0, HALF)
        midway(stages)
        sent += fault(stages)
        settle(stages, sent, first, second)
    return first


def midway(stages: Stages) -> None:
    """Wait until the first stage committed some of the first ``HALF`` messages, not all:
    the fault comes mid-stream."""
    def ran() -> int:
        rows, _ = stages.ledger()
        return sum(stage == "first" for stage, _ in rows)
    stages.poll(lambda: ran() >= 3, "3 runs of the first stage")
    assert ran() < HALF, "the stream ended before the fault"
