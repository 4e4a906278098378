"""The README's first command: a broker, a producer and the Spark sensor pipeline, end to end.

Uses the broker at $NPSTREAM_BROKER (default localhost:7070) if one answers,
else starts one on the embedded default data dir ./data and stops it at the
end. Publishes simulated readings for --seconds, runs the Spark job with
tumbling and sliding windows, prints every finished window on the console and
finishes with a summary of what reached each sink.

``--brokers N`` (``make demo BROKERS=2``) runs it on a cluster of N brokers
on consecutive ports from --broker's (data dirs DATA_DIR/broker-0..N-1), registered in an
etcd it starts (DATA_DIR/etcd), as
``npstream cluster local`` would, and names its two streams so that they
live on different members: the producer, Spark's reads and Spark's
exactly-once writes reach them through whichever member they ask.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import live_metrics  # noqa: E402
import pipeline  # noqa: E402
import producer  # noqa: E402
from webhook import WebhookReceiver  # noqa: E402

from npstream import Client  # noqa: E402
from npstream.cli.local_etcd import LocalEtcd  # noqa: E402
from npstream.errors import BrokerUnavailable, StreamNotFound  # noqa: E402
from npstream.proto import pb  # noqa: E402

log = logging.getLogger("demo")


def broker_answers(address: str) -> bool:
    try:
        with Client(address, retry_deadline=1.0, timeout=2.0) as client:
            client.list_streams(prefix="__probe__")
        return True
    except BrokerUnavailable:
        return False


def start_broker(address: str, data_dir: Path, etcd: str | None = None) -> subprocess.Popen:
    """A broker on ``address``; a member of the cluster in ``etcd`` when given."""
    host, port = address.rsplit(":", 1)
    ready = Path(tempfile.mkdtemp()) / "ready"
    cluster = ["--etcd", etcd, "--metrics-port", "0"] if etcd else []
    proc = subprocess.Popen([
        sys.executable, "-m", "npstream.broker", "--data-dir", str(data_dir),
        "--host", "127.0.0.1" if host == "localhost" else host, "--port", port,
        "--ready-file", str(ready), *cluster,
    ])
    deadline = time.monotonic() + 30
    while not ready.exists() or not ready.read_text().strip():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the broker did not start on {address} (exit {proc.poll()})")
        time.sleep(0.05)
    log.info("started a broker on %s with data dir %s", address, data_dir)
    return proc


def start_cluster(address: str, count: int, data_dir: Path,
                  etcd: LocalEtcd) -> list[subprocess.Popen]:
    """``count`` brokers on consecutive ports from ``address``'s, one cluster registered
    in ``etcd`` (started here); returns once every broker lists every member."""
    host, port = address.rsplit(":", 1)
    host = "127.0.0.1" if host == "localhost" else host
    members = [f"{host}:{int(port) + i}" for i in range(count)]
    etcd.start()
    log.info("started etcd on %s with data dir %s", etcd.endpoint, etcd.data_dir)
    procs = [start_broker(member, data_dir / f"broker-{i}", etcd.endpoint)
             for i, member in enumerate(members)]
    for member in members:
        with Client(member) as client:
            while set(client.call("ClusterService.Owners", pb.OwnersRequest()).members) < set(
                    members):
                time.sleep(0.05)
    return procs


def spread_names(address: str, run_tag: str) -> tuple[str, str]:
    """The demo's source and results stream names, on two different members if there are."""
    with Client(address) as client:
        for attempt in range(100):
            suffix = f"{run_tag}-{attempt}" if attempt else run_tag
            source, results = f"sensor-readings-{suffix}", f"sensor-windows-{suffix}"
            owners = client.brokers_of([source, results])
            if owners[source] != owners[results]:
                return source, results
    return f"sensor-readings-{run_tag}", f"sensor-windows-{run_tag}"


