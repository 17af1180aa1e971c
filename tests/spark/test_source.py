"""The ``mdb`` source on real ActiveMQ and RabbitMQ brokers: every member, kill -9 of the query
and restart, kill -9 of one broker mid-stream, a member whose broker is down, two queries
sharing a subscription, messages sharing an ``mdb_id``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import anyio
import pytest
from pyarrow import parquet

import mdb_spark
from mdb.config.settings import load_settings
from mdb.messages.destinations import Destination
from mdb.messages.headers import ID
from mdb.messages.message import OutgoingMessage, labelled
from mdb.routing.producer import Producer
from mdb_spark.journal import Journal
from tests.harness.servers.activemq import free_port
from tests.harness.servers.brokers import private_brokers
from tests.spark.support import (
    broker_kind,
    publish,
    settings_json,
    source_options,
    stored,
    subscription_queue,
    wait_for,
)

pytestmark = [pytest.mark.spark, pytest.mark.activemq]

ROOT = Path(__file__).resolve().parents[2]


def _memory_rows(spark: Any, table: str) -> list[Any]:
    return list(spark.sql(f"select * from {table}").collect())


def _table(name: str, broker: Any) -> str:
    """A memory sink's name, one per broker kind: a session's query names stay distinct."""
    return f"{name}_{broker_kind(broker)}"


def _member_settings(app: str, brokers: list[Any]) -> tuple[dict[str, Any], list[str]]:
    """Settings for a topic with a member on each of ``brokers`` (broker ``b<i>``, named
    ``<app>_p<i>``: distinct even when the brokers are one RabbitMQ node), and those members'
    keys (the ``member`` column)."""
    names = [f"{app}_p{i}" for i in range(len(brokers))]
    settings = settings_json(app, [str(b.url) for b in brokers], names=names)
    return settings, [f"b{i}/topic:{name}" for i, name in enumerate(names)]


def test_every_member_is_read_once(spark: Any, stomp_trio: list[Any], tmp_path: Path) -> None:
    settings, members = _member_settings("members", stomp_trio)
    options = source_options(settings, str(tmp_path / "journal"), max_messages_per_batch="20")
    assert set(mdb_spark.create_subscriptions(options).values()) == {"created"}
    ids = publish(settings, "topic:orders", [f"order {i}" for i in range(60)])

    table = _table("every_member", stomp_trio[0])
    query = (spark.readStream.format("mdb").options(**options).load()
             .writeStream.format("memory").queryName(table)
             .option("checkpointLocation", str(tmp_path / "checkpoint")).start())
    try:
        wait_for(lambda: len(_memory_rows(spark, table)) >= len(ids), "60 rows")
        query.processAllAvailable()
    finally:
        query.stop()
    rows = _memory_rows(spark, table)
    assert sorted(r.message_id for r in rows) == sorted(ids)
    assert Counter(r.member for r in rows) == dict.fromkeys(members, 20)
    first = rows[0]
    assert first.body_string == first.body.decode()
    assert first.destination == "topic:orders"
    assert first.headers["mdb_id"] == first.message_id
    assert first.redelivered is False and first.timestamp is not None


def test_member_on_a_broker_that_is_down_does_not_stop_the_others(
        spark: Any, stomp_broker: Any, tmp_path: Path) -> None:
    refused = f"{stomp_broker.scheme}://127.0.0.1:{free_port()}"
    settings = settings_json("down", [str(stomp_broker.url), refused], names=["live", "dead"])
    options = source_options(settings, str(tmp_path / "journal"))
    outcome = mdb_spark.create_subscriptions(options)
    assert outcome["b0/topic:live"] == "created"
    assert outcome["b1/topic:dead"].startswith("failed")
    live_only = settings_json("down", [str(stomp_broker.url)], names=["live"])
    ids = publish(live_only, "topic:orders", [f"m{i}" for i in range(25)])

    table = _table("member_down", stomp_broker)
    query = (spark.readStream.format("mdb").options(**options).load()
             .writeStream.format("memory").queryName(table)
             .option("checkpointLocation", str(tmp_path / "checkpoint")).start())
    try:
        wait_for(lambda: len(_memory_rows(spark, table)) >= len(ids),
                 "the live member's 25 rows")
    finally:
        query.stop()
    rows = _memory_rows(spark, table)
    assert sorted(r.message_id for r in rows) == sorted(ids)
    assert {r.member for r in rows} == {"b0/topic:live"}


def test_a_full_journal_goes_on_once_a_batch_takes_what_it_holds(
        spark: Any, activemq: Any, tmp_path: Path) -> None:
    """Back-pressure counts the records no batch has taken yet. Counting those not yet
    committed stopped a member for good: Spark commits a batch only when it starts the next,
    and a batch that took every record the receiver could hold left nothing to start one."""
    settings = settings_json("room", [str(activemq.url)], names=["room"])
    options = source_options(settings, str(tmp_path / "journal"), prefetch="10",
                             max_journal_messages="20")
    assert set(mdb_spark.create_subscriptions(options).values()) == {"created"}
    ids = publish(settings, "topic:orders", [f"m{i}" for i in range(100)])

    query = (spark.readStream.format("mdb").options(**options).load()
             .writeStream.format("memory").queryName("full_journal")
             .option("checkpointLocation", str(tmp_path / "checkpoint")).start())
    try:
        wait_for(lambda: len(_memory_rows(spark, "full_journal")) >= len(ids),
                 "100 rows, at most 20 journaled ahead of Spark at a time")
    finally:
        query.stop()
    assert sorted(r.message_id for r in _memory_rows(spark, "full_journal")) == sorted(ids)


def _parquet_ids(spark: Any, output: Path) -> list[str]:
    if not (output / "_spark_metadata").is_dir():
        return []
    try:
        return [r.message_id for r in spark.read.parquet(str(output)).collect()]
    except Exception:  # the file sink's log may have no entry yet
        return []


def _committed_members(output: Path) -> Counter[str]:
    """Rows per member in the files of the parquet sink's committed batches, read without
    Spark, for polling: a Spark job every 0.2 s took a core from the query under test. The
    sink's log (``_spark_metadata``: ``v1``, then a JSON line per file a committed batch added)
    names them; a file the kill left from an unfinished batch is not counted."""
    paths: set[str] = set()
    for entry in (output / "_spark_metadata").glob("[0-9]*"):  # written atomically
        files = [json.loads(line) for line in entry.read_text().splitlines()[1:] if line]
        paths |= {f["path"] for f in files if f["action"] == "add"}
    return Counter(member for path in paths for member in parquet.read_table(
        unquote(urlparse(path).path), columns=["member"]).column("member").to_pylist())


def _start_query(options: dict[str, str], checkpoint: Path, output: Path,
                 log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    with log.open("ab") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.spark.query_process", json.dumps(options),
             str(checkpoint), str(output)],
            cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL the query's whole process group (the Python driver, its JVM and Spark's Python
    workers): nothing of it survives to finish a batch."""
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def test_kill_9_mid_stream_and_restart_keeps_each_message_exactly_once(
        spark: Any, stomp_trio: list[Any], tmp_path: Path) -> None:
    settings, _ = _member_settings("killed", stomp_trio)
    options = source_options(settings, str(tmp_path / "journal"), max_messages_per_batch="30",
                             prefetch="10")
    assert set(mdb_spark.create_subscriptions(options).values()) == {"created"}
    checkpoint, output, log = tmp_path / "checkpoint", tmp_path / "out", tmp_path / "query.log"
    ids = publish(settings, "topic:orders", [f"a{i}" for i in range(300)])

    process = _start_query(options, checkpoint, output, log)
    try:
        wait_for(lambda: _committed_members(output).total() >= 30 or process.poll() is not None,
                 "the first batches in parquet")
        assert process.poll() is None, log.read_text()[-3000:]
        ids += publish(settings, "topic:orders", [f"b{i}" for i in range(150)])
        _kill_group(process)
        assert len(set(_parquet_ids(spark, output))) < len(ids)  # killed mid-stream

        ids += publish(settings, "topic:orders", [f"c{i}" for i in range(150)])
        process = _start_query(options, checkpoint, output, log)
        wait_for(lambda: _committed_members(output).total() >= len(ids)
                 or process.poll() is not None, "every message in parquet")
        assert process.poll() is None, log.read_text()[-3000:]
    finally:
        if process.poll() is None:
            _kill_group(process)
    seen = Counter(_parquet_ids(spark, output))
    assert sorted(seen) == sorted(ids)
    assert set(seen.values()) == {1}, [k for k, v in seen.items() if v > 1][:10]


