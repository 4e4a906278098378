"""Audit trail replay: re-run a report over a time range of the log after a bug fix.

Publishes two rounds of audit events, remembers the time between them, then
replays only the second round with a Spark batch read bounded by
`startingTimestamp` / `endingTimestamp`, and shows the report per action.
Time seeks are a binary search on the broker, so replaying a day out of a
month reads only that day.

    spark-submit examples/audit_replay/audit_replay.py --broker localhost:7070
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import time
import uuid

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from npstream import Client

AUDIT_SCHEMA = "actor STRING, action STRING, resource STRING"


def publish_round(client: Client, stream: str, actions: list[str], actor: str) -> None:
    client.publish_batch(stream, [
        {"value": {"actor": actor, "action": a, "resource": f"doc-{i}"}}
        for i, a in enumerate(actions)
    ])


def report(spark: SparkSession, broker: str, stream: str, start: str, end: str) -> DataFrame:
    raw = (spark.read.format("npstream").option("broker", broker).option("stream", stream)
           .option("startingTimestamp", start).option("endingTimestamp", end).load())
    events = raw.select("offset", "timestamp",
                        F.from_json(F.col("value").cast("string"), AUDIT_SCHEMA).alias("a"))
    return events.groupBy("a.action").agg(F.count("*").alias("events")).orderBy("action")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--broker", default=os.environ.get("NPSTREAM_BROKER", "localhost:7070"))
    p.add_argument("--stream", default=f"audit-{uuid.uuid4().hex[:6]}")
    args = p.parse_args(argv)
    with Client(args.broker) as client:
        client.create_stream(args.stream, exist_ok=True)
        publish_round(client, args.stream, ["login", "read", "read", "logout"], "alice")
        time.sleep(0.05)
        since = dt.datetime.now(dt.UTC)
        time.sleep(0.05)
        publish_round(client, args.stream, ["login", "delete", "delete", "delete"], "mallory")
        time.sleep(0.05)
        until = dt.datetime.now(dt.UTC)
    spark = SparkSession.builder.appName("npstream-audit-replay").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    try:
        print(f"replaying {args.stream} from {since.isoformat()} to {until.isoformat()}")
        for row in report(spark, args.broker, args.stream, since.isoformat(),
                          until.isoformat()).collect():
            print(f"{row['action']}: {row['events']}")
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