class CaughtUp:
    """The pipeline's stop condition: the producer is done, every query has read the source
    to its end, and two more triggers passed (the no-data batch that closes the windows
    the last watermark passed runs at the next one)."""

    def __init__(self, spark: object, broker: str, source: str, producing: threading.Thread,
                 trigger_seconds: float) -> None:
        self.spark, self.broker, self.source = spark, broker, source
        self.producing, self.grace = producing, 2 * trigger_seconds
        self.end: int | None = None
        self.since: float | None = None

    def read_to(self, query: object) -> int:
        progress = query.lastProgress  # type: ignore[attr-defined]
        if not progress:
            return -1
        offsets = progress["sources"][0]["endOffset"]
        offsets = json.loads(offsets) if isinstance(offsets, str) else offsets
        return int((offsets or {}).get(self.source, -1))

    def __call__(self) -> bool:
        if self.producing.is_alive():
            return False
        if self.end is None:
            with Client(self.broker) as client:
                self.end = client.stream_info(self.source).end_offset
        queries = self.spark.streams.active  # type: ignore[attr-defined]
        if self.since is None:
            if queries and all(self.read_to(q) >= self.end for q in queries):
                self.since = time.monotonic()
            return False
        return time.monotonic() - self.since >= self.grace


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--broker", default=os.environ.get("NPSTREAM_BROKER", "localhost:7070"))
    p.add_argument("--data-dir", type=Path, default=Path("data"))
    p.add_argument("--seconds", type=float, default=40.0, help="how long to produce readings")
    p.add_argument("--rate", type=float, default=100.0, help="readings per second")
    p.add_argument("--metrics-port", type=int, default=9090,
                   help="port of the live metrics endpoint (the tutorial's; taken: any free one)")
    p.add_argument("--brokers", type=int, default=1,
                   help="run on a cluster of this many brokers (started unless --broker "
                        "answers), the demo's streams on different members")
    args = p.parse_args(argv)
    if args.brokers < 1:
        p.error("--brokers must be >= 1")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)  # one line per py4j callback otherwise
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    broker_procs: list[subprocess.Popen] = []
    etcd = LocalEtcd(args.data_dir / "etcd")  # started for a cluster only
    if not broker_answers(args.broker):
        try:
            broker_procs = (start_cluster(args.broker, args.brokers, args.data_dir, etcd)
                            if args.brokers > 1 else [start_broker(args.broker, args.data_dir)])
        except BaseException:
            etcd.stop()
            raise
    out_dir = args.data_dir / "demo-output" / time.strftime("%Y%m%dT%H%M%S")
    out_dir.mkdir(parents=True, exist_ok=True)
    receiver = WebhookReceiver(out=out_dir / "webhook.jsonl").start()
    metrics = live_metrics.LiveMetrics(trigger_seconds=2)
    try:
        metrics_url = metrics.serve(port=args.metrics_port)
    except OSError:  # the port is taken: any free one
        metrics_url = metrics.serve(port=0)
    print(f"[metrics] live pipeline metrics at {metrics_url} "
          f"(Prometheus text: {metrics_url}/prometheus)", flush=True)
    run_tag = time.strftime("%Y%m%d-%H%M%S")
    source, results = (spread_names(args.broker, run_tag) if args.brokers > 1
                       else (f"sensor-readings-{run_tag}", f"sensor-windows-{run_tag}"))
    published: list[int] = []
    producing = threading.Thread(target=lambda: published.append(producer.run(
        args.broker, source, args.rate, args.seconds, 0.02, 0.02, None, producer.SENSORS)))
    try:
        from pyspark.sql import SparkSession

        spark = (SparkSession.builder.master("local[2]").appName("npstream-demo")
                 .config("spark.ui.enabled", "false")
                 .config("spark.sql.session.timeZone", "UTC")
                 .config("spark.sql.shuffle.partitions", "2").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        with Client(args.broker) as client:
            client.create_stream(source, schema=producer.READING_SCHEMA, exist_ok=True)
        producing.start()
        spark_args = pipeline.parse_args([
            "--broker", args.broker, "--source-stream", source, "--results-stream", results,
            "--output-dir", str(out_dir), "--webhook-url", receiver.url,
            "--slide", "5 seconds", "--trigger-seconds", "2",
            "--checkpoint-dir", str(out_dir / "checkpoints"),
            "--run-seconds", str(args.seconds + 20),  # at most; it stops once caught up
        ])
        caught_up = CaughtUp(spark, args.broker, source, producing, trigger_seconds=2)
        try:
            pipeline.run(spark, spark_args, should_stop=caught_up, metrics=metrics)
        finally:
            spark.stop()
        producing.join()
        with Client(args.broker) as client:
            try:
                info = client.stream_info(results)
            except StreamNotFound:  # Spark creates it with its first window: none closed yet
                info = None
            windows = info.message_count if info is not None else 0
        json_lines = sum(
            len(f.read_text().splitlines()) for f in out_dir.glob("tumbling/*.json")
        )
        print("\n=== npstream demo summary ===")
        print(f"readings published to '{source}':     {published[0] if published else 0}")
        print(f"tumbling windows in stream '{results}': {windows}")
        if info is not None:
            print(f"  typed, schema: {info.value_schema_ddl}")
        print(f"tumbling windows in JSON lines:        {json_lines} ({out_dir / 'tumbling'})")
        print(f"webhook POSTs received:                {len(receiver.received)}")
        print(f"live metrics ({metrics_url}): {json.dumps(metrics.snapshot())}")
        print(metrics.report())
        if args.brokers > 1:
            with Client(args.broker) as client:
                owners = client.brokers_of([source, results])
            print(f"cluster of {args.brokers} brokers: '{source}' on {owners[source]}, "
                  f"'{results}' on {owners[results]}")
        print(f"broker: {args.broker}, data dir: {args.data_dir.resolve()}")
    finally:
        receiver.stop()
        metrics.stop()
        for proc in broker_procs:
            proc.terminate()
        for proc in broker_procs:
            proc.wait(30)
        etcd.stop()  # after the brokers: they leave by revoking their leases
    return 0


if __name__ == "__main__":
    sys.exit(main())