def _uncommitted(journal: str) -> int:
    """How many records a member's journal holds that Spark has not committed."""
    state = Journal(journal)
    return state.end - state.start


def _freeze_holding_a_window(victim: Any, journal: str, committed: Callable[[], int],
                             query: Any) -> None:
    """SIGSTOP ``victim`` while the receiver holds deliveries of it that it has not journaled
    yet, and wait until they are journaled (once Spark takes a batch) with the broker still
    frozen: their acks then wait on the hung broker.

    It is frozen once its member's journal is full (``max_journal_messages``): the receiver
    then waits for room, and the broker has pushed it the next prefetch window once it took
    the acks of what was journaled. Frozen a moment before that push, nothing more comes to
    be journaled: Spark writes all the journal holds, and the broker is let go and frozen
    again at the next full journal."""
    for _ in range(3):
        wait_for(lambda: (committed() >= 10 and _uncommitted(journal) >= 40)
                 or not query.isActive,
                 "some of the doomed broker's messages in parquet, and a full journal")
        victim.pause()
        frozen_at = Journal(journal).end
        wait_for(partial(_grown_or_written, journal, frozen_at, committed, query),
                 "messages journaled while their broker hangs, or all it journaled in parquet")
        assert query.isActive, query.exception()
        if Journal(journal).end > frozen_at:
            return
        victim.resume()
    pytest.fail("three times the receiver held nothing unjournaled when its broker froze")


