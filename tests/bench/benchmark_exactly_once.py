"""Benchmark: exactly-once listeners against the same work done at least once, one run.

    .venv/bin/python -m tests.bench.benchmark_exactly_once [--messages 2000] [--database URL]
        [--postgresql] [--batch 20] [--runs 3]
    .venv/bin/python -m tests.bench.benchmark_exactly_once --profile [--messages 200]
        [--batch 20]
    .venv/bin/python -m tests.bench.benchmark_exactly_once --phases [--postgresql]

The database is SQLite in a temporary folder unless ``--database`` names another (a SQLAlchemy
async URL such as ``postgresql+asyncpg://user:pw@host/db``; the hand-written loop reaches it
with SQLAlchemy's default synchronous driver of that database, psycopg (3) for PostgreSQL,
PyMySQL for MariaDB/MySQL, or ``--sync-database URL``); ``--postgresql`` starts a private
PostgreSQL server (``tests.harness.servers.postgresql``) and uses a database of its own. Its tables
are made first, as ``mdb db upgrade`` would. Prints a table, with the consumer's CPU per message
(user + system time of this process, the broker's and the database's excluded):

* E1, on a private ActiveMQ: a handler that inserts one row and sends one message. mdb with
  ``exactly_once`` (pool 1 and 4; ``max_messages_per_transaction`` 1 and ``--batch``) against
  a hand-written at-least-once stomp.py loop doing the same work per message: a database
  transaction with the insert, SEND, COMMIT, ACK; and against a hand-written exactly-once
  loop, the least stomp.py and SQLAlchemy code that keeps the promises of docs/exactly-once.md
  (the inbox claim first, the outbox row, the SEND's receipt before the ACK): what any
  consumer with those promises pays on this machine. With ``--runs 3``, each run measures
  both loops and every mdb row again, and the table shows each row's median (of the rate, the
  CPU, and the ratios to the run's own loops); E2 is then left out;
* E2, on the memory broker: the cost of exactly-once: that handler with ``exactly_once``
  against the same handler without it (its insert in a transaction of its own, its send in
  the broker transaction).

``--phases`` times where one message's wall-clock time goes, E1 at pool 1, one message per
transaction: the median of each step of a delivery's run (from the run's start to the inbox
claim, the claim, the handler, the outbox statement with the delete of rows sent before,
the commit, the dispatch, the ack, and from the ack to the next run's start), each step's end
and start taken where the guard calls it.

``--profile`` measures nothing by the clock: it runs E2's handler's work one message after
another under cProfile, through the exactly-once guard (one message per transaction, and
``--batch`` per transaction) and without it, and prints the Python calls per message on the
event loop's thread (the database driver's own thread is not counted) and the statements per
message sent to the database (BEGIN and COMMIT included: on PostgreSQL each is a round trip),
which do not depend on the machine's load.

Not a test: CI never times anything.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import hashlib
import os
import pstats
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import stomp
from sqlalchemy import Column, LargeBinary, MetaData, String, Table, create_engine, event
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.ext.asyncio import AsyncSession

from mdb import Container, Context, listener
from mdb.config.broker_settings import BrokerSettings
from mdb.config.database_settings import DatabaseSettings
from mdb.config.settings import Settings
from mdb.exactly_once import guard as guard_module
from mdb.exactly_once import inbox, tables
from mdb.exactly_once.database.database import Database
from mdb.exactly_once.guard import Guard
from mdb.exactly_once.outbox.dispatcher import Dispatcher
from mdb.exactly_once.outbox.writer import Writer
from mdb.exactly_once.store import Store
from mdb.listeners.context import SendFunction
from mdb.listeners.listener import ListenerSpec, spec_of
from mdb.messages.destinations import Destination
from mdb.messages.headers import ID
from mdb.messages.message import Message, OutgoingMessage
from mdb.routing.producer import Producer
from mdb_stomp.connection import StompConnection
from tests.bench.loops import Measured, consume, print_table, queue_of
from tests.harness.servers.activemq import ActiveMQ
from tests.harness.servers.postgresql import PostgreSQL

user_tables = MetaData()
rows = Table("bench_rows", user_tables, Column("id", String(200), primary_key=True),
             Column("body", LargeBinary, nullable=False))


def handler(queue: str, pool: int, exactly_once: bool, database: Database,
            batch: int = 1) -> ListenerSpec:
    """E1's and E2's handler: insert one row, send one message."""
    out = f"queue:{queue}.out"
    if exactly_once:
        @listener(f"queue:{queue}", pool=pool, exactly_once="main", name="bench",
                  max_messages_per_transaction=batch)
        async def guarded(body: bytes, ctx: Context, session: AsyncSession) -> None:
            await session.execute(rows.insert().values(id=ctx.id, body=body))
            await ctx.send(out, body)
        spec = spec_of(guarded)
    else:
        @listener(f"queue:{queue}", pool=pool, name="bench")
        async def plain(body: bytes, ctx: Context) -> None:
            async with database.session() as session:
                await session.execute(rows.insert().values(id=ctx.id, body=body))
            await ctx.send(out, body)
        spec = spec_of(plain)
    assert spec is not None
    return spec


async def made(url: str) -> None:
    """mdb's tables (``mdb db upgrade``) and the benchmark's, emptied."""
    database = Database("main", DatabaseSettings(url=url))
    try:
        await tables.upgrade(database.engine)
        async with database.engine.begin() as connection:
            for table in (tables.inbox, tables.outbox):
                await connection.execute(table.delete())
            await connection.run_sync(user_tables.drop_all)
            await connection.run_sync(user_tables.create_all)
    finally:
        await database.close()


async def container_rate(broker_url: str, database_url: str, queue: str, count: int,
                         pool: int, exactly_once: bool, preload_memory: bool = False,
                         batch: int = 1) -> Measured:
    """``count`` messages of ``queue`` (preloaded, or sent here on a memory broker) through
    the handler in a container."""
    settings = Settings(app="bench", server="s1", brokers={"default": BrokerSettings(
        url=broker_url)}, databases={"main": DatabaseSettings(url=database_url)})
    database = Database("main", settings.databases["main"])
    container = Container(settings, [handler(queue, pool, exactly_once, database, batch)])
    try:
        if preload_memory:
            async with Producer(settings) as producer:
                for n in range(count):
                    await producer.send(f"queue:{queue}", f"message {n}")
        async with anyio.create_task_group() as tg:
            await tg.start(container.run)
            stats = container.deployed[0].stats
            start, cpu = time.perf_counter(), time.process_time()
            while stats.processed < count:
                await anyio.sleep(0.01)
            elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
            container.request_stop()
    finally:
        await database.close()
    return count / elapsed, cpu / count * 1e6


def sync_url(url: str) -> str:
    """The synchronous driver's URL of the same database, for the hand-written loop:
    SQLAlchemy's default driver, PyMySQL for MariaDB/MySQL (its default, mysqlclient, is
    built from source against the client library's headers)."""
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    driver = f"{backend}+pymysql" if backend in ("mysql", "mariadb") else backend
    return parsed.set(drivername=driver).render_as_string(hide_password=False)


