"""The topology changed while messages flow: a member added, one removed, a bad one rejected.

Three private ActiveMQ brokers ``a``, ``b``, ``c`` (this module's own). Two container processes
of app ``shop`` (``one-copy-per-app``) run ``mdb run tests.harness.apps.topic_ledger_app --config
FILE``; the file first puts the partitioned topic's members on ``a`` and ``b`` only, and is
rewritten (atomically: a temporary file moved over it) while a producer sends in a loop:

1. member ``c`` is added (the file watcher applies it): every process reports it joined, the
   producer then sends to ``a``, ``b`` and ``c``, and ``c``'s messages are processed;
2. member ``a`` is removed (file rewritten, then SIGHUP at once): the producer first stops
   sending to ``a`` and what ``a`` holds is processed; every process reports ``a`` gone and the
   processing goes on on ``b`` and ``c``;
3. a topology with a member on an unknown broker is written, then SIGHUP: every process
   rejects it and goes on consuming;
4. the processes stop in order; every message told-sent (always to a member with a
   subscription) was processed once app-wide, no repeat unflagged, nothing left on a broker.

ActiveMQ keeps a message sent to a topic member only for subscriptions that exist then, so the
producer only sends to a member once every process subscribed on it, and stops sending to a
member before it leaves.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from mdb import Settings
from mdb.config.settings import DestinationSettings, MemberSettings
from mdb.serving.http.client import fetch_status
from tests.harness.apps.in_process import unique
from tests.harness.processes.fleet import WAIT, Fleet, LedgerProcess, fault_settings, fleet
from tests.harness.servers.process import BrokerProcess
from tests.harness.traffic.ledger import PER_APP
from tests.harness.traffic.load_producer import LoadProducer

pytestmark = pytest.mark.activemq

LOAD = 40  # messages processed before the first change
AFTER = 20  # messages processed on a member after a change, to call it consumed




def on(settings: Settings, topic: str, *brokers: str) -> Settings:
    """``settings`` with ``topic:<topic>`` partitioned over members on ``brokers``."""
    members = [MemberSettings(broker=b) for b in brokers]
    return settings.model_copy(update={"destinations": {
        f"topic:{topic}": DestinationSettings(members=members)}})


def write_config(path: Path, settings: Settings) -> None:
    """Write the topology of ``settings`` (and a health endpoint on any free port) as TOML,
    atomically: the watcher of ``mdb run`` never reads a half-written file."""
    lines = ["health_port = 0"]
    for name, broker in settings.brokers.items():
        lines.append(f"[brokers.{name}]")
        lines += [f"{key} = {json.dumps(value)}"
                  for key, value in broker.model_dump(mode="json", exclude_none=True).items()]
    for key, entry in settings.destinations.items():
        members = ", ".join(f'{{ broker = {json.dumps(m.broker)} }}' for m in entry.members)
        lines += [f"[destinations.{json.dumps(key)}]", f"members = [{members}]"]
    temporary = path.with_suffix(".tmp")
    temporary.write_text("\n".join(lines) + "\n")
    os.replace(temporary, path)


def hang_up(processes: list[LedgerProcess]) -> None:
    for process in processes:
        process.process.send_signal(signal.SIGHUP)


def reported(event: str, broker: str, processes: list[LedgerProcess], since: int,
             ) -> Callable[[Fleet], bool]:
    """A condition: every one of ``processes`` logged ``event`` for the member on ``broker``
    after the fleet's first ``since`` lines."""
    pids = {p.process.pid for p in processes}

    def condition(f: Fleet) -> bool:
        return pids <= {e["pid"] for e in f.seen[since:]
                        if e.get("event") == event and e.get("broker") == broker}
    return condition


def subscribed(process: LedgerProcess) -> tuple[int, int]:
    """How many members of the listener have a subscription in ``process``, of how many."""
    assert process.health is not None, "no health endpoint"
    [listener] = fetch_status(process.health, 5.0).listeners
    return listener.subscribed, listener.members


def wait_subscribed(processes: list[LedgerProcess], members: int) -> None:
    deadline = time.monotonic() + WAIT
    while (found := [subscribed(p) for p in processes]) != [(members, members)] * len(processes):
        assert time.monotonic() < deadline, f"subscribed/members per process: {found}"
        time.sleep(0.1)


