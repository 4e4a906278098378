#!/usr/bin/env python3
"""One broker vs a cluster of two on this machine, under the same client load (issue 19).

For each setup (``npstream cluster local --brokers 1``, then ``--brokers 2``, fresh
data dirs), in one run:

1. load (``--seconds``): ``--producers`` processes with ``--threads`` threads each
   publish 100-byte messages one at a time (``ack=fsync``) to 4 streams, while one
   consumer process per stream receives and acks them in a shared group (batches of
   up to 1,000). The 4 stream names are chosen so that with two brokers each holds
   two (placement is by name: rendezvous hashing).
2. a Spark batch read of the 4 streams (``local[2]``, ``spark.read.format("npstream")``
   with ``stream`` = the 4 names, through any member), rows counted.

Printed side by side: published and delivered msg/s, CPU seconds (and cores busy) of
each broker process from /proc, of the producers and consumers together, and the
Spark read's rows, seconds and rows/s.

    .venv/bin/python bench/cluster.py                 # 20 s of load per setup
    .venv/bin/python bench/cluster.py --seconds 10 --skip-spark

2 cores shared with other work: the load average is printed; two brokers can only
help while the single broker's one core is the limit and a second core is free.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from npstream import Client

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import machine_info

PAYLOAD = b"x" * 100
STREAMS = 4
SPARK_SCRIPT = """
import sys, time
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master("local[2]").appName("cluster-bench")
         .config("spark.ui.enabled", "false").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
started = time.monotonic()
rows = (spark.read.format("npstream").option("broker", sys.argv[1])
        .option("stream", sys.argv[2]).load().count())
print("SPARK", rows, time.monotonic() - started, flush=True)
spark.stop()
"""


def proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class LocalCluster:
    """``npstream cluster local --brokers N`` as a subprocess; its brokers' addresses and pids."""

    def __init__(self, brokers: int, root: Path, port: int) -> None:
        self.brokers = brokers
        self.root = root
        self.port = port
        self.proc: subprocess.Popen[str] | None = None
        self.members: list[tuple[str, int]] = []

    def __enter__(self) -> LocalCluster:
        npstream = Path(sys.executable).with_name("npstream")
        self.proc = subprocess.Popen(
            [str(npstream), "cluster", "local", "--brokers", str(self.brokers), "--data-dir",
             str(self.root), "--port", str(self.port)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "NPSTREAM_METRICS_PORT": "0"})
        assert self.proc.stdout is not None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError("npstream cluster local ended before serving")
            found = re.match(r"(\S+:\d+)\s+pid=(\d+)", line)
            if found:
                self.members.append((found.group(1), int(found.group(2))))
            if "serving" in line:
                threading.Thread(target=self.proc.stdout.read, daemon=True).start()
                return self
        raise TimeoutError("cluster did not start")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def pick_streams(address: str, members: int) -> list[str]:
    """4 names, split evenly over the members by placement (any 4 for one member)."""
    with Client(address) as client:
        chosen: dict[str, list[str]] = {}
        for i in range(1000):
            name = f"bench-{i}"
            owner = client.broker_of(name)
            if len(chosen.setdefault(owner, [])) < STREAMS // members:
                chosen[owner].append(name)
            if sum(len(v) for v in chosen.values()) == STREAMS:
                break
        names = sorted(n for v in chosen.values() for n in v)
        for name in names:
            client.create_stream(name, max_bytes=0)
        return names


def producer(address: str, streams: list[str], threads: int, stop_at: float,
             counts: Any) -> None:
    done = [0] * threads

    def run(k: int) -> None:
        with Client(address) as client:
            stream = streams[k % len(streams)]
            while time.time() < stop_at:
                client.publish(stream, PAYLOAD)
                done[k] += 1

    workers = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    counts.put(sum(done))


def consumer(address: str, stream: str, stop_at: float, counts: Any) -> None:
    received = 0
    with Client(address) as client:
        batch = None
        while time.time() < stop_at + 2:
            batch = client.receive_batch(stream, "bench", 1000, wait=0.5, ack=batch)
            received += len(batch)
        if batch is not None and len(batch):
            batch.ack()
    counts.put(received)


