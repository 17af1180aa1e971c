"""Several container processes on one topic, on real brokers: who gets which message.

Each process runs ``mdb run tests.contract.topic_ledger_app``; all their ledgers feed one queue,
whose entries name the process (``pid``) and its ``server``. Each scenario runs on one broker, and
on a partitioned topic whose three members live on three brokers: there the test also checks
that the messages were stored on every member (the producer takes turns) and that the messages
of every member were processed.
"""

from __future__ import annotations

import queue
import re
import signal
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import anyio
import pytest

from mdb import Producer, Settings, codec
from mdb.destinations import Destination
from mdb.message import ID
from mdb.topology import Member
from tests.contract.test_crash import ContainerProcess
from tests.harness.in_process import WAIT, partitioned_settings, settings_for, unique

PER_APP, PER_SERVER = "one-copy-per-app", "one-copy-per-server"


@pytest.fixture(
    params=[
        pytest.param("activemq", marks=pytest.mark.activemq),
        pytest.param("rabbitmq", marks=pytest.mark.rabbitmq),
        pytest.param("activemq_trio", marks=pytest.mark.activemq),
    ]
)
def real_urls(request: pytest.FixtureRequest) -> Iterator[list[str]]:
    """Real brokers' URLs (container processes cannot share an in-memory broker): one broker,
    or three, each holding one member of the partitioned topic."""
    found = request.getfixturevalue(request.param)
    yield [str(b.url) for b in found] if isinstance(found, list) else [str(found.url)]


class Fleet:
    """Container processes of ``topic_ledger_app`` on one topic, sharing one ledger queue.

    With several URLs the topic is partitioned: one member of the same name on each broker.
    """

    def __init__(self, urls: list[str], topic: str, distribution: str, stack: ExitStack) -> None:
        self.topic, self.distribution, self.stack = topic, distribution, stack
        self.settings: Settings = (settings_for(urls[0]) if len(urls) == 1
                                   else partitioned_settings(urls, [f"topic:{topic}"]))
        self.members = self.settings.topology().members(Destination.parse(f"topic:{topic}"))
        self.stored: dict[str, Member] = {}  # message id → the member the producer sent it to
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        self.seen: list[dict[str, Any]] = []
        self.processes: list[ContainerProcess] = []

    def start(self, app: str, *servers: str) -> list[ContainerProcess]:
        """Start one process per server and wait until each says ``mdb: ready``."""
        started = [self.stack.enter_context(ContainerProcess(
            self.settings, "unused", app, server, hang=False,
            module="tests.contract.topic_ledger_app",
            env={"LEDGER_TOPIC": self.topic, "LEDGER_DISTRIBUTION": self.distribution},
            lines=self.lines)) for server in servers]
        self.processes += started
        ready = self.take(len(servers), "ready")
        assert sorted(e["server"] for e in ready) == sorted(servers)
        return started

    def publish(self, bodies: list[str]) -> list[str]:
        """Send ``bodies`` to the topic; return their ids, and note the member each went to."""
        return anyio.run(self._publish, bodies)

    async def _publish(self, bodies: list[str]) -> list[str]:
        sent = []
        async with Producer(self.settings) as producer:
            for body in bodies:
                message = codec.outgoing(body, None)
                member = await producer.send_message(Destination.parse(f"topic:{self.topic}"),
                                                     message)
                self.stored[message.headers[ID]] = member
                sent.append(message.headers[ID])
        return sent

    def check_members(self, *processes: ContainerProcess) -> None:
        """Every member of the topic holds some of the messages, and ``processes`` (all when
        none are given) processed each member's messages: on a partitioned topic, a listener
        consumes every member."""
        assert set(self.stored.values()) == set(self.members)  # the producer took turns
        processed = {e["id"] for e in self.done(*processes)}
        for member in self.members:
            on_member = {i for i, m in self.stored.items() if m == member}
            assert on_member, member
            assert on_member <= processed, (member, sorted(on_member - processed))

    def take(self, count: int, event: str, timeout: float = WAIT) -> list[dict[str, Any]]:
        """The next ``count`` entries of ``event`` from any process (all are kept in ``seen``)."""
        deadline = time.monotonic() + timeout
        taken: list[dict[str, Any]] = []
        while len(taken) < count:
            try:
                entry = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"{len(taken)} of {count} {event!r} entries in {timeout} s; "
                            f"seen {self.seen}")
            self.seen.append(entry)
            if entry["event"] == event:
                taken.append(entry)
        return taken

    def stop(self) -> None:
        """SIGTERM every process; each exits 0, and its whole ledger is then in ``seen``."""
        for process in self.processes:
            process.process.send_signal(signal.SIGTERM)
        for process in self.processes:
            assert process.process.wait(timeout=WAIT) == 0
        stopped = self.take(len(self.processes), "stopped")  # each process's last line
        assert sorted(e["pid"] for e in stopped) == sorted(p.process.pid for p in self.processes)
        done = Counter(e["pid"] for e in self.done())
        for entry in stopped:
            processed = re.search(r"processed (\d+)", entry["line"])
            assert processed, entry
            assert int(processed[1]) == done[entry["pid"]], entry  # the ledger is complete
        assert self.lines.empty()

    def done(self, *processes: ContainerProcess) -> list[dict[str, Any]]:
        """Ledger entries of ``processes`` (all when none are given)."""
        pids = {p.process.pid for p in processes or self.processes}
        return [e for e in self.seen if e["event"] == "done" and e["pid"] in pids]


