"""Spark for mdb destinations: a streaming source and sink (PySpark's Python Data Source API).

* ``spark.readStream.format("mdb")``: every member of a destination, one Spark partition each,
  through the app's shared subscription, with a durable journal so a restarted query replays
  exactly what it logged (``mdb_spark.source``, ``mdb_spark.journal``, ``mdb_spark.receiver``).
* ``df.writeStream.format("mdb")`` and ``foreach_batch_sink``: rows published inside broker
  transactions with deterministic ids (``mdb_spark.sink``).

See docs/spark.md.
"""

from mdb_spark.datasource import MdbDataSource, register
from mdb_spark.journal import Journal, Record
from mdb_spark.options import SinkOptions, SourceOptions, member_key
from mdb_spark.sink import BATCH_HEADER, foreach_batch_sink, message_id
from mdb_spark.source import SCHEMA, MdbStreamReader, create_subscriptions

__all__ = [
    "BATCH_HEADER",
    "SCHEMA",
    "Journal",
    "MdbDataSource",
    "MdbStreamReader",
    "Record",
    "SinkOptions",
    "SourceOptions",
    "create_subscriptions",
    "foreach_batch_sink",
    "member_key",
    "message_id",
    "register",
]
