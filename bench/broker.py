#!/usr/bin/env python3
"""Broker core benchmark: npstream vs Redis Streams and NATS JetStream, in one run.

    .venv/bin/python bench/broker.py                 # full run (3-6 min on 2 cores)
    .venv/bin/python bench/broker.py --quick --skip-peers
    .venv/bin/python bench/broker.py --messages 500000 --size 200 --json out.json

Each peer runs alone (start_peers.sh <peer>, its bench script with the same --messages,
--size and --batch, stop_peers.sh), then our broker alone (a subprocess on a temp data dir
and a free port). Measured for each configuration:

* publish, two rows: (a) the goal row, the columnar API: all messages of the
  configuration built into one Arrow table and passed to one ``Client.publish_batch``
  call with the SDK's defaults (~4 MiB requests, several in flight on PublishStream),
  building the table inside the timed region; (b) informational, the peers' shape:
  an Arrow table of ``batch`` rows per call, one call after the other (the next is
  sent when the previous is acknowledged, like the peers' pipelined windows);
  ack=fsync by default for both;
* replay: ``Client.read_range`` from offset 0 to the end, collected into one Arrow table,
  twice: with local reads (the bench runs on the broker's machine, so the client reads the
  segment files itself, as any client here would by default) and with
  ``local_reads=False`` (one server-streaming ReadRange call, what a remote client gets);
* publish-to-fetch latency p50/p99 at --latency-rate msg/s (bench/latency_probe.py), the
  median over --latency-repeats runs for every system;
* the same latency probe against a trivial Python gRPC server (bench/transport_floor.py:
  same grpcio, no storage, unary long-poll Fetch), after our broker has stopped: the
  floor any Python gRPC broker has on this machine (--skip-floor leaves it out).

Then, once (not per configuration), typed streams (issue 17, --skip-typed leaves it out,
--typed-only runs nothing else): --typed-rows rows (1,000,000) of 5 columns
(bench/typed_rows.py: sensorId STRING, reading DOUBLE, ts TIMESTAMP, seq BIGINT,
ok BOOLEAN) published with one ``publish_batch`` call of a ready-made table (built
before the timing) to a fresh stream, four ways, round-robin, --typed-repeats times
(median): the rows as a struct ``value`` into a typed stream; the same payload bytes,
each row's fields packed into one 36-byte binary value, into an untyped stream (the
baseline); and (informational) the rows as JSON bytes into a typed stream and into an
untyped stream, after one untimed round of the four. Goal: typed publish time <= 1.2x
the untyped one.

Prints one table of throughput (with ratios vs Redis and vs JetStream measured in this
run), one of latency, PASS/FAIL lines for the issue's goals and an INFO line with the gRPC
floor under each latency goal. See docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from bench_common import (
    BrokerUnderTest,
    CpuMeter,
    create_bench_stream,
    median_of,
    rate,
)
from latency_probe import measure_fetch_latency
from peer_runner import peer_running, run_peer_script
from report import Goal, Info, fmt, ratio, render_table, run_comparison
from transport_floor import FloorServer, floor_info, measure_floor_latency
from typed_rows import DDL as TYPED_DDL
from typed_rows import ROW_BYTES, json_values, packed_values, typed_table

# ---------------------------------------------------------------- tuning / run sizes
# (messages, payload bytes, batch): the peers' anchor configurations (run_all.sh). The
# batch is the rows per publish_batch call for us, the pipeline/ack window for the peers.
FULL_CONFIGS = [(1_000_000, 100, 1000), (200_000, 1000, 500)]
# --quick: small enough for a smoke run (seconds), large enough to cross several batches.
QUICK_CONFIGS = [(20_000, 100, 1000), (5_000, 1000, 500)]
LATENCY_MESSAGES = 2000        # per latency run, as in the peers' scripts
QUICK_LATENCY_MESSAGES = 200
LATENCY_RATE = 1000.0          # msg/s, as the issue asks
LATENCY_REPEATS = 3            # p99 swings on 2 cores: report the median of the repeats
PHASE_TIMEOUT_S = 300.0        # wall-clock cap per phase, ours and the peers'
GOAL_PUBLISH_X = 10.0          # publish >= 10x Redis and >= 10x JetStream
GOAL_DICTS_X = 5.0             # publish_batch of a list of dicts >= 5x Redis XADD (issue 32)
GOAL_REPLAY_X = 10.0           # replay >= 10x Redis XRANGE
# Payload bytes per table of the generator-fed publish row (10 MB: 100,000 x 100 B,
# 10,000 x 1 KB): a few ~4 MiB requests each, small enough to reuse warm memory.
CHUNK_PAYLOAD_BYTES = 10_000_000
# JetStream's API-path phases are not in our table; keep them short.
NATS_API_MESSAGES = 1000
# Typed streams (issue 17): rows of 5 columns per publish (bench/typed_rows.py), timed
# runs of each of the four publishes (round-robin, median; one untimed round first), and
# the goal.
TYPED_ROWS = 1_000_000
QUICK_TYPED_ROWS = 20_000
TYPED_REPEATS = 5
GOAL_TYPED_PUBLISH_X = 1.2     # typed publish time <= 1.2x untyped, same payload bytes

PEER_LABEL = {"redis": "redis-streams", "nats": "nats-jetstream"}


def default_batch(size: int) -> int:
    """The peers' windows: 1000 for small messages, 500 from 1 KB up."""
    return 1000 if size < 1000 else 500


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, help="messages per run (default: the anchor "
                   "configurations 1,000,000 x 100 B and 200,000 x 1 KB)")
    p.add_argument("--size", type=int, help="payload bytes per message (>= 8)")
    p.add_argument("--batch", type=int, help="rows per publish_batch call / peer window "
                   "(default 1000 below 1 KB, else 500)")
    p.add_argument("--ack", choices=["fsync", "write"], default="fsync",
                   help="our publish ack mode (default fsync)")
    p.add_argument("--latency-messages", type=int, help=f"default {LATENCY_MESSAGES}")
    p.add_argument("--latency-rate", type=float, default=LATENCY_RATE)
    p.add_argument("--latency-repeats", type=int, help=f"default {LATENCY_REPEATS}")
    p.add_argument("--phase-timeout", type=float, default=PHASE_TIMEOUT_S)
    p.add_argument("--quick", action="store_true", help="small counts for a smoke run")
    p.add_argument("--skip-peers", action="store_true", help="measure npstream only")
    p.add_argument("--skip-floor", action="store_true",
                   help="leave out the trivial-gRPC-server latency rows")
    p.add_argument("--peers", default="redis,nats", help="comma list (default redis,nats)")
    p.add_argument("--typed-rows", type=int, help=f"rows of the typed-stream publish "
                   f"(default {TYPED_ROWS:,}; --quick {QUICK_TYPED_ROWS:,})")
    p.add_argument("--typed-repeats", type=int, help=f"timed runs of each typed-stream "
                   f"publish, round-robin, median reported (default {TYPED_REPEATS}; --quick 1)")
    p.add_argument("--skip-typed", action="store_true",
                   help="leave out the typed-stream publish section")
    p.add_argument("--typed-only", action="store_true",
                   help="run only the typed-stream publish section (no peers, no floor)")
    p.add_argument("--json", metavar="PATH", help="also write the raw results here")
    a = p.parse_args(argv)
    if a.typed_only and a.skip_typed:
        p.error("--typed-only and --skip-typed exclude each other")
    a.typed_rows = a.typed_rows or (QUICK_TYPED_ROWS if a.quick else TYPED_ROWS)
    a.typed_repeats = a.typed_repeats or (1 if a.quick else TYPED_REPEATS)
    if a.typed_rows < 1 or a.typed_repeats < 1:
        p.error("--typed-rows and --typed-repeats must be >= 1")
    if a.messages is not None or a.size is not None:
        size = a.size if a.size is not None else 100
        messages = a.messages if a.messages is not None else (20_000 if a.quick else 1_000_000)
        a.configs = [(messages, size, a.batch or default_batch(size))]
    else:
        base = QUICK_CONFIGS if a.quick else FULL_CONFIGS
        a.configs = [(n, s, a.batch or b) for n, s, b in base]
    if any(s < 8 for _n, s, _b in a.configs):
        p.error("--size must be >= 8 (the latency phase stores a timestamp in the payload)")
    if any(n < 1 or b < 1 for n, _s, b in a.configs):
        p.error("--messages and --batch must be >= 1")
    a.latency_messages = a.latency_messages or (
        QUICK_LATENCY_MESSAGES if a.quick else LATENCY_MESSAGES)
    a.latency_repeats = a.latency_repeats or (1 if a.quick else LATENCY_REPEATS)
    if a.typed_only:
        a.configs = []
        a.skip_peers = a.skip_floor = True
    a.peers = [x for x in a.peers.split(",") if x]
    unknown = set(a.peers) - set(PEER_LABEL)
    if unknown:
        p.error(f"unknown peer(s) {sorted(unknown)}; choose from {sorted(PEER_LABEL)}")
    return a


