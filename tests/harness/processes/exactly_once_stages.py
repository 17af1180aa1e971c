"""Two exactly-once stages (``tests.harness.apps.exactly_once_app``) as container processes of one
app on three ActiveMQ brokers (or as many as given) and a new database of a private
PostgreSQL server, fed by a foreign producer, and the checks of their effect ledger: what
the exactly-once fault tests and the random fault run's ``--exactly-once`` mode share
(docs/exactly-once.md, "Testing").

Both stages' destinations are partitioned over the brokers, one member on each, each
member's name ending with its broker's (``a``, ``b``, ``c``): the first stage's topic
``topic:<topic>`` (one copy per app), its members ``<topic>.a``, …; the second stage's
queue ``queue:<topic>.second``, its members ``<topic>.second.a``, …. The producer is plain
stomp.py (``tests.harness.traffic.foreign``): its messages carry no ``mdb_id``, only a business id
in the body (``m17``), which keys the ledger in both stages.

The contract after any fault: every business id whose send was confirmed has one row of
each stage in the ledger, one whose send raised has none or one of each, the second stage
has a row for each the first ran, nothing is left in the outbox, and nothing in the
stages' queues on any broker, their error queues or ``ActiveMQ.DLQ``.
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

from mdb import Settings
from mdb.config.database_settings import DatabaseSettings
from mdb.config.settings import DestinationSettings, MemberSettings
from mdb.errors import DatabaseUnavailable
from mdb.exactly_once import tables
from mdb.exactly_once.database.database import Database
from tests.harness.apps.exactly_once_app import effects, ledger_tables
from tests.harness.apps.in_process import unique
from tests.harness.processes.container_process import ContainerProcess
from tests.harness.processes.fleet import WAIT, browse, fault_settings
from tests.harness.servers.mariadb import MariaDB
from tests.harness.servers.postgresql import PostgreSQL
from tests.harness.servers.process import BrokerProcess
from tests.harness.traffic.foreign import ForeignProducer, Member

STAGES = ("first", "second")  # the ledger's stages, also the listeners' names
APP = "eo"  # the app of every process of the stages
TIMEOUT = 3.0  # the database's ``timeout`` in the containers' settings

Rows = Counter[tuple[str, str]]  # rows of the effect ledger per (stage, business id)


def spread(name: str, brokers: Collection[str]) -> DestinationSettings:
    """A destination with one member on each of ``brokers``, named ``<name>.<broker>``."""
    return DestinationSettings(members=[MemberSettings(broker=b, name=f"{name}.{b}")
                                        for b in brokers])


class Stages:
    """The two stages' container processes on ``brokers`` (named ``a``, ``b``, ``c``… in
    that order) and a new database of ``server`` (PostgreSQL or MariaDB)."""

    def __init__(self, brokers: Sequence[BrokerProcess], server: PostgreSQL | MariaDB,
                 stack: ExitStack) -> None:
        self.stack = stack
        self.topic = unique("eo")
        # Short heart-beats, reconnect delays and timeouts: a fault is noticed and over soon.
        settings = fault_settings([b.url for b in brokers], self.topic, app=APP)
        self.settings: Settings = settings.model_copy(update={"destinations": {
            f"topic:{self.topic}": spread(self.topic, settings.brokers),
            f"queue:{self.topic}.second": spread(f"{self.topic}.second", settings.brokers)}})
        self.brokers = dict(zip(settings.brokers, brokers, strict=True))
        self.url = server.create_database(self.topic)
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

    def members(self) -> list[Member]:
        """The first stage's members, as a foreign producer sends to them: on ActiveMQ a
        topic ``X`` is ``/topic/VirtualTopic.X`` (docs/activemq.md)."""
        return [Member(name, broker, f"/topic/VirtualTopic.{self.topic}.{name}")
                for name, broker in self.brokers.items()]

    def start(self, server: str, prefix: Sequence[str] = (), **env: str) -> ContainerProcess:
        """A container process of both stages, once it said it is ready; ``prefix`` goes
        before its command (``Namespace.prefix`` runs it in a network namespace)."""
        process = self.stack.enter_context(ContainerProcess(
            self.settings, "unused", APP, server, hang=False, prefix=prefix,
            module="tests.harness.apps.exactly_once_app", env={
                "EO_TOPIC": self.topic,
                "MDB_DATABASES": json.dumps({"main": {
                    "url": self.url, "timeout": TIMEOUT, "outbox_lease": 1.5}}),
                **env}))
        process.take(1, "ready")
        return process

    def member_of(self, key: str) -> Member:
        """The member ``send`` sends business id ``key`` (``m<N>``) to: N modulo their
        number, so that the messages are spread over every broker."""
        members = self.members()
        return members[int(key.removeprefix("m")) % len(members)]

    def send(self, first: int, count: int) -> list[str]:
        """Business ids ``m<first>`` … to the first stage with the foreign producer, each to
        its ``member_of``, each confirmed; the ids."""
        keys = [f"m{n}" for n in range(first, first + count)]
        with ForeignProducer() as producer:
            for key in keys:
                producer.send(self.member_of(key), key)
        return keys

    def ledger(self) -> tuple[Rows, list[str]]:
        """The effect ledger's rows, counted per (stage, business id), and the bodies
        (business ids of the first stage's runs) waiting in the outbox."""
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

    def inbox(self) -> Counter[tuple[str, str, str]]:
        """The inbox's rows per (listener, subscription, kind of key): ``digest`` for a
        digest of a message's content, ``id`` for an id: what a finding's report names."""
        async def read() -> Counter[tuple[str, str, str]]:
            database = self.database()
            inbox = tables.inbox.c
            try:
                async with database.session() as session:
                    rows = (await session.execute(
                        select(inbox.listener, inbox.subscription, inbox.message_id))).all()
            finally:
                await database.close()
            return Counter((listener, subscription,
                            "digest" if key.startswith("sha256:") else "id")
                           for listener, subscription, key in rows)
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

    def poll(self, condition: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
        """Ask ``condition`` until it holds, taking a database not answering yet (just
        started, resumed) as a no; fail after ``timeout``. Polled: the database and the
        brokers' queues tell only when asked."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if condition():
                    return
            except DatabaseUnavailable:
                pass
            assert time.monotonic() < deadline, f"waited {timeout} s for {what}"
            time.sleep(0.3)

    def drain(self, told: Collection[str], timeout: float = WAIT) -> None:
        """Wait until both stages ran every business id of ``told``, the second every one
        the first ran, the outbox is empty and so are the queues: nothing is under way."""
        def done() -> bool:
            rows, outbox = self.ledger()
            first = {k for s, k in rows if s == "first"}
            return set(told) <= first <= {k for s, k in rows if s == "second"} and not outbox
        self.poll(done, "both stages' effects of every message", timeout)
        self.poll(lambda: not self.left(), "the queues empty", timeout)

    def left(self) -> dict[str, list[str]]:
        """What is still stored, per ``<broker> <queue>`` that holds anything, in the stages'
        queues (the first stage's subscription queue and the second's member on each
        broker), their error queues and ``ActiveMQ.DLQ``: each message's ``mdb_id``, or a
        foreign one's body."""
        found = {}
        for name, broker in self.brokers.items():
            # The subscription's queue by the rule of docs/activemq.md; an error
            # destination not in the settings lives on the first broker (docs/configuration.md).
            queues = [f"Consumer.{APP}-first.VirtualTopic.{self.topic}.{name}",
                      f"{self.topic}.second.{name}", "ActiveMQ.DLQ"]
            if name == next(iter(self.brokers)):
                queues += [f"{self.topic}.DLQ", f"{self.topic}.second.DLQ"]
            for queue in queues:
                if stored := browse(broker, queue):
                    found[f"{name} {queue}"] = stored
        return found


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
    """Each stage's account: the first owes each ``told`` business id one row, and may have
    one of an id whose send ``raised``; the second owes one row per key of the first. Also
    the keys that break the contract (repeated, missing, extra not allowed), sorted."""
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