def _grown_or_written(journal: str, end: int, committed: Callable[[], int], query: Any) -> bool:
    return Journal(journal).end > end or committed() >= end or not query.isActive


def test_kill_9_of_one_broker_mid_stream_the_others_flow_and_each_message_is_read_once(
        spark: Any, stomp_broker: Any, tmp_path: Path) -> None:
    """Members on two brokers: two on the session's broker and one on a private broker of the
    same kind, killed -9 while it still stores messages for the query (of its 200, the receiver
    holds at most 40 journaled ahead of Spark's batches and 10 prefetched), then restarted on
    the same port and data directory. Before the kill it is frozen (SIGSTOP) until the receiver
    journaled more of its messages: their acks wait on the hung broker and die with it, so
    they come back redelivered and must be recognised as journaled (counted again, they would
    be rows twice). While it is down the other members' messages, sent then too, reach the
    parquet sink; once it is back, every message is there exactly once and the source's queues
    on both brokers are empty (asked while the query runs, so a message taken and never acked
    would show)."""
    app = "broker_kill"
    with private_brokers(broker_kind(stomp_broker)) as [victim]:  # the session's is never killed
        settings, members = _member_settings(app, [stomp_broker, victim, stomp_broker])
        names = [member.split(":")[1] for member in members]
        # The receiver must hold on to the hung broker until it journaled more: without
        # heart-beats it would drop it after 2.5 s, and what it held would go back unjournaled.
        settings["brokers"]["b1"].update(heartbeat_ms=0, receipt_timeout=60.0)
        live = settings_json(app, [str(stomp_broker.url)] * 2, names=[names[0], names[2]])
        # At most 40 records a member journaled ahead of Spark's batches (30 rows, shared by
        # the members): the broker is frozen once its member's journal holds that many.
        options = source_options(settings, str(tmp_path / "journal"), prefetch="10",
                                 max_messages_per_batch="30", max_journal_messages="40")
        assert set(mdb_spark.create_subscriptions(options).values()) == {"created"}
        output, doomed = tmp_path / "out", str(options["journal"]) + (
            f"/{app}-pipeline/b1_topic_{names[1]}")  # the victim's member's journal
        ids = publish(settings, "topic:orders", [f"a{i}" for i in range(600)])  # 200 a member
        query = (spark.readStream.format("mdb").options(**options).load()
                 .select("message_id", "member").writeStream.format("parquet")
                 .option("path", str(output)).trigger(processingTime="200 milliseconds")
                 .option("checkpointLocation", str(tmp_path / "checkpoint")).start())
        try:
            _freeze_holding_a_window(victim, doomed,
                                     lambda: _committed_members(output)[members[1]], query)
            victim.kill()
            assert query.isActive, query.exception()
            assert _committed_members(output)[members[1]] < 200  # it still had some

            ids += publish(live, "topic:orders", [f"b{i}" for i in range(60)])
            wait_for(lambda: min(_committed_members(output)[m] for m in members[::2]) >= 230
                     or not query.isActive,
                     "the live members' messages, sent while the other broker is down")
            assert not victim.running and query.isActive, query.exception()

            victim.start()
            ids += publish(settings, "topic:orders", [f"c{i}" for i in range(60)])
            wait_for(lambda: _committed_members(output).total() >= len(ids)
                     or not query.isActive, "every message in parquet")
            queues = {broker: [subscription_queue(broker, f"{app}-pipeline", names[i])
                               for i in indexes]
                      for broker, indexes in ((stomp_broker, (0, 2)), (victim, (1,)))}
            wait_for(lambda: not any(stored(b, q) for b, q in queues.items())
                     or not query.isActive, "nothing left in the source's queues")
            assert query.isActive, query.exception()
        finally:
            query.stop()
    seen = Counter(_parquet_ids(spark, output))
    assert sorted(seen) == sorted(ids)
    assert set(seen.values()) == {1}, [k for k, v in seen.items() if v > 1][:10]
    assert _committed_members(output) == {members[0]: 250, members[1]: 220, members[2]: 250}