def run_setup(brokers: int, args: argparse.Namespace, port: int) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix=f"npstream-cluster{brokers}-"))
    result: dict[str, Any] = {"brokers": brokers}
    with LocalCluster(brokers, root, port) as cluster:
        address = cluster.members[0][0]
        streams = pick_streams(address, brokers)
        result["streams"] = streams
        ctx = mp.get_context("spawn")
        counts: Any = ctx.Queue()
        consumed: Any = ctx.Queue()
        stop_at = time.time() + 3 + args.seconds  # spawn start-up before the clock runs
        procs = [ctx.Process(target=producer, args=(cluster.members[k % brokers][0],
                                                    streams, args.threads, stop_at, counts))
                 for k in range(args.producers)]
        procs += [ctx.Process(target=consumer, args=(address, stream, stop_at, consumed))
                  for stream in streams]
        for proc in procs:
            proc.start()
        time.sleep(max(stop_at - args.seconds - time.time(), 0))
        cpu0 = {pid: proc_cpu(pid) for _, pid in cluster.members}
        load0 = os.getloadavg()[0]
        time.sleep(args.seconds)
        cpu1 = {pid: proc_cpu(pid) for _, pid in cluster.members}
        published = sum(counts.get(timeout=120) for _ in range(args.producers))
        delivered = sum(consumed.get(timeout=120) for _ in streams)
        for proc in procs:
            proc.join(60)
        result["published_per_s"] = published / args.seconds
        result["delivered_per_s"] = delivered / (args.seconds + 2)
        result["broker_cpu_s"] = [round(cpu1[pid] - cpu0[pid], 1) for _, pid in cluster.members]
        result["load_average"] = load0
        if not args.skip_spark:
            started = time.monotonic()
            out = subprocess.run([sys.executable, "-c", SPARK_SCRIPT, address, ",".join(streams)],
                                 capture_output=True, text=True, timeout=900,
                                 env={**os.environ, "PYSPARK_PYTHON": sys.executable})
            found = re.search(r"SPARK (\d+) ([\d.]+)", out.stdout)
            if found is None:
                result["spark_error"] = (out.stdout + out.stderr)[-1500:]
            else:
                result["spark_rows"] = int(found.group(1))
                result["spark_read_s"] = float(found.group(2))
                result["spark_total_s"] = time.monotonic() - started
    subprocess.run(["rm", "-rf", str(root)], check=False)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--skip-spark", action="store_true")
    parser.add_argument("--port", type=int, default=7370)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = [run_setup(1, args, args.port), run_setup(2, args, args.port + 10)]
    m = machine_info()
    print(f"npstream one broker vs two, {m['date_utc']}, {m['cores']} cores, "
          f"{args.producers} producers x {args.threads} threads (100 B, ack=fsync, one "
          f"message per call), a shared group per stream, {args.seconds:.0f} s")
    rows = [("published msg/s", lambda r: f"{r['published_per_s']:,.0f}"),
            ("delivered msg/s (shared groups)", lambda r: f"{r['delivered_per_s']:,.0f}"),
            ("broker CPU s (cores busy)", lambda r: ", ".join(
                f"{c} ({c / args.seconds:.2f})" for c in r["broker_cpu_s"])),
            ("load average at the start", lambda r: f"{r['load_average']:.1f}")]
    if not args.skip_spark:
        rows.append(("Spark read of the 4 streams", lambda r: (
            f"{r['spark_rows']:,} rows in {r['spark_read_s']:.1f} s "
            f"({r['spark_rows'] / r['spark_read_s']:,.0f} rows/s)") if "spark_rows" in r
            else "failed"))
    print(f"{'':34}  {'1 broker':>36}  {'2 brokers':>36}")
    for label, cell in rows:
        print(f"{label:34}  {cell(results[0]):>36}  {cell(results[1]):>36}")
    ratio = results[1]["published_per_s"] / max(results[0]["published_per_s"], 1e-9)
    print(f"INFO  2 brokers / 1 broker published msg/s: {ratio:.2f}x")
    if args.json:
        args.json.write_text(json.dumps({"machine": m, "results": results}, indent=2))


if __name__ == "__main__":
    main()
