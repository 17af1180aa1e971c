"""The streaming source: ``spark.readStream.format("mdb")``.

Where each part runs (PySpark's Python Data Source API):

* ``initialOffset``, ``latestOffset``, ``partitions``, ``commit``, ``stop``: Spark's long-lived
  driver-side Python process. The first call starts the ``Receiver`` there, which fills one
  journal per member; offsets are ``{member key: journal position}``.
* ``read(partition)``: executor workers, on an unpickled copy of this object. It only reads the
  journal (one Spark partition per member), never the broker, so a replay after a restart reads
  exactly the logged range. Nothing holding a connection is ever pickled.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows

from mdb.messages.destinations import Destination
from mdb_spark.journal import Journal
from mdb_spark.options import SourceOptions, member_key
from mdb_spark.receiver import Receiver
from mdb_spark.receiver import create_subscriptions as _create

log = logging.getLogger("mdb_spark")

SCHEMA = (
    "body binary, body_string string, headers map<string,string>, message_id string, "
    "destination string, member string, redelivered boolean, timestamp timestamp"
)
_COLUMNS = [column.split()[0] for column in SCHEMA.split(", ")]


@dataclass(frozen=True)
class MemberRange(InputPartition):  # type: ignore[misc]
    """One Spark partition: positions ``[start, end)`` of one member's journal."""

    member: str
    destination: str
    journal: str
    start: int
    end: int


class MdbStreamReader(DataSourceStreamReader):  # type: ignore[misc]
    def __init__(self, options: dict[str, str]) -> None:
        self._source = SourceOptions.parse(options)
        self._receiver: Receiver | None = None
        self._journals: dict[str, Journal] = {}

    def __getstate__(self) -> dict[str, Any]:
        # Executors get the options only: the receiver and its connections stay here.
        return {"_source": self._source, "_receiver": None, "_journals": {}}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def _started(self) -> Receiver:
        if self._receiver is None:
            settings = self._source.connect.settings()
            members = {member_key(m): m for m in
                       settings.topology().members(Destination.parse(self._source.destination))}
            self._journals = {key: Journal(self._source.journal_url(settings, m))
                              for key, m in members.items()}
            self._receiver = Receiver(
                settings, members, self._journals,
                subscription=self._source.subscription(settings),
                prefetch=self._source.prefetch,
                max_journal_messages=self._source.max_journal_messages)
            self._receiver.start()
            log.info("mdb_spark source on %s: members %s, journal %s",
                     self._source.destination, ", ".join(members), self._source.journal)
        return self._receiver

    def initialOffset(self) -> dict[str, int]:
        self._started()
        return {key: journal.start for key, journal in self._journals.items()}

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self._source.max_messages_per_batch
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        ends = self._started().ends()
        begin = {key: int(start.get(key, self._journals[key].start)) for key in ends}
        available = {key: max(0, ends[key] - begin[key]) for key in ends}
        if isinstance(limit, ReadMaxRows):
            available = _share(available, int(limit.max_rows))
        latest = {key: begin[key] + available[key] for key in ends}
        for key, position in start.items():  # a member gone from the topology keeps its place
            latest.setdefault(key, int(position))
        return latest

    def reportLatestOffset(self) -> dict[str, int] | None:
        return self._started().ends() if self._receiver else None

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[MemberRange]:
        self._started().taken(end)
        ranges = []
        for key, journal in self._journals.items():
            first, last = int(start.get(key, journal.start)), int(end.get(key, 0))
            if last > first:
                ranges.append(MemberRange(key, self._source.destination, journal.url, first,
                                          last))
        return ranges

    def read(self, partition: MemberRange) -> Iterator[Any]:
        """The range as one Arrow batch: Spark takes it without converting row by row (the
        executors' Python was the pipeline's limit, docs/spark.md)."""
        records = list(Journal(partition.journal).read(partition.start, partition.end))
        if not records:
            return
        texts: list[str | None] = []
        for record in records:
            try:
                texts.append(record.body.decode())
            except UnicodeDecodeError:
                texts.append(None)
        yield pa.RecordBatch.from_arrays([
            pa.array([r.body for r in records], pa.binary()),
            pa.array(texts, pa.string()),
            pa.array([list(r.headers.items()) for r in records],
                     pa.map_(pa.string(), pa.string())),
            pa.array([r.message_id for r in records], pa.string()),
            pa.array([partition.destination] * len(records), pa.string()),
            pa.array([partition.member] * len(records), pa.string()),
            pa.array([r.redelivered for r in records], pa.bool_()),
            pa.array([r.timestamp_ms * 1000 for r in records], pa.timestamp("us", tz="UTC")),
        ], names=_COLUMNS)

    def commit(self, end: dict[str, int]) -> None:
        self._started()
        for key, position in end.items():
            journal = self._journals.get(key)
            if journal is not None:
                journal.trim(int(position))

    def stop(self) -> None:
        if self._receiver is not None:
            self._receiver.stop()
            self._receiver = None


def _share(available: dict[str, int], budget: int) -> dict[str, int]:
    """Split ``budget`` rows over the members fairly (water-filling), never more than each
    member has."""
    taken = dict.fromkeys(available, 0)
    left = sorted(available, key=lambda k: available[k])
    while left and budget > 0:
        share = max(1, budget // len(left))
        key = left.pop(0)
        take = min(available[key], share, budget)
        taken[key] = take
        budget -= take
    return taken


def create_subscriptions(options: dict[str, str]) -> dict[str, str]:
    """Create the shared subscription a source with these ``options`` reads, on every member,
    before anything is published (a topic keeps nothing for a subscription not yet made).
    Returns ``{member key: "created" | "failed: …"}``."""
    source = SourceOptions.parse(options)
    settings = source.connect.settings()
    members = {member_key(m): m for m in
               settings.topology().members(Destination.parse(source.destination))}
    return _create(settings, members, source.subscription(settings))