def processed_since(producer: LoadProducer, app: str, told_before: set[str], count: int,
                    broker: str) -> Callable[[Fleet], bool]:
    """A condition: ``app`` processed ``count`` messages told-sent to ``broker`` after
    ``told_before``."""
    def condition(f: Fleet) -> bool:
        new = {i for i, b in producer.told.items() if i not in told_before and b == broker}
        return len(new & f.processed(app)) >= count
    return condition


def test_a_member_added_and_one_removed_while_messages_flow(
        trio: list[BrokerProcess], tmp_path: Path) -> None:
    topic, shop = unique("topology"), unique("shop")
    every = fault_settings([str(b.url) for b in trio], topic)  # members on a, b and c
    config = tmp_path / "mdb.toml"
    write_config(config, on(every, topic, "a", "b"))
    notes: dict[str, object] = {}
    with fleet(every, topic) as processes:
        started = processes.start(shop, ["s1", "s2"], PER_APP, {"MDB_LOG_LEVEL": "INFO"},
                                  config=config)
        wait_subscribed(started, 2)
        with LoadProducer(on(every, topic, "a", "b"), topic) as producer:
            processes.wait(lambda f: len(f.processed(shop)) >= LOAD, f"{LOAD} processed")

            # 1. Member c joins: the watcher notices the file changed.
            mark = len(processes.seen)
            write_config(config, on(every, topic, "a", "b", "c"))
            processes.wait(reported("member-available", "c", started, mark),
                           "every process reporting that member c joined")
            notes["subscribed when c was reported"] = [subscribed(p) for p in started]
            wait_subscribed(started, 3)
            producer.switch(on(every, topic, "a", "b", "c"))
            before = set(producer.told)
            for broker in ("a", "b", "c"):
                processes.wait(processed_since(producer, shop, before, AFTER, broker),
                               f"messages sent to {broker} processed with c joined")

            # 2. Member a leaves, file rewritten and SIGHUP at once; nothing is sent to a any
            # more and what a holds is processed first, since nobody consumes it afterwards.
            producer.switch(on(every, topic, "b", "c"))
            to_a = {i for i, b in producer.told.items() if b == "a"}
            processes.wait(lambda f: to_a <= f.processed(shop), "a's messages processed")
            mark = len(processes.seen)
            write_config(config, on(every, topic, "b", "c"))
            hang_up(started)
            processes.wait(reported("member-unavailable", "a", started, mark),
                           "every process reporting that member a left")
            wait_subscribed(started, 2)
            before = set(producer.told)
            for broker in ("b", "c"):
                processes.wait(processed_since(producer, shop, before, AFTER, broker),
                               f"messages sent to {broker} processed with a gone")

            # 3. A member on an unknown broker: rejected on SIGHUP, the running topology stays.
            mark = len(processes.seen)
            bad = on(every, topic, "b", "c")
            bad.destinations[f"topic:{topic}"].members.append(MemberSettings(broker="z"))
            write_config(config, bad)
            hang_up(started)
            pids = {p.process.pid for p in started}
            processes.wait(lambda f: pids <= {e["pid"] for e in f.seen[mark:]
                                              if e.get("event") == "rejected"
                                              and "SIGHUP" in e["line"]},
                           "every process rejecting the bad topology")
            before = set(producer.told)
            for broker in ("b", "c"):
                processes.wait(processed_since(producer, shop, before, AFTER, broker),
                               f"messages sent to {broker} processed after the rejection")
            wait_subscribed(started, 2)
            rejected = [e["line"].strip() for e in processes.seen[mark:]
                        if e.get("event") == "rejected"]
        told = producer.told

        # 4. Stop in order; the ledger.
        verdicts, stored = processes.settle(told, trio)
    assert set(verdicts) == {shop}, verdicts
    assert verdicts[shop].ok, verdicts[shop]
    assert not stored, stored
    assert all("'z' is not a broker" in line for line in rejected), rejected
    events = [e for e in processes.seen if e.get("event", "").startswith("member-")]
    assert sorted((e["event"], e["broker"]) for e in events) == [
        ("member-available", "c")] * 2 + [("member-unavailable", "a")] * 2, events
    sent = {b: sum(1 for v in told.values() if v == b) for b in ("a", "b", "c")}
    print(verdicts[shop], "sent per member:", sent, "raised:", len(producer.raised), notes)