# ---------------------------------------------------------------- npstream phases

def publish_phase(client: Any, stream: str, n: int, size: int, batch: int, ack: str,
                  data: bytes, broker_pid: int | None, timeout_s: float,
                  *, dicts: bool = False) -> dict[str, Any]:
    """The peers' shape: ``batch`` rows per publish_batch call, one call at a time.

    ``dicts``: each call gets a list of ``{"value": bytes}`` dicts (what most
    application code has) instead of an Arrow table; the list is made once,
    outside the timing, as an application's would be before the call.
    """
    table: Any = pa.table({"value": pa.array([data] * batch, type=pa.binary())})
    if dicts:
        table = [{"value": data} for _ in range(batch)]
    sent = stored = 0
    deadline = time.monotonic() + timeout_s
    with CpuMeter(broker_pid) as cpu:
        t0 = time.perf_counter()
        while sent < n and time.monotonic() < deadline:
            k = min(batch, n - sent)
            part = table if k == batch else (table[:k] if dicts else table.slice(0, k))
            result = client.publish_batch(stream, part, ack=ack)
            stored += result.stored_count
            sent += k
        seconds = time.perf_counter() - t0
    res = rate(sent, size, seconds)
    res.update(cpu.as_dict())
    res["stored"] = client.stream_info(stream).end_offset
    res["acked_stored"] = stored
    res["partial"] = sent < n
    res["method"] = (f"publish_batch({'list of dicts' if dicts else 'Arrow table'} of {batch} "
                     f"rows, ack={ack}), one call at a time")
    return res