def test_distinct_messages_sharing_an_mdb_id_are_all_read(
        spark: Any, stomp_broker: Any, tmp_path: Path) -> None:
    """A foreign or careless producer reuses an ``mdb_id``: each message is still a row. Only a
    redelivery of a journaled message (same id, same body, flagged redelivered) is a repeat."""
    settings = settings_json("shared_ids", [str(stomp_broker.url)], names=["dups"])
    options = source_options(settings, str(tmp_path / "journal"))
    assert set(mdb_spark.create_subscriptions(options).values()) == {"created"}
    bodies = [b"first", b"second", b"second", b"third"]

    async def send_all() -> None:
        async with Producer(load_settings(None, **settings)) as producer:
            for body in bodies:
                message = OutgoingMessage(body, {**labelled({}, "text/plain"), ID: "reused"})
                await producer.send_message(Destination.parse("topic:orders"), message)

    anyio.run(send_all)
    table = _table("shared_ids", stomp_broker)
    query = (spark.readStream.format("mdb").options(**options).load()
             .writeStream.format("memory").queryName(table)
             .option("checkpointLocation", str(tmp_path / "checkpoint")).start())
    try:
        wait_for(lambda: len(_memory_rows(spark, table)) >= len(bodies),
                 "a row for each of the 4 messages")
        query.processAllAvailable()
    finally:
        query.stop()
    rows = _memory_rows(spark, table)
    assert sorted(bytes(r.body) for r in rows) == sorted(bodies)
    assert {r.message_id for r in rows} == {"reused"}


def test_two_queries_of_one_app_split_the_messages_and_another_app_gets_its_own_copy(
        spark: Any, stomp_trio: list[Any], tmp_path: Path) -> None:
    """Scale-out: queries with the same app and name share the subscription (each with its
    own journal) and split the messages, none lost or doubled; another app reads them all."""
    settings, _ = _member_settings("scaled", stomp_trio)
    other = {**settings, "app": "audit"}
    shared = [source_options(settings, str(tmp_path / f"journal{i}"), prefetch="5")
              for i in range(2)]
    audit = source_options(other, str(tmp_path / "journal-audit"))
    for options in (shared[0], audit):
        assert set(mdb_spark.create_subscriptions(options).values()) == {"created"}
    tables = [_table(t, stomp_trio[0]) for t in ("scaled_a", "scaled_b", "audit")]
    queries = [spark.readStream.format("mdb").options(**options).load()
               .writeStream.format("memory").queryName(table)
               .option("checkpointLocation", str(tmp_path / f"checkpoint-{table}")).start()
               for options, table in zip([*shared, audit], tables, strict=True)]
    try:
        # A query's receiver subscribes when the query first asks for offsets: both must be
        # consumers of the shared subscription before the broker hands messages out.
        wait_for(lambda: all(q.recentProgress for q in queries), "every query's first trigger")
        ids = publish(settings, "topic:orders", [f"s{i}" for i in range(300)])
        wait_for(lambda: sum(len(_memory_rows(spark, t)) for t in tables[:2]) >= len(ids)
                 and len(_memory_rows(spark, tables[2])) >= len(ids), "every message read")
        for query in queries:
            query.processAllAvailable()
    finally:
        for query in queries:
            query.stop()
    first, second = ([r.message_id for r in _memory_rows(spark, t)] for t in tables[:2])
    assert sorted(first + second) == sorted(ids)  # split: none lost, none doubled
    assert first and second
    assert sorted(r.message_id for r in _memory_rows(spark, tables[2])) == sorted(ids)
