"""A streaming query in its own process, for the kill -9 test: the mdb source → parquet.

    python -m tests.spark.query_process OPTIONS_JSON CHECKPOINT OUTPUT

Prints ``started`` once the query runs; runs until killed.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    options, checkpoint, output = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import mdb_spark

    spark = (SparkSession.builder.master("local[2]").appName("mdb-spark-kill")
             .config("spark.ui.enabled", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    mdb_spark.register(spark)
    frame = spark.readStream.format("mdb").options(**options).load()
    query = (frame.select("message_id", "body_string", "member", "redelivered")
             .writeStream.format("parquet").option("path", output)
             .option("checkpointLocation", checkpoint).trigger(processingTime="200 milliseconds")
             .start())
    print("started", flush=True)
    query.awaitTermination()


if __name__ == "__main__":
    main()
