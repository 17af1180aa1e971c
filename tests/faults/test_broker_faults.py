"""Faults under load on three ActiveMQ brokers, checked with a ledger.

A topic is partitioned over three private brokers (one member on each; this module's own
brokers, never the session fixtures, since it kills them). App ``shop`` runs two container
processes on one shared subscription (``one-copy-per-app``); app ``audit`` runs two servers with
their own subscriptions (``one-copy-per-server``). A producer sends in a loop from a thread while a
fault happens. Afterwards, for each app (and each audit server): every message whose send returned
was processed, every repeat was flagged redelivered, and nothing told-sent is left on a broker.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from tests.harness.apps.in_process import unique
from tests.harness.processes.fleet import Fleet, fault_settings, fleet
from tests.harness.servers.process import BrokerProcess, start_all
from tests.harness.traffic.ledger import PER_APP, PER_SERVER, Verdict
from tests.harness.traffic.load_producer import LoadProducer

pytestmark = pytest.mark.activemq

LOAD = 40  # messages processed before the fault: load has built up
AFTER = 60  # messages told-sent after the fault has been dealt with




@pytest.fixture
def brokers(trio: list[BrokerProcess]) -> Iterator[list[BrokerProcess]]:
    yield trio
    for broker in trio:  # whatever the test did: running again, not hung
        broker.resume()
    start_all(trio)


@dataclass
class Run:
    fleet: Fleet
    producer: LoadProducer
    shop: str
    audit: str

    def processed_since(self, told_before: set[str], count: int, broker: str | None = None,
                        ) -> Callable[[Fleet], bool]:
        """A condition: ``shop`` processed ``count`` messages told-sent after ``told_before``
        (to ``broker``, if given)."""
        def condition(f: Fleet) -> bool:
            told = self.producer.told
            new = {i for i, b in told.items()
                   if i not in told_before and (broker is None or b == broker)}
            return len(new & f.processed(self.shop)) >= count
        return condition


def scenario(brokers: list[BrokerProcess], fault: Callable[[Run], None],
             env: dict[str, str] | None = None, pace: float = 0.01,
             ) -> tuple[dict[str, Verdict], LoadProducer, Fleet]:
    """Run the fleet and the producer, apply ``fault`` once ``LOAD`` messages were processed,
    send ``AFTER`` more, drain, stop the processes, and return the verdicts."""
    topic = unique("faults")
    settings = fault_settings([str(b.url) for b in brokers], topic)
    with fleet(settings, topic) as processes:
        shop, audit = unique("shop"), unique("audit")
        processes.start(shop, ["s1", "s2"], PER_APP, env)
        processes.start(audit, ["s1", "s2"], PER_SERVER, env)
        with LoadProducer(settings, topic, pace=pace) as producer:
            run = Run(processes, producer, shop, audit)
            processes.wait(lambda f: len(f.processed(shop)) >= LOAD, f"{LOAD} processed")
            fault(run)
            producer.wait_told(AFTER)
        told = producer.told
        verdicts, stored = processes.settle(told, brokers)
    assert set(verdicts) == {shop, f"{audit}/s1", f"{audit}/s2"}, verdicts
    for key, verdict in verdicts.items():
        assert verdict.ok, f"{key}: {verdict}"
    assert not stored, stored
    print({k: str(v) for k, v in verdicts.items()}, "raised:", len(producer.raised))
    return verdicts, producer, processes


@pytest.mark.parametrize(("fault", "recovery"), [("kill", "restart"), ("pause", "resume")],
                         ids=["killed_and_restarted", "hung_and_resumed"])
def test_a_broker_fails_and_recovers_under_load(brokers: list[BrokerProcess], fault: str,
                                                recovery: str) -> None:
    def fail_broker_b(run: Run) -> None:
        before = set(run.producer.told)
        getattr(brokers[1], fault)()  # kill -9, or SIGSTOP: a hung broker
        # Every process notices (a killed broker at once, a hung one by its heartbeats), and the
        # members on a and c keep being consumed.
        pids = {p.process.pid for p in run.fleet.alive()}
        run.fleet.wait(lambda f: pids <= {e["pid"] for e in f.events("connection-lost")
                                          if e["broker"] == "b"},
                       "every process noticing that b is down")
        run.fleet.wait(run.processed_since(before, 30), "processing while b is down")
        getattr(brokers[1], recovery)()  # same port, same data: its stored messages come back
        after = set(run.producer.told)
        run.fleet.wait(run.processed_since(after, 5, broker="b"), "b's member consumed again")

    scenario(brokers, fail_broker_b)


def test_a_container_process_killed_under_load_has_its_work_redelivered_flagged(
        brokers: list[BrokerProcess]) -> None:
    killed: dict[tuple[str, str], tuple[int, set[str]]] = {}  # (app, server) → pid, in flight
    slow = {"LEDGER_DELAY": "0.1"}  # handlers take a while: work is in flight when killed

    def kill_processes(run: Run) -> None:
        for app, server, replacement in ((run.shop, "s1", "s3"), (run.audit, "s1", "s1")):
            [victim] = [p for p in run.fleet.alive()
                        if run.fleet.app_of[p.process.pid] == app and p.server == server]
            pid = victim.process.pid

            def in_flight(f: Fleet, pid: int = pid) -> set[str]:
                started = {e["id"] for e in f.events("start") if e["pid"] == pid}
                return started - {e["id"] for e in f.events("done") if e["pid"] == pid}

            def busy(f: Fleet, in_flight: Callable[[Fleet], set[str]] = in_flight) -> bool:
                return bool(in_flight(f))

            run.fleet.wait(busy, f"{app}/{server} busy")
            run.fleet.kill(victim)
            killed[app, server] = pid, in_flight(run.fleet)
            # Per app: another server takes over; per server: the same server name comes back
            # to its own durable subscription.
            run.fleet.start(app, [replacement], run.fleet.distribution[app], slow)

    _, _, processes = scenario(brokers, kill_processes, env=slow, pace=0.02)
    for (app, server), (pid, ids) in killed.items():
        assert ids, (app, server)
        again = [e for e in processes.done(app) if e["id"] in ids and e["pid"] != pid
                 and (processes.distribution[app] == PER_APP or e["server"] == server)]
        assert {e["id"] for e in again} == ids, (app, server)  # processed again...
        assert all(e["redelivered"] for e in again), (app, server, again)  # ...flagged


def test_a_producer_sending_through_an_outage_of_every_broker(
        brokers: list[BrokerProcess]) -> None:
    def outage(run: Run) -> None:
        raised = len(run.producer.raised)
        for broker in brokers:
            broker.kill()
        run.fleet.wait(lambda f: len(run.producer.raised) >= raised + 5, "sends raise")
        start_all(brokers)
        after = set(run.producer.told)
        for name in ("a", "b", "c"):
            run.fleet.wait(run.processed_since(after, 3, broker=name),
                           f"member on {name} consumed again")

    _, producer, _ = scenario(brokers, outage)
    assert producer.raised  # those were not counted as told-sent; all the others were processed
