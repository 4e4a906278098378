"""A streaming npstream -> npstream copy, as submitted to the standalone cluster by the tests.

    spark-submit --master spark://... copy_job.py BROKER SOURCE TARGET CHECKPOINT REPORT

Reads SOURCE from the earliest offset (20 messages per micro-batch, two
partitions each, so both executors read and stage), writes TARGET exactly
once, with Trigger.AvailableNow, and writes a JSON report: the batch ids that
ran and the query's exception. No registration call: format("npstream") is
found by Spark's discovery, on the driver and on the executors.
"""

from __future__ import annotations

import json
import sys

from pyspark.sql import SparkSession


def main() -> int:
    broker, source, target, checkpoint, report = sys.argv[1:6]
    spark = SparkSession.builder.appName("npstream-cluster-copy").getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    query = (spark.readStream.format("npstream").option("broker", broker)
             .option("stream", source).option("startingOffsets", "earliest")
             .option("maxOffsetsPerTrigger", "20").option("minPartitions", "2").load()
             .writeStream.format("npstream").option("broker", broker)
             .option("stream", target).option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    with open(report, "w") as handle:
        json.dump({"batches": [p["batchId"] for p in query.recentProgress],
                   "rows": [p["numInputRows"] for p in query.recentProgress],
                   "exception": str(query.exception()) if query.exception() else None},
                  handle)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