def publish_columnar_phase(client: Any, stream: str, n: int, size: int, ack: str,
                           data: bytes, broker_pid: int | None) -> dict[str, Any]:
    """The columnar API: all ``n`` messages as one table, built and published in the timing.

    One call, so --phase-timeout cannot cut it short; the SDK's own per-request
    timeout bounds it.
    """
    with CpuMeter(broker_pid) as cpu:
        t0 = time.perf_counter()
        table = pa.table({"value": pa.array([data] * n, type=pa.binary())})
        built = time.perf_counter()
        result = client.publish_batch(stream, table, ack=ack)
        seconds = time.perf_counter() - t0
    res = rate(n, size, seconds)
    res.update(cpu.as_dict())
    res["build_seconds"] = round(built - t0, 3)  # part of the timed region
    res["stored"] = client.stream_info(stream).end_offset
    res["acked_stored"] = result.stored_count
    res["acked_offsets_ok"] = result.offsets == list(range(n))
    res["partial"] = False
    res["method"] = (f"publish_batch(one Arrow table of {n:,} rows built in the timed region, "
                     f"SDK defaults, ack={ack})")
    return res


def publish_chunks_phase(client: Any, stream: str, n: int, size: int, ack: str,
                         data: bytes, broker_pid: int | None) -> dict[str, Any]:
    """The columnar API with bounded memory: one publish_batch over a generator of tables.

    Each table holds CHUNK_PAYLOAD_BYTES of payload and is built from the payload
    inside the timed region when the SDK asks for it, while earlier requests are
    in flight.
    """
    rows = max(1, CHUNK_PAYLOAD_BYTES // size)

    def tables() -> Any:
        for start in range(0, n, rows):
            k = min(rows, n - start)
            yield pa.table({"value": pa.array([data] * k, type=pa.binary())})

    with CpuMeter(broker_pid) as cpu:
        t0 = time.perf_counter()
        result = client.publish_batch(stream, tables(), ack=ack)
        seconds = time.perf_counter() - t0
    res = rate(n, size, seconds)
    res.update(cpu.as_dict())
    res["stored"] = client.stream_info(stream).end_offset
    res["acked_stored"] = result.stored_count
    res["acked_offsets_ok"] = result.offsets == list(range(n))
    res["partial"] = False
    res["chunk_rows"] = rows
    res["method"] = (f"publish_batch(generator of {rows:,}-row Arrow tables built in the timed "
                     f"region, SDK defaults, ack={ack})")
    return res


def check_stored(client: Any, stream: str, n: int, data: bytes) -> dict[str, Any]:
    """Untimed: the stream holds exactly offsets 0..n-1, every value equal to ``data``."""
    table = pa.Table.from_batches(list(client.read_range(stream, 0, n)))
    offsets = table.column("offset").to_numpy()
    return {
        "replayed": table.num_rows,
        "offsets_ok": table.num_rows == n and bool((offsets == np.arange(n)).all()),
        "payload_ok": table.num_rows == n and bool(
            pc.all(pc.equal(table.column("value"), pa.scalar(data, pa.binary()))).as_py()),
    }


def replay_phase(address: str, stream: str, expect: int, size: int,
                 broker_pid: int | None, *, local_reads: bool) -> dict[str, Any]:
    """read_range(0, end) into one table, with local reads (same host) or over gRPC."""
    from npstream import Client

    with Client(address, local_reads=local_reads) as client, CpuMeter(broker_pid) as cpu:
        t0 = time.perf_counter()
        table = pa.Table.from_batches(list(client.read_range(stream, 0, expect)))
        payload_bytes = pc.sum(pc.binary_length(table.column("value"))).as_py() or 0
        seconds = time.perf_counter() - t0
        used_local = client._local_reads
    offsets = table.column("offset")
    res = rate(table.num_rows, size, seconds)
    res.update(cpu.as_dict())
    res["payload_bytes_ok"] = payload_bytes == expect * size
    res["offsets_ok"] = (table.num_rows == expect and expect > 0
                         and offsets[0].as_py() == 0 and offsets[-1].as_py() == expect - 1)
    res["partial"] = table.num_rows < expect
    res["local_reads"] = used_local
    res["method"] = ("read_range(0, end) into one Arrow table, "
                     + ("local reads" if used_local else "over gRPC (ReadRange stream)"))
    return res


# ---------------------------------------------------------------- typed streams (issue 17)

# (key, into a typed stream, the value sent: "struct" | "packed" | "json"), in the
# round-robin order of every repeat. "packed" is the baseline of "struct", "untyped_json"
# the (informational) one of "typed_json".
TYPED_PUBLISHES = [
    ("untyped_packed", False, "packed"),
    ("typed_struct", True, "struct"),
    ("untyped_json", False, "json"),
    ("typed_json", True, "json"),
]


def _typed_publish_once(client: Any, typed: bool, table: pa.Table, payload_bytes: int,
                        ack: str, broker_pid: int | None) -> tuple[str, dict[str, Any]]:
    """One publish_batch of ``table`` into a fresh typed or untyped stream, timed."""
    stream = f"bench-typed-{uuid.uuid4().hex[:8]}"
    create_bench_stream(client, stream, schema=TYPED_DDL if typed else None)
    n = table.num_rows
    with CpuMeter(broker_pid) as cpu:
        t0 = time.perf_counter()
        result = client.publish_batch(stream, table, ack=ack)
        seconds = time.perf_counter() - t0
    res = rate(n, payload_bytes / n, seconds)
    res["seconds"] = round(seconds, 5)  # the ratios use it; rate() keeps 3 decimals
    res.update(cpu.as_dict())
    res["stored"] = client.stream_info(stream).end_offset
    res["acked_offsets_ok"] = result.offsets == list(range(n))
    return stream, res


def _read_back_ok(client: Any, stream: str, n: int, expected: pa.Array) -> bool:
    """Untimed: offsets 0..n-1 and every value equal to ``expected`` (a struct when typed)."""
    table = pa.Table.from_batches(list(client.read_range(stream, 0, n)))
    offsets = table.column("offset").to_numpy()
    return (table.num_rows == n and bool((offsets == np.arange(n)).all())
            and table.column("value").combine_chunks().equals(expected))


def typed_publish_phase(client: Any, a: argparse.Namespace,
                        broker_pid: int | None) -> dict[str, Any]:
    """The four publishes of TYPED_PUBLISHES, round-robin, ``--typed-repeats`` times.

    The tables are built before any timing (the user's construction is not the
    publish path being compared). One untimed round of all four comes first: the
    first full-size publish after the broker starts (or after the configurations
    above) is up to 2x slower, whichever kind it is (fresh memory and files). The
    first timed run of each kind is read back and compared value by value.
    """
    n = a.typed_rows
    print(f"# typed streams: building {n:,} rows x 5 columns as a struct, packed binary "
          "and JSON", file=sys.stderr)
    inputs = {"struct": typed_table(n), "packed": pa.table({"value": packed_values(n)}),
              "json": pa.table({"value": json_values(n)})}
    payload = {"struct": n * ROW_BYTES, "packed": n * ROW_BYTES,
               "json": int(pc.sum(pc.binary_length(inputs["json"].column("value"))).as_py())}
    # What each stream reads back: a typed stream stores the struct, whatever was sent.
    expected = {"struct": inputs["struct"].column("value").combine_chunks(),
                "packed": inputs["packed"].column("value").combine_chunks(),
                "json": inputs["json"].column("value").combine_chunks()}
    print("# typed streams: warm-up round (not timed)", file=sys.stderr)
    for _key, typed, value in TYPED_PUBLISHES:
        stream, _res = _typed_publish_once(client, typed, inputs[value], payload[value],
                                           a.ack, broker_pid)
        client.delete_stream(stream)
    runs: dict[str, list[dict[str, Any]]] = {key: [] for key, _t, _v in TYPED_PUBLISHES}
    for i in range(a.typed_repeats):
        for key, typed, value in TYPED_PUBLISHES:
            print(f"# typed streams: publish {n:,} rows, {key} (run {i + 1}/"
                  f"{a.typed_repeats})", file=sys.stderr)
            stream, res = _typed_publish_once(client, typed, inputs[value], payload[value],
                                              a.ack, broker_pid)
            if i == 0:
                res["content_ok"] = _read_back_ok(
                    client, stream, n, expected["struct" if typed else value])
            client.delete_stream(stream)
            runs[key].append(res)
    phases: dict[str, Any] = {}
    for key, typed, value in TYPED_PUBLISHES:
        seconds = statistics.median(r["seconds"] for r in runs[key])
        phases[key] = {
            **rate(n, payload[value] / n, seconds), "seconds": seconds,
            "typed": typed, "value": value, "payload_bytes": payload[value],
            "stored_ok": all(r["stored"] == n and r["acked_offsets_ok"] for r in runs[key]),
            "content_ok": runs[key][0]["content_ok"], "runs": runs[key],
        }
    return {"rows": n, "schema": TYPED_DDL, "row_bytes": ROW_BYTES,
            "repeats": a.typed_repeats, "ack": a.ack, "phases": phases}


def run_npstream(a: argparse.Namespace) -> dict[str, Any]:
    from npstream import Client

    out: dict[str, Any] = {"system": "npstream", "ack": a.ack,
                           "durability": f"ack={a.ack}: " + (
                               "reply after the fsync covering the batch (group commit)"
                               if a.ack == "fsync" else "reply once written to the page cache"),
                           "configs": []}
    with BrokerUnderTest() as broker, Client(broker.address) as client:
        out["address"] = broker.address
        for n, size, batch in a.configs:
            data = os.urandom(size)
            cfg: dict[str, Any] = {"messages": n, "size": size, "batch": batch}
            stream = f"bench-tp-{uuid.uuid4().hex[:8]}"
            create_bench_stream(client, stream)
            print(f"# npstream publish {n:,} x {size} B, batch {batch}", file=sys.stderr)
            cfg["produce"] = publish_phase(client, stream, n, size, batch, a.ack, data,
                                           broker.pid, a.phase_timeout)
            stream_dicts = f"bench-tp-{uuid.uuid4().hex[:8]}"
            create_bench_stream(client, stream_dicts)
            print(f"# npstream publish {n:,} x {size} B, {batch} dicts per call", file=sys.stderr)
            cfg["produce_dicts"] = publish_phase(client, stream_dicts, n, size, batch, a.ack,
                                                 data, broker.pid, a.phase_timeout, dicts=True)
            client.delete_stream(stream_dicts)
            print(f"# npstream replay {cfg['produce']['stored']:,}", file=sys.stderr)
            cfg["consume"] = replay_phase(broker.address, stream, cfg["produce"]["stored"],
                                          size, broker.pid, local_reads=True)
            print(f"# npstream replay {cfg['produce']['stored']:,} over gRPC", file=sys.stderr)
            cfg["consume_grpc"] = replay_phase(broker.address, stream,
                                               cfg["produce"]["stored"], size, broker.pid,
                                               local_reads=False)
            client.delete_stream(stream)
            stream = f"bench-tp-{uuid.uuid4().hex[:8]}"
            create_bench_stream(client, stream)
            print(f"# npstream publish {n:,} x {size} B as one table", file=sys.stderr)
            cfg["produce_columnar"] = publish_columnar_phase(client, stream, n, size, a.ack,
                                                             data, broker.pid)
            cfg["produce_columnar"].update(check_stored(client, stream, n, data))
            client.delete_stream(stream)
            stream = f"bench-tp-{uuid.uuid4().hex[:8]}"
            create_bench_stream(client, stream)
            print(f"# npstream publish {n:,} x {size} B from a generator of tables",
                  file=sys.stderr)
            cfg["produce_chunks"] = publish_chunks_phase(client, stream, n, size, a.ack, data,
                                                         broker.pid)
            cfg["produce_chunks"].update(check_stored(client, stream, n, data))
            client.delete_stream(stream)
            runs = []
            for _ in range(a.latency_repeats):
                lat_stream = f"bench-lat-{uuid.uuid4().hex[:8]}"
                create_bench_stream(client, lat_stream)
                time.sleep(1.0)  # settle after the bulk phases, as the peers do
                runs.append(measure_fetch_latency(
                    client, broker.address, lat_stream, size=size, filler=data,
                    messages=a.latency_messages, rate_hz=a.latency_rate, ack=a.ack))
                client.delete_stream(lat_stream)
            cfg["latency_runs"] = runs
            out["configs"].append(cfg)
        if not a.skip_typed:
            out["typed"] = typed_publish_phase(client, a, broker.pid)
    if not a.skip_floor:
        with FloorServer() as floor:
            for cfg in out["configs"]:
                print(f"# grpc-floor latency, size {cfg['size']}", file=sys.stderr)
                cfg["floor_latency_runs"] = [measure_floor_latency(
                    floor, "fetch", size=cfg["size"], filler=os.urandom(cfg["size"]),
                    messages=a.latency_messages, rate_hz=a.latency_rate)
                    for _ in range(a.latency_repeats)]
    return out


# ---------------------------------------------------------------- peers

def run_peer(name: str, a: argparse.Namespace) -> dict[str, Any]:
    script = f"bench_{name}.py"
    extra = ["--api-messages", str(NATS_API_MESSAGES)] if name == "nats" else []
    out: dict[str, Any] = {"system": PEER_LABEL[name], "configs": []}
    with peer_running(name):
        for n, size, batch in a.configs:
            common = ["--size", str(size), "--phase-timeout", str(a.phase_timeout)]
            print(f"# {name} produce/consume {n:,} x {size} B, batch {batch}", file=sys.stderr)
            cfg = run_peer_script(script, ["--messages", str(n), "--batch", str(batch),
                                           "--phases", "produce,consume", *common, *extra])
            out["durability"] = cfg.get("durability")
            out["server_version"] = cfg.get("server_version")
            cfg["latency_runs"] = []
            cfg["latency_pull_runs"] = []
            for _ in range(a.latency_repeats):
                lat = run_peer_script(script, [
                    "--messages", "1", "--batch", "1", "--phases", "latency",
                    "--latency-messages", str(a.latency_messages),
                    "--latency-rate", str(a.latency_rate), *common])
                cfg["latency_runs"].append(lat.get("latency", {}))
                if "latency_pull" in lat:
                    cfg["latency_pull_runs"].append(lat["latency_pull"])
            out["configs"].append(cfg)
    return out


# ---------------------------------------------------------------- report

def _phase(system: dict[str, Any] | None, i: int, key: str) -> dict[str, Any]:
    if not system or i >= len(system["configs"]):
        return {}
    return system["configs"][i].get(key) or {}


def _best(system: dict[str, Any] | None, i: int, keys: list[str]) -> float | None:
    vals = [_phase(system, i, k).get("msgs_per_s") for k in keys]
    vals = [v for v in vals if v]
    return max(vals) if vals else None


def build_report(a: argparse.Namespace, ours: dict[str, Any],
                 peers: dict[str, dict[str, Any]]) -> tuple[str, list[Goal | Info]]:
    redis, nats = peers.get("redis"), peers.get("nats")
    tp_rows: list[list[str]] = []
    lat_rows: list[list[str]] = []
    goals: list[Goal | Info] = []
    for i, (n, size, batch) in enumerate(a.configs):
        shape = f"{n:,} x {size} B"
        redis_pub = _best(redis, i, ["produce"])
        nats_pub = _best(nats, i, ["produce"])
        redis_replay = _best(redis, i, ["consume"])
        nats_replay = _best(nats, i, ["consume", "consume_ordered"])
        rows = [
            ("npstream", f"publish {shape}, 10 MB tables from a generator/publish_batch, "
             f"ack={a.ack} (goal row)", _phase(ours, i, "produce_chunks"), redis_pub, nats_pub),
            ("npstream", f"publish {shape}, one table/publish_batch, ack={a.ack} (info)",
             _phase(ours, i, "produce_columnar"), redis_pub, nats_pub),
            ("npstream", f"publish {shape}, {batch} rows/publish_batch, ack={a.ack} (info)",
             _phase(ours, i, "produce"), redis_pub, nats_pub),
            ("npstream", f"publish {shape}, list of {batch} dicts/publish_batch, ack={a.ack}",
             _phase(ours, i, "produce_dicts"), redis_pub, nats_pub),
            ("redis-streams", f"publish {shape}, XADD pipelined {batch}, AOF everysec",
             _phase(redis, i, "produce"), redis_pub, nats_pub),
            ("nats-jetstream", f"publish {shape}, PubAck window {batch}, file store",
             _phase(nats, i, "produce"), redis_pub, nats_pub),
            ("npstream", f"replay {shape} into an Arrow table, local reads (same host)",
             _phase(ours, i, "consume"), redis_replay, nats_replay),
            ("npstream", f"replay {shape} into an Arrow table, over gRPC (ReadRange)",
             _phase(ours, i, "consume_grpc"), redis_replay, nats_replay),
            ("redis-streams", f"replay {shape}, XRANGE COUNT {batch}",
             _phase(redis, i, "consume"), redis_replay, nats_replay),
            ("redis-streams", f"replay {shape}, XREADGROUP + XACK",
             _phase(redis, i, "consume_group"), redis_replay, nats_replay),
            ("nats-jetstream", f"replay {shape}, ordered consumer",
             _phase(nats, i, "consume_ordered"), redis_replay, nats_replay),
            ("nats-jetstream", f"replay {shape}, pull consumer + ack",
             _phase(nats, i, "consume"), redis_replay, nats_replay),
        ]
        for system, config, ph, vs_redis, vs_nats in rows:
            if not ph:
                continue
            partial = " (partial)" if ph.get("partial") else ""
            tp_rows.append([system, config + partial, fmt(ph.get("msgs_per_s")),
                            fmt(ph.get("mb_per_s")), ratio(ph.get("msgs_per_s"), vs_redis),
                            ratio(ph.get("msgs_per_s"), vs_nats)])

        our_pub = _phase(ours, i, "produce_chunks").get("msgs_per_s")
        for peer_name, peer_value, goal_x, what, mine in [
            ("Redis Streams", redis_pub, GOAL_PUBLISH_X, "publish", our_pub),
            ("JetStream", nats_pub, GOAL_PUBLISH_X, "publish", our_pub),
            ("Redis Streams", redis_pub, GOAL_DICTS_X, "publish of dicts",
             _phase(ours, i, "produce_dicts").get("msgs_per_s")),
            ("Redis XRANGE", redis_replay, GOAL_REPLAY_X, "replay (local reads)",
             _phase(ours, i, "consume").get("msgs_per_s")),
            ("Redis XRANGE", redis_replay, GOAL_REPLAY_X, "replay (over gRPC)",
             _phase(ours, i, "consume_grpc").get("msgs_per_s")),
        ]:
            name = f"{what} {shape} >= {goal_x:g}x {peer_name}"
            if what == "publish":
                name += " (publish_batch of a generator of 10 MB tables)"
            elif what == "publish of dicts":
                name += f" XADD pipelined (publish_batch of {batch} dicts per call)"
            if not mine or not peer_value:
                goals.append(Goal(name, None, "not measured in this run"))
            else:
                goals.append(Goal(name, mine >= goal_x * peer_value,
                                  f"{mine / peer_value:.1f}x ({fmt(mine)} vs {fmt(peer_value)} "
                                  "msg/s)"))

        produce = _phase(ours, i, "produce")
        for key, how in (("consume", "local reads"), ("consume_grpc", "over gRPC")):
            consume = _phase(ours, i, key)
            if not (produce and consume):
                continue
            intact = (produce["stored"] == n and consume["offsets_ok"]
                      and consume["payload_bytes_ok"])
            goals.append(Goal(f"npstream stored and replayed all {shape} intact ({how})", intact,
                              f"stored {produce['stored']:,}, replayed {consume['messages']:,}, "
                              f"offsets 0..n-1 {'ok' if consume['offsets_ok'] else 'WRONG'}, "
                              f"payload bytes {'ok' if consume['payload_bytes_ok'] else 'WRONG'}"))
        for key, how in (("produce_chunks", "generator of tables"),
                         ("produce_columnar", "one-table call")):
            columnar = _phase(ours, i, key)
            if not columnar:
                continue
            intact = (columnar["stored"] == n and columnar["acked_offsets_ok"]
                      and columnar["offsets_ok"] and columnar["payload_ok"])
            goals.append(Goal(
                f"npstream stored and replayed all {shape} intact ({how})", intact,
                f"stored {columnar['stored']:,}, replayed {columnar['replayed']:,}, acked "
                f"offsets {'ok' if columnar['acked_offsets_ok'] else 'WRONG'}, stored offsets "
                f"0..n-1 {'ok' if columnar['offsets_ok'] else 'WRONG'}, every payload "
                f"{'ok' if columnar['payload_ok'] else 'WRONG'}"))
        lat_sets = [
            ("npstream", f"size {size}, fetch long-poll, ack={a.ack}",
             _runs(ours, i, "latency_runs")),
            ("grpc-floor", f"size {size}, trivial Python gRPC server, fetch long-poll",
             _runs(ours, i, "floor_latency_runs")),
            ("redis-streams", f"size {size}, XREAD BLOCK", _runs(redis, i, "latency_runs")),
            ("nats-jetstream", f"size {size}, push consumer", _runs(nats, i, "latency_runs")),
            ("nats-jetstream", f"size {size}, pull consumer",
             _runs(nats, i, "latency_pull_runs")),
        ]
        for system, config, runs in lat_sets:
            if runs:
                received = sum(r.get("received") or 0 for r in runs)
                sent = sum(r.get("sent") or 0 for r in runs)
                lat_rows.append([system, config, str(len(runs)),
                                 f"{received:,}/{sent:,}", fmt(median_of(runs, "p50_ms"), 2),
                                 fmt(median_of(runs, "p99_ms"), 2),
                                 fmt(median_of(runs, "max_ms"), 2)])
        our_p99 = median_of(_runs(ours, i, "latency_runs"), "p99_ms")
        nats_p99 = median_of(_runs(nats, i, "latency_runs"), "p99_ms")
        name = f"latency p99 (size {size}) <= JetStream push consumer's"
        if our_p99 is None or nats_p99 is None:
            goals.append(Goal(name, None, "not measured in this run"))
        else:
            goals.append(Goal(name, our_p99 <= nats_p99,
                              f"{our_p99:.2f} ms vs {nats_p99:.2f} ms (median of "
                              f"{a.latency_repeats} runs)"))
        if not a.skip_floor:
            goals.append(floor_info(median_of(_runs(ours, i, "floor_latency_runs"), "p99_ms"),
                                    nats_p99))

    text: list[str] = []
    if a.configs:
        text += [
            render_table(["system", "config", "msg/s", "MB/s", "vs Redis", "vs JetStream"],
                         tp_rows),
            "",
            f"publish-to-delivery latency at {a.latency_rate:g} msg/s, "
            f"{a.latency_messages:,} messages per run, median of runs (ms)",
            render_table(["system", "config", "runs", "received", "p50 ms", "p99 ms",
                          "max ms"], lat_rows),
            "",
        ]
    if ours.get("typed"):
        typed_text, typed_goals = typed_report(a, ours["typed"])
        text += [typed_text, ""]
        goals += typed_goals
    text += ["durability:", f"  npstream        {ours.get('durability', '-')}"]
    for key, system in peers.items():
        text.append(f"  {PEER_LABEL[key]:<15} {system.get('durability', '-')}")
    if a.configs:
        text.append("ratios: our msg/s over the peer's in this run; replay ratios use Redis "
                    "XRANGE and the faster JetStream consumer; publish goals use npstream's "
                    "generator-of-tables row (the other publish rows are informational)")
    return "\n".join(text), goals


def typed_report(a: argparse.Namespace,
                 typed: dict[str, Any]) -> tuple[str, list[Goal | Info]]:
    """The typed-stream publish table, its goal (time ratio vs untyped) and checks."""
    n, ph = typed["rows"], typed["phases"]
    json_row = ph["untyped_json"]["payload_bytes"] / n
    rows_spec = [
        ("untyped", f"binary value, the row's 5 fields packed, {ROW_BYTES} B (baseline)",
         "untyped_packed", "untyped_packed"),
        ("typed", f"struct value of the 5 columns, {ROW_BYTES} B by value_sizes (goal row)",
         "typed_struct", "untyped_packed"),
        ("untyped", f"JSON object bytes, {json_row:.1f} B avg (info baseline)",
         "untyped_json", "untyped_json"),
        ("typed", "the same JSON bytes, parsed by the broker (info)",
         "typed_json", "untyped_json"),
    ]
    rows = []
    for stream, sent, key, base in rows_spec:
        r, b = ph[key], ph[base]
        rows.append([stream, sent, fmt(r["msgs_per_s"]), fmt(r["mb_per_s"]),
                     f"{r['seconds']:.3f}", f"{r['seconds'] / b['seconds']:.2f}x"])
    header = (f"typed streams (issue 17): publish {n:,} rows x 5 columns ({typed['schema']}), "
              f"one publish_batch of a ready-made table per run, ack={typed['ack']}, median "
              f"of {typed['repeats']} run(s), round-robin")
    text = "\n".join([
        header,
        render_table(["stream", "value sent", "msg/s", "MB/s", "seconds", "time vs untyped"],
                     rows),
        "MB/s: payload bytes (a typed row counts its value_sizes bytes, as max_message_bytes "
        "does); time vs untyped: this row's median time over its baseline's",
    ])

    def paired(key: str, base: str) -> list[float]:
        return [r["seconds"] / b["seconds"]
                for r, b in zip(ph[key]["runs"], ph[base]["runs"], strict=True)]

    goals: list[Goal | Info] = []
    struct, packed = ph["typed_struct"], ph["untyped_packed"]
    x = struct["seconds"] / packed["seconds"]
    per_round = paired("typed_struct", "untyped_packed")
    detail = (f"{x:.2f}x ({struct['seconds']:.3f} s vs {packed['seconds']:.3f} s, "
              f"{fmt(struct['msgs_per_s'])} vs {fmt(packed['msgs_per_s'])} msg/s; per round "
              f"{min(per_round):.2f}-{max(per_round):.2f}x)")
    name = (f"typed publish {n:,} x 5 columns <= {GOAL_TYPED_PUBLISH_X:g}x the time of the "
            f"untyped publish of the same payload bytes")
    if a.quick:
        goals.append(Goal(name, None, detail + "; not judged at --quick sizes"))
    else:
        goals.append(Goal(name, x <= GOAL_TYPED_PUBLISH_X, detail))
    tj, uj = ph["typed_json"], ph["untyped_json"]
    goals.append(Info("JSON bytes into a typed stream vs the same JSON into an untyped stream",
                      f"{tj['seconds'] / uj['seconds']:.2f}x the time ({tj['seconds']:.3f} s vs "
                      f"{uj['seconds']:.3f} s)"))
    checks = {key: p["stored_ok"] and p["content_ok"] for key, p in ph.items()}
    goals.append(Goal(
        f"typed-stream publishes stored and read back all {n:,} rows intact",
        all(checks.values()),
        ", ".join(f"{key} {'ok' if ok else 'WRONG'}" for key, ok in checks.items())
        + " (every run's stored count and acked offsets; the first run's values read back)"))
    return text, goals


def _runs(system: dict[str, Any] | None, i: int, key: str) -> list[dict[str, Any]]:
    if not system or i >= len(system["configs"]):
        return []
    return [r for r in system["configs"][i].get(key, []) if r and r.get("p99_ms") is not None]


def main(argv: list[str] | None = None) -> int:
    return run_comparison(parse_args(argv), "npstream broker benchmark", run_peer, run_npstream,
                          build_report)


if __name__ == "__main__":
    sys.exit(main())
