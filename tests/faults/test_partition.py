"""A container process cut off from its brokers, or frozen, past the broker's tolerance, checked
with a ledger (docs/failover.md, "Partitions").

Two ActiveMQ brokers listen on a private bridge (``tests.harness.servers.netns``) and hold a topic
partitioned over them. App ``shop`` runs two container processes on one shared subscription
(``one-copy-per-app``). While a producer on the host sends, one process, then the other, is
cut off or frozen for a while, then let go. ActiveMQ drops a connection it has not heard from
two to three of the client's heart-beat intervals after the last byte it read
(docs/failover.md) and hands its unacknowledged messages, flagged redelivered, to the other
process; what it had written to the dropped connection still arrives afterwards. That must
never be processed as fresh.

Afterwards every message whose send returned was processed, no repeat was unflagged (a delivery
processed unflagged after a flagged one of the same message counts: ``ledger.check``), and
nothing is left on the brokers. The durations derive from the heart-beat setting.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator, Sequence
from functools import partial

import pytest

from tests.harness.apps.in_process import unique
from tests.harness.processes.fleet import Fleet, LedgerProcess, fault_settings, fleet
from tests.harness.servers.activemq import ActiveMQ, activemq_available
from tests.harness.servers.brokers import missing
from tests.harness.servers.netns import Namespace, Network
from tests.harness.servers.process import BrokerProcess, started_together
from tests.harness.traffic.ledger import PER_APP
from tests.harness.traffic.load_producer import LoadProducer

pytestmark = pytest.mark.activemq

LOAD = 40  # messages processed before the first fault
AFTER = 60  # messages told-sent after the last fault
HEARTBEAT_MS = 1000
# How long each cut or freeze lasts, in heart-beat intervals: across the window in which the
# broker drops a connection it has not heard from (2 to 3 intervals after the last byte it read).
DURATIONS = (2.1, 2.25, 2.4, 2.55, 2.7, 2.85)


@pytest.fixture(scope="module")
def brokers(network: Network) -> Iterator[list[BrokerProcess]]:
    """Two private ActiveMQ brokers listening on the network's bridge."""
    if not activemq_available():
        missing("ActiveMQ Classic")
    with started_together(lambda: ActiveMQ(host=network.address), 2) as started:
        yield started


Fault = Callable[[int, float], None]  # (which process, for how many seconds)


def faults_under_load(brokers: list[BrokerProcess], rooms: Sequence[Namespace | None],
                      fault: Callable[[Fleet, list[LedgerProcess]], Fault],
                      durations: Sequence[float]) -> list[dict[str, object]]:
    """Run ``shop`` with one process in each of ``rooms`` (None: the host's network) and the
    producer; once loaded, apply ``fault(fleet, processes)(i, seconds)`` to process ``i % 2``
    for each of ``durations`` (heart-beat intervals), waiting after each until that process
    consumes again. Asserts the contract; returns the ``connection-lost`` events of the
    processes."""
    topic, shop = unique("partition"), unique("shop")
    settings = fault_settings([str(b.url) for b in brokers], topic, heartbeat_ms=HEARTBEAT_MS)
    with fleet(settings, topic) as processes:
        victims = [processes.start(shop, [f"s{n}"], PER_APP,
                                   prefix=room.prefix if room else ())[0]
                   for n, room in enumerate(rooms, 1)]
        apply = fault(processes, victims)
        with LoadProducer(settings, topic) as producer:
            processes.wait(lambda f: len(f.processed(shop)) >= LOAD, f"{LOAD} processed")
            for number, intervals in enumerate(durations):
                since = len(processes.seen)
                apply(number % len(victims), intervals * HEARTBEAT_MS / 1000)
                pid = victims[number % len(victims)].process.pid
                processes.wait(partial(Fleet.consumed_since, pid=pid, since=since),
                               f"process {pid} consuming again")
            producer.wait_told(AFTER)
        told = producer.told
        verdicts, stored = processes.settle(told, brokers)
        noticed = processes.events("connection-lost", victims)
    print({k: str(v) for k, v in verdicts.items()}, "connections lost:", len(noticed))
    assert set(verdicts) == {shop}, verdicts
    assert verdicts[shop].ok, verdicts[shop]
    assert not stored, stored
    return noticed


def test_a_container_cut_off_never_processes_a_stale_message_as_fresh(
        network: Network, brokers: list[BrokerProcess]) -> None:
    """Each process in its own network namespace; its link cut (every packet dropped, no reset)
    and healed: TCP then retransmits what each side wrote meanwhile."""
    rooms = [network.namespace() for _ in range(2)]

    def cut(processes: Fleet, victims: list[LedgerProcess]) -> Fault:
        def apply(index: int, seconds: float) -> None:
            rooms[index].cut()
            try:
                processes.hold(seconds)
            finally:
                rooms[index].heal()
        return apply

    noticed = faults_under_load(brokers, rooms, cut, DURATIONS)
    assert noticed  # the cuts were partitions the processes noticed


def test_a_container_frozen_never_processes_a_stale_message_as_fresh(
        brokers: list[BrokerProcess]) -> None:
    """SIGSTOP (a paused VM, a machine swapping), then SIGCONT: when the broker dropped the
    process meanwhile, what it wrote before is waiting in the process's sockets, read after a
    silence longer than the broker tolerated."""
    def freeze(processes: Fleet, victims: list[LedgerProcess]) -> Fault:
        def apply(index: int, seconds: float) -> None:
            victim = victims[index].process
            victim.send_signal(signal.SIGSTOP)
            try:
                processes.hold(seconds)
            finally:
                victim.send_signal(signal.SIGCONT)
        return apply

    noticed = faults_under_load(brokers, [None, None], freeze, DURATIONS)
    assert noticed  # the freezes were noticed