def hand_written(broker: ActiveMQ, queue: str, count: int, database_url: str) -> Measured:
    """What a user writes with stomp.py and SQLAlchemy alone, at least once: per message on
    the receiver thread, a database transaction with the insert and the SEND, its COMMIT,
    then the ACK (a crash between the two repeats both: no inbox). TCP_NODELAY, no receipt
    waited for (the most favourable baseline); SQLite with mdb's pragmas (WAL, FULL sync)."""
    engine = loop_engine(database_url)

    def handle(conn: stomp.Connection12, frame: stomp.utils.Frame) -> bool:
        with engine.begin() as db:
            db.execute(rows.insert().values(id=frame.headers["message-id"],
                                            body=frame.body.encode()))
            conn.send(f"/queue/{queue}.out", frame.body, headers={"persistent": "true"})
        conn.ack(frame.headers["ack"])
        return True

    try:
        return consume(broker, queue, count, handle)
    finally:
        engine.dispose()


def hand_written_exactly_once(broker: ActiveMQ, queue: str, count: int, database_url: str,
                              ) -> Measured:
    """The least a hand-written stomp.py and SQLAlchemy consumer does for what an exactly-once
    listener promises (docs/exactly-once.md), on mdb's tables: per message on the receiver
    thread, one database transaction with the inbox claim first (a copy waits on its key),
    the insert, the delete of the outbox row sent before, the outbox row; COMMIT; the SEND
    with a receipt; the ACK once the receipt came. No tracing, no timeouts, no leases kept,
    no error paths: a floor for the same round trips, not a consumer to run."""
    engine = loop_engine(database_url)
    backend = engine.dialect.name
    claim = (postgresql.insert(tables.inbox).on_conflict_do_nothing() if backend == "postgresql"
             else sqlite.insert(tables.inbox).on_conflict_do_nothing() if backend == "sqlite"
             else tables.inbox.insert().prefix_with("IGNORE"))
    outbox = tables.outbox
    sent: list[int] = []  # the outbox row whose SEND's receipt came
    awaiting: tuple[str, int] = ("", 0)  # the ack id and outbox row awaiting the receipt

    def handle(conn: stomp.Connection12, frame: stomp.utils.Frame) -> bool:
        nonlocal awaiting
        message_id, body, now = frame.headers["message-id"], frame.body.encode(), time.time()
        with engine.begin() as db:
            claimed = db.execute(claim.values(
                listener="bench", subscription=queue, message_id=message_id,
                digest=hashlib.sha256(body).hexdigest(), processed_at=now)).rowcount
            if claimed:
                db.execute(rows.insert().values(id=message_id, body=body))
                if sent:
                    db.execute(outbox.delete().where(outbox.c.seq.in_(sent)))
                seq = db.execute(outbox.insert().values(
                    message_id=message_id, body=body, headers="{}", error_destination="DLQ",
                    created_at=now, lease_until=now + 60, attempts=0,
                ).returning(outbox.c.seq)).scalar_one()
        if not claimed:  # a copy: acked (its row was sent before it was first acked)
            conn.ack(frame.headers["ack"])
            return True
        awaiting = (frame.headers["ack"], seq)
        conn.send(f"/queue/{queue}.out", frame.body, headers={"persistent": "true",
                                                              "receipt": "s"})
        return False

    def receipt(conn: stomp.Connection12, _frame: stomp.utils.Frame) -> bool:
        conn.ack(awaiting[0])
        sent[:] = [awaiting[1]]
        return True

    try:
        return consume(broker, queue, count, handle, receipt)
    finally:
        engine.dispose()


