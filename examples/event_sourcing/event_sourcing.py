"""Event sourcing: rebuild account balances by replaying the whole event log with Spark.

Publishes account events (deposit 100.00, withdrawal 25.00 on acc-1 by
default), then replays the stream from offset 0 with a Spark batch read and
folds the events into balances. The log is the source of truth: running the
replay again, at any time, gives the same balances.

    spark-submit examples/event_sourcing/event_sourcing.py --broker localhost:7070
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from npstream import Client

EVENT_SCHEMA = "account STRING, type STRING, amount DECIMAL(12,2)"


def publish_events(broker: str, stream: str, events: list[dict]) -> None:
    """Each event gets an id, so publishing the same history twice stores it once."""
    with Client(broker) as client:
        client.create_stream(stream, exist_ok=True)
        client.publish_batch(stream, [
            {"id": e.get("id") or str(uuid.uuid4()), "key": e["account"], "value": e}
            for e in events
        ])


def balances(events: DataFrame) -> DataFrame:
    """Fold deposits (+) and withdrawals (-) into one balance per account."""
    parsed = events.select(F.from_json(F.col("value").cast("string"), EVENT_SCHEMA).alias("e"))
    signed = F.when(F.col("e.type") == "deposit", F.col("e.amount")).when(
        F.col("e.type") == "withdrawal", -F.col("e.amount"))
    return (parsed.groupBy(F.col("e.account").alias("account"))
            .agg(F.sum(signed).cast("decimal(12,2)").alias("balance"))
            .orderBy("account"))


def replay(spark: SparkSession, broker: str, stream: str) -> DataFrame:
    raw = (spark.read.format("npstream").option("broker", broker).option("stream", stream)
           .option("startingOffsets", "earliest").load())
    return balances(raw)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--broker", default=os.environ.get("NPSTREAM_BROKER", "localhost:7070"))
    p.add_argument("--stream", default=f"accounts-{uuid.uuid4().hex[:6]}")
    args = p.parse_args(argv)
    publish_events(args.broker, args.stream, [
        {"id": "acc-1-1", "account": "acc-1", "type": "deposit", "amount": "100.00"},
        {"id": "acc-1-2", "account": "acc-1", "type": "withdrawal", "amount": "25.00"},
    ])
    spark = SparkSession.builder.appName("npstream-event-sourcing").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    try:
        for row in replay(spark, args.broker, args.stream).collect():
            print(f"{row['account']} balance {row['balance']:.2f}")
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
