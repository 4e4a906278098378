"""One notebook-style run: a Client publishing in a thread, then Spark starts, runs a job, stops.

Run by test_spark_beside_client.py in a fresh interpreter per start (a JVM
starts once per process). Arguments: broker address, stream. Prints one JSON
line: rows the job counted and messages published before, during and after
the JVM start; the exit status is non-zero when Spark or the publisher fails.
"""

from __future__ import annotations

import json
import sys
import threading
import time

from npstream import Client


def main(address: str, stream: str) -> int:
    published = [0]
    errors: list[BaseException] = []
    stop = threading.Event()

    def publish(client: Client) -> None:
        try:
            while not stop.is_set():
                client.publish(stream, b"x" * 100)
                published[0] += 1
        except BaseException as exc:  # reported below: the run fails
            errors.append(exc)

    with Client(address) as client:
        thread = threading.Thread(target=publish, args=(client,), daemon=True)
        thread.start()
        while published[0] < 5 and thread.is_alive():  # the channel is busy
            time.sleep(0.005)
        before = published[0]
        from pyspark.sql import SparkSession

        spark = (SparkSession.builder.master("local[1]").appName("beside-a-client")
                 .config("spark.ui.enabled", "false")
                 .config("spark.sql.shuffle.partitions", "1")
                 .config("spark.driver.extraJavaOptions",
                         "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
                 .getOrCreate())
        during = published[0] - before
        rows = spark.range(100).selectExpr("sum(id) AS total").collect()[0]["total"]
        spark.stop()
        stop.set()
        thread.join(30)
    print(json.dumps({"sum": rows, "before": before, "during_start": during,
                      "total": published[0], "errors": [repr(e) for e in errors]}))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