def loop_engine(database_url: str) -> Engine:
    """The hand-written loops' engine: on SQLite with mdb's pragmas (WAL, FULL sync)."""
    engine = create_engine(database_url)
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", sqlite_pragmas)
    return engine


def sqlite_pragmas(connection: Any, _record: Any) -> None:
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=FULL")
    cursor.close()


async def calls_per_message(database_url: str, count: int, exactly_once: bool, batch: int = 1,
                            ) -> tuple[float, float, str]:
    """Python calls and database statements (BEGIN and COMMIT included) per message of the
    handler's work, one message (or ``batch``) after another in one task: through the guard
    (the deletes of the rows dispatched before, the inbox claim, the insert and the outbox
    row, the commit, the dispatch), or without it (a transaction with the insert, then a send
    through the producer); and the most called functions."""
    settings = Settings(brokers={"default": BrokerSettings(
        url=f"memory://calls-{uuid.uuid4().hex[:6]}")},
        databases={"main": DatabaseSettings(url=database_url)})
    database = Database("main", settings.databases["main"])
    out = Destination.parse("queue:calls.out")
    statements, counting = 0, False

    def counted(*_: object) -> None:
        nonlocal statements
        statements += counting

    engine = database.engine.sync_engine
    event.listen(engine, "before_cursor_execute", counted)
    if engine.dialect.name == "postgresql":  # BEGIN and COMMIT as they reach the server
        event.listen(engine, "connect", lambda connection, _: (
            connection.driver_connection.add_query_logger(counted)))
    else:
        for name in ("begin", "commit"):
            event.listen(engine, name, counted)
    profile = cProfile.Profile()
    async with Producer(settings) as producer:
        guard = Store(database, producer, "calls").guard(
            listener="calls", subscription="calls", broker="default",
            error_destination=Destination.parse("queue:calls.DLQ"))

        def message(n: int) -> Message:
            return Message(f"m-{n}", Destination.parse("queue:calls"), b"body", {},
                           redelivered=False, delivery_count=1)

        async def work(session: AsyncSession, send: SendFunction, n: int) -> None:
            await session.execute(rows.insert().values(id=f"m-{n}", body=b"body"))
            await send(out, OutgoingMessage(b"body", {ID: f"m-{n}"}), None)

        async def some(first: int) -> None:
            if exactly_once and batch > 1:
                await guard.run_all(
                    [message(n) for n in range(first, first + batch)],
                    lambda index, session, send: work(session, send, first + index),
                    at=time.time())
            elif exactly_once:
                await guard.run(message(first), lambda session, send: work(session, send, first),
                                at=time.time())
            else:
                async with database.session() as session:
                    await session.execute(rows.insert().values(id=f"m-{first}", body=b"body"))
                await producer.send_message(out, OutgoingMessage(b"body", {ID: f"m-{first}"}))

        step = batch if exactly_once else 1
        for n in range(0, 20 * step, step):  # warm: connections made, statements cached
            await some(n)
        counting = True
        profile.enable()
        for n in range(20 * step, 20 * step + count, step):
            await some(n)
        profile.disable()
        await anyio.sleep(0.1)  # asyncpg tells its query loggers soon, not at once
        counting = False
    await database.close()
    stats = pstats.Stats(profile)
    total: int = stats.total_calls  # type: ignore[attr-defined]
    entries = stats.stats  # type: ignore[attr-defined]
    heaviest = [f"  {calls / count:8.1f}  {Path(path).name}:{line} {name}"
                for (path, line, name), (_, calls, _, _, _) in sorted(
                    entries.items(), key=lambda item: -item[1][1])[:12]]
    return total / count, statements / count, "\n".join(heaviest)


