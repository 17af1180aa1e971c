"""Several container processes on one topic, on real brokers: who gets which message.

Each process runs ``mdb run tests.harness.apps.topic_ledger_app`` (a
``tests.harness.processes.fleet.Fleet``, as in the fault tests); all their ledgers feed one queue,
whose entries name the process (``pid``) and its ``server``. Each scenario runs on one broker, and
on a partitioned topic whose three members live on three brokers: there the test also checks that
the messages were stored on every member (the producer takes turns) and that the messages of every
member were processed.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from mdb import Producer, Settings
from mdb.messages import codec
from mdb.messages.destinations import Destination
from mdb.messages.headers import ID
from mdb.messages.topology import Member
from tests.harness.apps.in_process import WAIT, partitioned_settings, settings_for, unique
from tests.harness.processes.fleet import Fleet, fleet
from tests.harness.traffic.ledger import PER_APP, PER_SERVER


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


def topic_settings(urls: list[str], topic: str) -> Settings:
    """One broker's settings, or, with several URLs, ``topic`` partitioned: one member of the
    same name on each broker."""
    return (settings_for(urls[0]) if len(urls) == 1
            else partitioned_settings(urls, [f"topic:{topic}"]))


def publish(fleet_: Fleet, bodies: list[str]) -> dict[str, Member]:
    """Send ``bodies`` to the fleet's topic; the member each went to, by id, in sending order."""
    return anyio.run(_publish, fleet_, bodies)


async def _publish(fleet_: Fleet, bodies: list[str]) -> dict[str, Member]:
    stored: dict[str, Member] = {}
    async with Producer(fleet_.settings) as producer:
        for body in bodies:
            message = codec.outgoing(body, None)
            stored[message.headers[ID]] = await producer.send_message(
                Destination.parse(f"topic:{fleet_.topic}"), message)
    return stored


def check_members(fleet_: Fleet, stored: dict[str, Member], done: list[dict[str, Any]]) -> None:
    """Every member of the topic holds some of the messages, and ``done`` has each member's
    messages: on a partitioned topic, a listener consumes every member."""
    members = fleet_.settings.topology().members(Destination.parse(f"topic:{fleet_.topic}"))
    assert set(stored.values()) == set(members)  # the producer took turns
    processed = {e["id"] for e in done}
    for member in members:
        on_member = {i for i, m in stored.items() if m == member}
        assert on_member, member
        assert on_member <= processed, (member, sorted(on_member - processed))


def wait_done(fleet_: Fleet, count: int) -> None:
    """Wait until the processes have processed ``count`` messages in all."""
    fleet_.wait(lambda f: len(f.events("done")) >= count, f"{count} messages processed", WAIT)


def stop(fleet_: Fleet) -> None:
    """SIGTERM every process (each exits 0); each one's count of processed messages, in its
    last line, is its ledger's: the ledger is complete."""
    fleet_.stop()
    fleet_.catch_up()
    done = Counter(e["pid"] for e in fleet_.events("done"))
    for entry in fleet_.events("stopped"):
        processed = re.search(r"processed (\d+)", entry["line"])
        assert processed, entry
        assert int(processed[1]) == done[entry["pid"]], entry


def bodies(prefix: str, count: int) -> list[str]:
    return [f"{prefix}{n}" for n in range(count)]


def test_one_copy_per_app_gives_each_message_to_one_of_the_apps_processes(
        real_urls: list[str]) -> None:
    topic = unique("topic")
    with fleet(topic_settings(real_urls, topic), topic) as processes:
        processes.start(unique("app"), ["s1", "s2", "s3"], PER_APP)
        stored = publish(processes, bodies("m", 30))
        wait_done(processes, 30)
        stop(processes)
    done = processes.done()
    assert sorted(e["id"] for e in done) == sorted(stored)  # every message, once app-wide
    assert not any(e["redelivered"] for e in done)
    assert len({e["pid"] for e in done}) > 1, Counter(e["server"] for e in done)
    check_members(processes, stored, done)


def test_one_copy_per_server_gives_each_process_every_message(real_urls: list[str]) -> None:
    topic = unique("topic")
    with fleet(topic_settings(real_urls, topic), topic) as processes:
        servers = processes.start(unique("app"), ["s1", "s2", "s3"], PER_SERVER)
        stored = publish(processes, bodies("m", 10))
        wait_done(processes, 30)
        stop(processes)
    for server in servers:
        done = processes.events("done", [server])
        assert sorted(e["id"] for e in done) == sorted(stored), server.server
        assert {e["server"] for e in done} == {server.server}
        assert not any(e["redelivered"] for e in done)
        check_members(processes, stored, done)


def test_two_apps_on_one_topic_each_get_every_message(real_urls: list[str]) -> None:
    topic = unique("topic")
    with fleet(topic_settings(real_urls, topic), topic) as processes:
        [first] = processes.start(unique("app"), ["s1"], PER_APP)
        [second] = processes.start(unique("app"), ["s1"], PER_APP)
        stored = publish(processes, bodies("m", 10))
        wait_done(processes, 20)
        stop(processes)
    for app in (first, second):
        done = processes.events("done", [app])
        assert sorted(e["id"] for e in done) == sorted(stored)
        assert not any(e["redelivered"] for e in done)
        check_members(processes, stored, done)


def test_a_late_joiner_shares_the_apps_subscription_without_repeats(real_urls: list[str]) -> None:
    app, topic = unique("app"), unique("topic")
    with fleet(topic_settings(real_urls, topic), topic) as processes:
        processes.start(app, ["s1", "s2"], PER_APP)
        stored = publish(processes, bodies("early", 10))
        wait_done(processes, 10)
        processes.start(app, ["s3"], PER_APP)
        stored |= publish(processes, bodies("late", 10))
        wait_done(processes, 20)
        stop(processes)
    done = processes.done()
    assert sorted(e["id"] for e in done) == sorted(stored)  # all 20, none twice
    assert not any(e["redelivered"] for e in done)
    check_members(processes, stored, done)
