"""An ActiveMQ shared-store master/slave pair: the master killed under load, then the fail-back.

A topic is partitioned over broker ``a``, a shared-store pair given as its two addresses
(``tests.harness.servers.activemq_pair``), and broker ``b``, a plain broker. App ``shop`` runs two
container processes on one shared subscription (``one-copy-per-app``), app ``audit`` two servers
with their own (``one-copy-per-server``); a producer with the same settings sends in a loop.
Handlers take a while, and the master is killed (kill -9) while one of them works on a message
of the pair's member; the slave takes over on its own address and the processes and the
producer follow it there. Then the fail-back: the killed broker comes back as the waiting
one and the new master is killed. Afterwards, as in ``test_broker_faults``: every message whose
send returned was processed by the app and by each audit server, every repeat was flagged
redelivered (there are some: the messages in flight at a kill), and nothing told-sent is left
on a broker.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.faults.tools.takeover import take_over
from tests.harness.apps.in_process import unique
from tests.harness.processes.fleet import Fleet, fault_settings, fleet
from tests.harness.servers.activemq import ActiveMQ, activemq_available
from tests.harness.servers.activemq_pair import SharedStorePair
from tests.harness.servers.brokers import missing
from tests.harness.traffic.ledger import PER_APP, PER_SERVER
from tests.harness.traffic.load_producer import LoadProducer

pytestmark = pytest.mark.activemq

LOAD = 40  # messages processed before the first kill
RESUMED = 5  # messages sent through a new master and processed, before going on
AFTER = 60  # messages told-sent after the fail-back
SLOW = {"LEDGER_DELAY": "0.1"}  # seconds a handler works: messages are in flight at a kill


@pytest.fixture
def brokers() -> Iterator[tuple[SharedStorePair, ActiveMQ]]:
    if not activemq_available():
        missing("ActiveMQ Classic")
    with SharedStorePair() as pair, ActiveMQ() as other:
        yield pair, other


def sent_through_a_since(producer: LoadProducer, app: str) -> Callable[[Fleet], bool]:
    """A condition: ``app`` processed ``RESUMED`` messages that the producer sent to broker
    ``a`` from now on (through whichever address serves now)."""
    before = set(producer.told)

    def condition(f: Fleet) -> bool:
        new = {i for i, b in producer.told.items() if b == "a" and i not in before}
        return len(new & f.processed(app)) >= RESUMED
    return condition


def working_on_a(producer: LoadProducer, app: str) -> Callable[[Fleet], bool]:
    """A condition: a handler of ``app`` started a message of broker ``a`` and is not done."""
    def condition(f: Fleet) -> bool:
        told = producer.told
        running = ({e["id"] for e in f.events("start") if e["app"] == app}
                   - {e["id"] for e in f.done(app)})
        return any(told.get(i) == "a" for i in running)
    return condition


def test_a_master_killed_under_load_and_the_fail_back(
        brokers: tuple[SharedStorePair, ActiveMQ]) -> None:
    pair, other = brokers
    topic = unique("ha")
    settings = fault_settings([pair.urls, other.url], topic)
    with fleet(settings, topic) as processes:
        shop, audit = unique("shop"), unique("audit")
        processes.start(shop, ["s1", "s2"], PER_APP, SLOW)
        processes.start(audit, ["s1", "s2"], PER_SERVER, SLOW)
        with LoadProducer(settings, topic, pace=0.02) as producer:
            processes.wait(lambda f: len(f.processed(shop)) >= LOAD, f"{LOAD} processed")
            processes.wait(working_on_a(producer, shop), "a message of a in flight")
            first = take_over(pair, processes, producer, shop, "a")
            processes.wait(sent_through_a_since(producer, shop), "sending through the slave")
            pair.start_as_slave(first.killed)  # the fail-back: the old master now waits
            processes.wait(working_on_a(producer, shop), "a message of a in flight")
            back = take_over(pair, processes, producer, shop, "a")
            assert back.master is first.killed
            processes.wait(sent_through_a_since(producer, shop), "sending through the first")
            producer.wait_told(AFTER)
        told = producer.told
        verdicts, stored = processes.settle(told, [pair.master(), other])
    assert set(verdicts) == {shop, f"{audit}/s1", f"{audit}/s2"}, verdicts
    for key, verdict in verdicts.items():
        assert verdict.ok, f"{key}: {verdict}"
    assert verdicts[shop].flagged > 0, verdicts[shop]  # in flight at a kill: processed again
    assert not stored, stored
    print(f"takeover: {first}; fail-back: {back}")
    print({k: str(v) for k, v in verdicts.items()}, "raised:", len(producer.raised))