STEPS = (("run>", "claim>", "the run's start to the inbox claim (a session)"),
         ("claim>", "claim<", "the inbox claim (BEGIN, the claim)"),
         ("handler>", "handler<", "the handler (its insert)"),
         ("write>", "write<", "the outbox statement (the delete of the rows sent before in it "
                              "on PostgreSQL, a statement before it elsewhere)"),
         ("write<", "dispatch>", "the commit"),
         ("dispatch>", "dispatch<", "the dispatch (SEND, its receipt)"),
         ("ack>", "ack<", "the ack (written, not confirmed)"),
         ("ack<", "run>", "the ack to the next run's start (the broker's next delivery)"))


def phases(url: str, count: int) -> list[tuple[str, float]]:
    """The median microseconds of each of ``STEPS`` per message, and of a whole message: E1
    at pool 1, one message per transaction, the guard's steps wrapped with timers (the first
    50 messages left out: connections made, statements cached)."""
    marks: dict[str, list[float]] = {}
    wrapped: list[tuple[object, str, Any]] = []

    def timed(owner: object, name: str, step: str) -> None:
        original = getattr(owner, name)

        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            marks.setdefault(f"{step}>", []).append(time.perf_counter())
            try:
                return await original(*args, **kwargs)
            finally:
                marks.setdefault(f"{step}<", []).append(time.perf_counter())
        wrapped.append((owner, name, original))
        setattr(owner, name, wrapper)

    timed(Guard, "run_all", "run")
    timed(inbox, "claim_all", "claim")
    timed(guard_module, "_handled", "handler")
    timed(Writer, "write", "write")
    timed(Dispatcher, "dispatch", "dispatch")
    timed(StompConnection, "ack", "ack")
    try:
        with ActiveMQ(heap_mb=1024) as broker:
            anyio.run(made, url)
            anyio.run(container_rate, broker.url, url, queue_of(broker, "phases", count),
                      count, 1, True, False, 1)
    finally:
        for owner, name, original in wrapped:
            setattr(owner, name, original)

    def median(first: str, then: str) -> float:
        # The next run's start follows this message's ack: one place further on.
        later = marks[then][1:] if then == "run>" else marks[then]
        spans = [b - a for a, b in zip(marks[first][50:], later[50:], strict=False)]
        return statistics.median(spans) * 1e6

    return [*((what, median(first, then)) for first, then, what in STEPS),
            ("a message, run to run", median("run>", "run>"))]


Ratios = tuple[float, ...]
"""A row's rate over the hand-written loop's, then over the hand-written exactly-once loop's."""


def e1(broker: ActiveMQ, url: str, sync: str, n: int, batch: int,
       ) -> list[tuple[str, Measured, Ratios]]:
    """One run of E1: the hand-written loop, the hand-written exactly-once loop, then mdb at
    pool 1 and 4, one message and ``batch`` per transaction; each row with its ``Ratios``."""
    run: Callable[..., Measured] = anyio.run
    anyio.run(made, url)
    hand = hand_written(broker, queue_of(broker, "e1h", n), n, sync)
    anyio.run(made, url)
    floor = hand_written_exactly_once(broker, queue_of(broker, "e1f", n), n, sync)
    found: list[tuple[str, Measured, Ratios]] = [
        ("hand-written: DB BEGIN/INSERT, SEND, DB COMMIT, ACK", hand, ()),
        ("hand-written exactly-once: DB BEGIN/claim/INSERT/DELETE/outbox row, DB COMMIT, "
         "SEND, its receipt, ACK", floor, (floor[0] / hand[0],))]
    for pool in (1, 4):
        for size in (1, batch):
            anyio.run(made, url)
            rate = run(container_rate, broker.url, url, queue_of(broker, f"e1m{pool}b{size}", n),
                       n, pool, True, False, size)
            found.append((f"mdb pool={pool}, exactly_once, max_messages_per_transaction={size}",
                          rate, (rate[0] / hand[0], rate[0] / floor[0])))
    return found


