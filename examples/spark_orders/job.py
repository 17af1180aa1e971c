"""The Spark job: orders from every member of ``topic:orders`` → per-region totals over
one-minute event-time windows (watermark 30 s) → parquet, and each total published to
``queue:region_totals``. Runs unchanged with ``spark-submit`` on a cluster when ``journal``
and ``output`` are URLs every node reaches (``s3://…``, ``hdfs://…``)."""

from __future__ import annotations

import argparse
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import mdb_spark


def start(spark: Any, *, config: str, journal: str, output: str, checkpoint: str) -> Any:
    """Start the streaming query; return it."""
    mdb_spark.register(spark)
    orders = (spark.readStream.format("mdb")
              .option("config", config).option("destination", "topic:orders")
              .option("name", "totals").option("journal", journal)
              .option("max_messages_per_batch", "500").load())
    parsed = orders.select(F.from_json("body_string", "id string, region string, amount double, "
                                       "event_time timestamp").alias("o")).select("o.*")
    totals = (parsed.withWatermark("event_time", "30 seconds")
              .groupBy(F.window("event_time", "1 minute"), "region")
              .agg(F.count("*").alias("orders"), F.round(F.sum("amount"), 2).alias("amount")))
    publish = mdb_spark.foreach_batch_sink("queue:region_totals", config=config, query="totals")

    def write(batch: Any, batch_id: int) -> None:
        flat = batch.select("region", F.col("window.start").cast("string").alias("start"),
                            F.col("window.end").cast("string").alias("end"), "orders", "amount")
        # One folder per batch, overwritten: a batch Spark replays after a crash replaces its
        # own rows instead of adding them again (exactly once in the parquet table).
        flat.write.mode("overwrite").parquet(f"{output.rstrip('/')}/batch={batch_id}")
        publish(flat.select(F.to_json(F.struct("*")).alias("body"),
                            F.col("region").alias("key")), batch_id)

    return (totals.writeStream.outputMode("append").foreachBatch(write)
            .option("checkpointLocation", checkpoint).trigger(processingTime="1 second").start())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", required=True)
    parser.add_argument("--journal", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--checkpoint", required=True)
    args = parser.parse_args()
    spark = SparkSession.builder.appName("spark_orders").getOrCreate()
    start(spark, config=args.config, journal=args.journal, output=args.output,
          checkpoint=args.checkpoint).awaitTermination()


if __name__ == "__main__":
    main()
