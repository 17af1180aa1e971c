"""The ``mdb`` format for Spark: ``spark.dataSource.register(MdbDataSource)`` (or
``mdb_spark.register(spark)``), then ``spark.readStream.format("mdb")`` and
``df.writeStream.format("mdb")``."""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import DataSource

from mdb_spark.sink import MdbStreamWriter
from mdb_spark.source import SCHEMA, MdbStreamReader


class MdbDataSource(DataSource):  # type: ignore[misc]
    """Reads a destination (every member) as a stream; writes a stream to a destination."""

    @classmethod
    def name(cls) -> str:
        return "mdb"

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: Any) -> MdbStreamReader:
        return MdbStreamReader(dict(self.options))

    def streamWriter(self, schema: Any, overwrite: bool) -> MdbStreamWriter:
        return MdbStreamWriter(dict(self.options))


def register(spark: Any) -> None:
    """Make ``format("mdb")`` available in ``spark`` (a SparkSession)."""
    spark.dataSource.register(MdbDataSource)