@contextmanager
def fleet(urls: list[str], distribution: str) -> Iterator[Fleet]:
    with ExitStack() as stack:
        yield Fleet(urls, unique("topic"), distribution, stack)


def bodies(prefix: str, count: int) -> list[str]:
    return [f"{prefix}{n}" for n in range(count)]


def test_one_copy_per_app_gives_each_message_to_one_of_the_apps_processes(
        real_urls: list[str]) -> None:
    with fleet(real_urls, PER_APP) as processes:
        processes.start(unique("app"), "s1", "s2", "s3")
        sent = processes.publish(bodies("m", 30))
        processes.take(30, "done")
        processes.stop()
    done = processes.done()
    assert sorted(e["id"] for e in done) == sorted(sent)  # every message, once app-wide
    assert not any(e["redelivered"] for e in done)
    assert len({e["pid"] for e in done}) > 1, Counter(e["server"] for e in done)
    processes.check_members()


def test_one_copy_per_server_gives_each_process_every_message(real_urls: list[str]) -> None:
    with fleet(real_urls, PER_SERVER) as processes:
        servers = processes.start(unique("app"), "s1", "s2", "s3")
        sent = processes.publish(bodies("m", 10))
        processes.take(30, "done")
        processes.stop()
    for server in servers:
        done = processes.done(server)
        assert sorted(e["id"] for e in done) == sorted(sent), server.server
        assert {e["server"] for e in done} == {server.server}
        assert not any(e["redelivered"] for e in done)
        processes.check_members(server)


def test_two_apps_on_one_topic_each_get_every_message(real_urls: list[str]) -> None:
    with fleet(real_urls, PER_APP) as processes:
        [first] = processes.start(unique("app"), "s1")
        [second] = processes.start(unique("app"), "s1")
        sent = processes.publish(bodies("m", 10))
        processes.take(20, "done")
        processes.stop()
    for app in (first, second):
        done = processes.done(app)
        assert sorted(e["id"] for e in done) == sorted(sent)
        assert not any(e["redelivered"] for e in done)
        processes.check_members(app)


def test_a_late_joiner_shares_the_apps_subscription_without_repeats(real_urls: list[str]) -> None:
    app = unique("app")
    with fleet(real_urls, PER_APP) as processes:
        processes.start(app, "s1", "s2")
        sent = processes.publish(bodies("early", 10))
        processes.take(10, "done")
        processes.start(app, "s3")
        sent += processes.publish(bodies("late", 10))
        processes.take(10, "done")
        processes.stop()
    done = processes.done()
    assert sorted(e["id"] for e in done) == sorted(sent)  # all 20, none twice
    assert not any(e["redelivered"] for e in done)
    processes.check_members()