def medians(runs: list[list[tuple[str, Measured, Ratios]]],
            ) -> list[tuple[str, Measured, Ratios]]:
    """Each row's median rate, CPU and ratios over ``runs`` (the same rows in each)."""
    rows = []
    for index, (name, _, ratios) in enumerate(runs[0]):
        rates = [r[index][1][0] for r in runs]
        cpus = [r[index][1][1] for r in runs]
        rows.append((name, (statistics.median(rates), statistics.median(cpus)), tuple(
            statistics.median(r[index][2][which] for r in runs)
            for which in range(len(ratios)))))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--database", help="a SQLAlchemy async URL (default: SQLite)")
    parser.add_argument("--sync-database", help="the hand-written loop's URL of it")
    parser.add_argument("--postgresql", action="store_true",
                        help="a private PostgreSQL server's database"
                             " (tests.harness.servers.postgresql)")
    parser.add_argument("--batch", type=int, default=20,
                        help="max_messages_per_transaction of the batched rows")
    parser.add_argument("--runs", type=int, default=1, help="runs of E1; medians shown")
    parser.add_argument("--profile", action="store_true",
                        help="print Python calls per message instead of timing")
    parser.add_argument("--phases", action="store_true",
                        help="print where one message's time goes at pool 1 instead")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        folder = stack.enter_context(tempfile.TemporaryDirectory())
        url = args.database or f"sqlite+aiosqlite:///{folder}/bench.sqlite3"
        if args.postgresql:
            url = stack.enter_context(PostgreSQL()).create_database("bench")
        measure(args, url)


def measure(args: argparse.Namespace, url: str) -> None:
    n = args.messages
    if args.profile:
        for exactly_once, batch in ((False, 1), (True, 1), (True, args.batch)):
            anyio.run(made, url)
            calls, statements, heaviest = anyio.run(calls_per_message, url, n, exactly_once,
                                                    batch)
            what = (f"exactly_once, {batch} per transaction" if exactly_once
                    else "without exactly_once")
            print(f"{what}: {calls:,.0f} calls and {statements:.2f} statements (BEGIN and "
                  f"COMMIT included) per message; the most called:\n{heaviest}")
        return
    if args.phases:
        print(f"{make_url(url).get_backend_name()} database, ActiveMQ, {n} messages, pool 1, "
              "one message per transaction: median microseconds per message")
        for what, micros in phases(url, n):
            print(f"| {what} | {micros:,.0f} |")
        return
    measured: list[tuple[str, str, Measured, str]] = []
    run: Callable[..., Measured] = anyio.run
    if args.runs == 1:
        e2 = "E2 memory broker: insert 1 row, send 1 message"
        run(made, url)
        plain = run(container_rate, f"memory://{uuid.uuid4().hex[:6]}", url, "e2p", n, 1,
                    False, True)
        measured.append((e2, "mdb pool=1, without exactly_once", plain, ""))
        run(made, url)
        guarded = run(container_rate, f"memory://{uuid.uuid4().hex[:6]}", url, "e2g", n, 1,
                      True, True)
        measured.append((e2, "mdb pool=1, exactly_once", guarded,
                         f"{guarded[0] / plain[0]:.2f}x the rate, {guarded[1] / plain[1]:.2f}x "
                         "the CPU"))
    with ActiveMQ(heap_mb=1024) as broker:
        sync = args.sync_database or sync_url(url)
        runs = [e1(broker, url, sync, n, args.batch) for _ in range(args.runs)]
    title = ("E1 ActiveMQ: insert 1 row, send 1 message" if args.runs == 1 else
             f"E1 ActiveMQ: insert 1 row, send 1 message (medians of {args.runs} runs)")
    for name, rate, ratios in medians(runs):
        measured.append((title, name, rate, ", ".join(
            f"{ratio:.2f}x {what}" for ratio, what in zip(ratios, (
                "the rate of the hand-written loop", "the hand-written exactly-once loop's"),
                strict=False)) or "baseline"))
    print()
    print(f"{make_url(url).get_backend_name()} database, {n} messages per run, "
          f"stomp.py {stomp.__version__}, {os.cpu_count()} cores shared with the broker, "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end")
    print_table(measured)


if __name__ == "__main__":
    main()
