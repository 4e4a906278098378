"""Two consumers of one stream, each at its own pace: a real-time dashboard and a warehouse loader.

The dashboard query starts from `latest` (it only cares about what happens
from now on) and the warehouse loader from `earliest` (it loads everything).
Both are Spark streaming queries over the same npstream stream; each commits
its position to its own broker-side group, so `npstream groups describe`
shows each one's lag.

    spark-submit examples/analytics_two_groups/analytics_two_groups.py --broker localhost:7070
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import uuid

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from npstream import Client

ACTIVITY_SCHEMA = "event STRING, userId STRING, page STRING"
PAGES = ["/", "/pricing", "/docs", "/signup"]


def publish_activity(client: Client, stream: str, count: int, rng: random.Random) -> None:
    client.publish_batch(stream, [
        {"value": {"event": "page.viewed", "userId": f"usr_{rng.randint(1, 50)}",
                   "page": rng.choice(PAGES)}}
        for _ in range(count)
    ])


def start_query(spark: SparkSession, broker: str, stream: str, *, group: str,
                starting: str, sink: str, checkpoint: str, output: str | None = None):
    views = (
        spark.readStream.format("npstream").option("broker", broker).option("stream", stream)
        .option("startingOffsets", starting).option("group", group).load()
        .select(F.from_json(F.col("value").cast("string"), ACTIVITY_SCHEMA).alias("a"))
        .select("a.*")
    )
    if sink == "memory":
        return (views.groupBy("page").count().writeStream.outputMode("complete")
                .format("memory").queryName(group.replace("-", "_"))
                .option("checkpointLocation", checkpoint).start())
    return (views.writeStream.format("parquet").option("path", output)
            .option("checkpointLocation", checkpoint).start())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--broker", default=os.environ.get("NPSTREAM_BROKER", "localhost:7070"))
    p.add_argument("--stream", default=f"user-activity-{uuid.uuid4().hex[:6]}")
    p.add_argument("--before", type=int, default=100, help="events published before start")
    p.add_argument("--after", type=int, default=50, help="events published after start")
    args = p.parse_args(argv)
    rng = random.Random(7)
    work = tempfile.mkdtemp(prefix="two-groups-")
    spark = SparkSession.builder.appName("npstream-two-groups").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    try:
        with Client(args.broker) as client:
            client.create_stream(args.stream, exist_ok=True)
            publish_activity(client, args.stream, args.before, rng)
            dashboard = start_query(spark, args.broker, args.stream, group="dashboard",
                                    starting="latest", sink="memory",
                                    checkpoint=f"{work}/dashboard-ckpt")
            warehouse = start_query(spark, args.broker, args.stream, group="warehouse-loader",
                                    starting="earliest", sink="parquet",
                                    checkpoint=f"{work}/warehouse-ckpt",
                                    output=f"{work}/warehouse")
            dashboard.processAllAvailable()  # fixes the dashboard's `latest` position
            warehouse.processAllAvailable()
            publish_activity(client, args.stream, args.after, rng)
            dashboard.processAllAvailable()
            warehouse.processAllAvailable()
            seen_dashboard = spark.sql("SELECT sum(count) AS n FROM dashboard").first()["n"]
            loaded = spark.read.parquet(f"{work}/warehouse").count()
            print(f"dashboard (from latest) counted {seen_dashboard} page views")
            spark.sql("SELECT * FROM dashboard ORDER BY page").show()
            print(f"warehouse loader (from earliest) loaded {loaded} events")
            for group in ("dashboard", "warehouse-loader"):
                info = client.describe_group(args.stream, group)
                print(f"group {group}: committed offset {info.committed_offset}, lag {info.lag}")
            dashboard.stop()
            warehouse.stop()
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
