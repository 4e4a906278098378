#!/usr/bin/env python3
"""Consumer-group benchmark: delivery latency vs JetStream and Redis, shared-group scaling.

    .venv/bin/python bench/groups.py                  # full run (1-7 min on 2 cores)
    .venv/bin/python bench/groups.py --quick --skip-peers

1. Publish-to-delivery latency p50/p99 of one subscribed group member, at --latency-rate
   msg/s: npstream ``Client.subscribe`` (handler acks every lease) vs a JetStream durable
   push consumer in a deliver group (AckExplicit, ack each) vs Redis ``XREADGROUP BLOCK``
   (+ XACK). Every system runs alone; the peer side is bench/peer_groups.py, run with the
   peers' interpreter. The median over --latency-repeats runs is reported. The same
   probe also runs against a trivial Python gRPC server (bench/transport_floor.py: same
   grpcio, no storage, a server-streaming Tail, no acks) after our broker has stopped: the
   floor any Python gRPC broker has on this machine, printed as a row and an INFO line
   under the latency goal (--skip-floor leaves it out).
2. Shared-group throughput: --messages messages are published once; then 1, 2 and 4
   consumer processes join a fresh group on that stream and ack every message; msg/s is
   messages over the time from the start signal until the last ack was handled, with the
   broker's and the machine's CPU use over the same interval.
3. Shared consumption in batches of --batch (bench/group_batches.py): one consumer drains
   --batch-messages x 100 B (and a fifth as many x 1 KB) with receive_batch(ack=previous),
   beside Redis XREADGROUP+XACK and a JetStream pull consumer + ack with the same counts,
   sizes and batch; and the broker's memory per message for --inflight-messages leased and
   not acked. --skip-batches leaves the section out.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing as mp
import os
import sys
import threading
import time
import uuid
from contextlib import nullcontext
from typing import Any

import pyarrow as pa
from bench_common import (
    PUBLISH_BATCH,
    BrokerUnderTest,
    CpuMeter,
    create_bench_stream,
    latency_summary,
    median_of,
    proc_cpu_s,
    rate,
    stamp_of,
    stamped,
)
from group_batches import (
    batch_report,
    floor_batches,
    inflight_memory,
    npstream_batches,
    peer_batches,
)
from peer_runner import peer_running, run_peer_script
from report import Goal, Info, fmt, render_table, run_comparison
from transport_floor import (
    FloorServer,
    fill_keyed,
    floor_info,
    measure_floor_keyed,
    measure_floor_latency,
)

# ---------------------------------------------------------------- tuning / run sizes
MESSAGES = 200_000             # shared-group throughput: messages drained per consumer count
QUICK_MESSAGES = 5_000
SIZE = 100                     # payload bytes
CONSUMER_COUNTS = (1, 2, 4)
MAX_IN_FLIGHT = 1000           # subscribe() credits per consumer (the client's default)
# Per latency run: a p99 of 2,000 is the 20th-highest delay, and the floor's moved
# 0.62-0.94 ms between runs (the goal's ratio 1.34-1.84x on unchanged code); of
# 5,000, three runs in a row gave 1.56-1.59x.
LATENCY_MESSAGES = 5000
QUICK_LATENCY_MESSAGES = 200
LATENCY_RATE = 1000.0
LATENCY_REPEATS = 3
DRAIN_TIMEOUT_S = 300.0        # cap for one throughput run
MEMBER_CHECK_S = 0.05          # how often a member process checks its subscription is alive
# "Busy": the broker process used at least this share of one core (its Python threads
# share a GIL), or the broker and the consumer processes together at least this share of
# all cores, during a run. When neither holds but the whole machine was this busy (other
# processes), the scaling goal is reported as inconclusive (N/A), not as a failure.
BUSY_SHARE = 0.9
# A step to more consumers counts as growth when msg/s rises by at least this factor.
GROWTH_FACTOR = 1.1
PEER_LABEL = {"redis": "redis-streams", "nats": "nats-jetstream"}
BATCH = 1000                   # section 3: messages per batch (receive and ack)
BATCH_MESSAGES = 1_000_000     # section 3: 100 B messages; 1 KB runs take a fifth as many
QUICK_BATCH_MESSAGES = 20_000
INFLIGHT_MESSAGES = 1_000_000  # section 3: messages leased and held for the memory row
QUICK_INFLIGHT_MESSAGES = 20_000
BATCH_SIZES = (100, 1000)
# Section 3 goals (issue 16): ours over the peer's msg/s, same run, same counts and sizes.
GOAL_VS_REDIS = 3.0
GOAL_VS_NATS = 5.0
GOAL_INFLIGHT_BYTES = 100
# Section 3's goals against the peers are judged on the median of this many paired
# rounds (ours with prefetch, then each peer, same counts and sizes, back to back):
# the section's single runs are minutes apart, and the machine's speed drifts more
# than that between them (the 1 KB ratio read 2.4x to 4.1x across runs of one day).
BATCH_ROUNDS = 3
ORDERING_KEYS = 10_000         # section 3: distinct keys of the ordering=key rows
# Section 3, information only: ordering=key against unordered with keys drawn at random
# from these many more keys, so the table shows how the cost follows the share of
# messages held (a batch of 1,000 repeats ~5% of its keys out of 10,000, ~0.05% out of
# 1,000,000).
MORE_RANDOM_KEYS = (100_000, 1_000_000)
# Issue 16's latency goal: group delivery p99 at 1,000 msg/s no worse than when the
# issue was filed (0.79 ms, with the pinned Python gRPC floor at 0.47 ms that day).
# Machines and days differ, so the goal is the ratio to the floor measured in the
# same run: p99 / floor p99 <= 0.79 / 0.47.
GOAL_P99_OVER_FLOOR = 0.79 / 0.47


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, help=f"messages per throughput run (default "
                   f"{MESSAGES:,}; --quick {QUICK_MESSAGES:,})")
    p.add_argument("--size", type=int, default=SIZE, help=f"payload bytes (default {SIZE})")
    p.add_argument("--consumers", default=",".join(map(str, CONSUMER_COUNTS)),
                   help="consumer process counts (default 1,2,4)")
    p.add_argument("--max-in-flight", type=int, default=MAX_IN_FLIGHT)
    p.add_argument("--latency-messages", type=int)
    p.add_argument("--latency-rate", type=float, default=LATENCY_RATE)
    p.add_argument("--latency-repeats", type=int)
    p.add_argument("--quick", action="store_true", help="small counts for a smoke run")
    p.add_argument("--skip-peers", action="store_true", help="measure npstream only")
    p.add_argument("--skip-floor", action="store_true",
                   help="leave out the trivial-gRPC-server latency row")
    p.add_argument("--peers", default="redis,nats")
    p.add_argument("--json", metavar="PATH", help="also write the raw results here")
    p.add_argument("--batch", type=int, default=BATCH, help="section 3: batch size")
    p.add_argument("--batch-messages", type=int, help="section 3: 100 B messages drained "
                   f"(default {BATCH_MESSAGES:,}; --quick {QUICK_BATCH_MESSAGES:,})")
    p.add_argument("--inflight-messages", type=int, help="section 3: messages held in flight "
                   f"(default {INFLIGHT_MESSAGES:,}; --quick {QUICK_INFLIGHT_MESSAGES:,})")
    p.add_argument("--batch-rounds", type=int, help="section 3: paired rounds (ours, then "
                   f"each peer) the peer goals are judged on (default {BATCH_ROUNDS}; --quick 1: "
                   "the single runs decide)")
    p.add_argument("--skip-batches", action="store_true", help="leave out section 3")
    p.add_argument("--skip-throughput", action="store_true", help="leave out section 2")
    p.add_argument("--skip-latency", action="store_true", help="leave out section 1")
    a = p.parse_args(argv)
    a.batch_messages = a.batch_messages or (QUICK_BATCH_MESSAGES if a.quick else BATCH_MESSAGES)
    a.inflight_messages = a.inflight_messages or (
        QUICK_INFLIGHT_MESSAGES if a.quick else INFLIGHT_MESSAGES)
    a.messages = a.messages or (QUICK_MESSAGES if a.quick else MESSAGES)
    a.batch_rounds = a.batch_rounds or (1 if a.quick else BATCH_ROUNDS)
    a.latency_messages = a.latency_messages or (
        QUICK_LATENCY_MESSAGES if a.quick else LATENCY_MESSAGES)
    a.latency_repeats = a.latency_repeats or (1 if a.quick else LATENCY_REPEATS)
    a.consumers = [int(x) for x in a.consumers.split(",") if x]
    a.peers = [x for x in a.peers.split(",") if x]
    if a.size < 8:
        p.error("--size must be >= 8 (the latency phase stores a timestamp in the payload)")
    if a.messages < 1 or not a.consumers or min(a.consumers) < 1:
        p.error("--messages and --consumers must be >= 1")
    if set(a.peers) - set(PEER_LABEL):
        p.error(f"unknown peer(s) {sorted(set(a.peers) - set(PEER_LABEL))}")
    return a


# ---------------------------------------------------------------- npstream: latency

def _latency_member(address: str, stream: str, group: str, n: int, limit_s: float,
                    max_in_flight: int, ready: Any, q: Any) -> None:
    from npstream import Client

    lat: list[int] = []
    with Client(address) as client:
        def handle(lease: Any) -> None:
            lat.append(time.monotonic_ns() - stamp_of(lease.value))
            lease.ack()

        sub = client.subscribe(stream, group, handle, max_in_flight=max_in_flight)
        ready.set()
        end = time.monotonic() + limit_s
        while len(lat) < n and time.monotonic() < end and sub.running:
            time.sleep(MEMBER_CHECK_S)
        error = None if sub.running else f"subscription ended: {sub.error!r}"
        sub.close()
        if error:
            q.put((lat, None, error))
            return
        info = client.describe_group(stream, group)
    q.put((lat, info.in_flight, info.committed_offset))


def npstream_latency(client: Any, address: str, a: argparse.Namespace, filler: bytes,
                     ) -> dict[str, Any]:
    stream = f"bench-grp-lat-{uuid.uuid4().hex[:8]}"
    create_bench_stream(client, stream)
    n = a.latency_messages
    limit = n / a.latency_rate + 15
    ctx = mp.get_context("spawn")
    ready, q = ctx.Event(), ctx.Queue()
    proc = ctx.Process(target=_latency_member, daemon=True,
                       args=(address, stream, "g", n, limit, a.max_in_flight, ready, q))
    proc.start()
    try:
        if not ready.wait(60):
            return {"error": "group member did not start"}
        time.sleep(0.2)
        sent = 0
        t0 = time.monotonic()
        for i in range(n):
            delay = t0 + i / a.latency_rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            client.publish(stream, stamped(a.size, filler), ack="fsync")
            sent += 1
        send_s = time.monotonic() - t0
        try:
            lat, in_flight, committed = q.get(timeout=limit + 10)
        except Exception:  # queue.Empty: the member died or timed out
            lat, in_flight, committed = [], None, None
        if isinstance(committed, str):
            return {"error": committed, "received": len(lat), "sent": sent}
        res = latency_summary(lat, sent, send_s, "subscribe() member process, handler acks "
                              "each lease; producer single publish(ack=fsync)")
        res["in_flight_after"] = in_flight
        res["committed_after"] = committed
        return res
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.terminate()
        client.delete_stream(stream)


# ---------------------------------------------------------------- npstream: shared throughput

def _throughput_member(index: int, address: str, stream: str, group: str, max_in_flight: int,
                       counts: Any, ready: Any, start: Any, stop: Any, errors: Any) -> None:
    from npstream import Client

    lock = threading.Lock()  # handlers run on the subscription's worker threads
    with Client(address) as client:
        def handle(lease: Any) -> None:
            lease.ack()
            with lock:
                counts[index] += 1  # this process's own slot: no cross-process lock needed

        ready.release()
        start.wait()
        sub = client.subscribe(stream, group, handle, max_in_flight=max_in_flight,
                               member_id=f"bench-{index}")
        while not stop.wait(MEMBER_CHECK_S):
            if not sub.running:
                errors.put(f"consumer {index}: subscription ended: {sub.error!r}")
                break
        sub.close()


def shared_throughput(client: Any, broker: BrokerUnderTest, stream: str, n: int, size: int,
                      consumers: int, max_in_flight: int) -> dict[str, Any]:
    group = f"bench-shared-{consumers}-{uuid.uuid4().hex[:6]}"
    ctx = mp.get_context("spawn")
    counts = ctx.RawArray("q", consumers)
    ready, start, stop = ctx.Semaphore(0), ctx.Event(), ctx.Event()
    errors = ctx.Queue()
    procs = [ctx.Process(target=_throughput_member, daemon=True,
                         args=(i, broker.address, stream, group, max_in_flight, counts, ready,
                               start, stop, errors)) for i in range(consumers)]
    for proc in procs:
        proc.start()
    for _ in procs:
        if not ready.acquire(timeout=60):
            stop.set()
            return {"error": "consumer processes did not start"}
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    members_cpu0 = [proc_cpu_s(proc.pid) or 0.0 for proc in procs]
    with CpuMeter(broker.pid) as cpu:
        t0 = time.perf_counter()
        start.set()
        while sum(counts) < n and time.monotonic() < deadline and errors.empty():
            time.sleep(0.005)
        seconds = time.perf_counter() - t0
    members_cpu = sum((proc_cpu_s(proc.pid) or 0.0) - c0
                      for proc, c0 in zip(procs, members_cpu0, strict=True))
    handled = sum(counts)
    stop.set()
    for proc in procs:
        proc.join(30)
        if proc.is_alive():
            proc.terminate()
    failures = []
    while not errors.empty():
        failures.append(errors.get())
    if failures:
        return {"consumers": consumers, "error": "; ".join(failures)}
    info = client.describe_group(stream, group)
    res = rate(min(handled, n), size, seconds)
    res.update(cpu.as_dict())
    res["consumers_cores_busy"] = round(members_cpu / seconds, 2) if seconds else None
    res["consumers"] = consumers
    res["handled_per_consumer"] = list(counts)
    res["handled"] = handled
    res["committed_after"] = info.committed_offset
    res["in_flight_after"] = info.in_flight
    res["all_acked"] = info.committed_offset == n and info.in_flight == 0
    res["partial"] = handled < n
    res["method"] = (f"{consumers} process(es), subscribe(max_in_flight={max_in_flight}), "
                     "handler acks every lease")
    client.delete_group(stream, group)
    return res


def run_npstream(a: argparse.Namespace) -> dict[str, Any]:
    from npstream import Client

    filler = os.urandom(a.size)
    out: dict[str, Any] = {"latency_runs": [], "throughput": [], "batches": [],
                           "inflight": None}
    with BrokerUnderTest() as broker, Client(broker.address) as client:
        if not a.skip_batches:
            for size in BATCH_SIZES:
                n = _batch_count(a, size)
                print(f"# npstream shared consumption {n:,} x {size} B, batch {a.batch}",
                      file=sys.stderr)
                out["batches"].append(npstream_batches(broker, client, n, size, a.batch))
                print(f"# npstream shared consumption {n:,} x {size} B, batch {a.batch}, "
                      "prefetched", file=sys.stderr)
                out.setdefault("prefetched", []).append(
                    npstream_batches(broker, client, n, size, a.batch, prefetch=True))
                print(f"# npstream shared consumption {n:,} x {size} B, batch {a.batch}, "
                      "simple loop", file=sys.stderr)
                out.setdefault("simple", []).append(
                    npstream_batches(broker, client, n, size, a.batch, simple=True))
            out["floor_batches"] = [floor_batches(_batch_count(a, size), size, a.batch)
                                    for size in BATCH_SIZES]
            keyed = _batch_count(a, BATCH_SIZES[0])
            # Paired rounds (unordered, then ordering=key, back to back): a single pair
            # swung between 0.73x and 1.04x on a quiet machine with no change between.
            for entry, random_keys in (("keyed", False), ("keyed_random", True)):
                count = keyed if not random_keys else keyed // 5  # ~5x slower ordered
                # Keys at random: each round also drains the same rows from the trivial
                # server, without and with the key rule (the rule's floor, INFO line).
                with FloorServer() if random_keys else nullcontext() as floor:
                    if floor is not None:
                        fill_keyed(floor, count, BATCH_SIZES[0], ORDERING_KEYS, True)
                    for round_ in range(a.batch_rounds):
                        print(f"# npstream keyed consumption {count:,} x {BATCH_SIZES[0]} B, "
                              f"{ORDERING_KEYS:,} keys{' at random' if random_keys else ''}, "
                              f"unordered and ordering=key, round {round_ + 1}/"
                              f"{a.batch_rounds}", file=sys.stderr)
                        out.setdefault(entry, []).append([npstream_batches(
                            broker, client, count, BATCH_SIZES[0], a.batch, ORDERING_KEYS,
                            ordering, random_keys=random_keys) for ordering in (None, "key")])
                        if floor is not None:
                            out.setdefault("floor_keyed_random", []).append([
                                measure_floor_keyed(floor, count, BATCH_SIZES[0], a.batch,
                                                    ordered) for ordered in (False, True)])
            for keys in MORE_RANDOM_KEYS:
                print(f"# npstream keyed consumption {keyed // 5:,} x {BATCH_SIZES[0]} B, "
                      f"{keys:,} keys at random, unordered and ordering=key", file=sys.stderr)
                out.setdefault("keyed_random_more", []).append([npstream_batches(
                    broker, client, keyed // 5, BATCH_SIZES[0], a.batch, keys, ordering,
                    random_keys=True) for ordering in (None, "key")])
            print(f"# npstream {a.inflight_messages:,} messages in flight", file=sys.stderr)
            out["inflight"] = inflight_memory(broker, client, a.inflight_messages, a.batch)
            if a.batch_rounds > 1 and not a.skip_peers:
                out["paired"] = paired_rounds(broker, client, a)
    with BrokerUnderTest() as broker, Client(broker.address) as client:
        for _ in range(0 if a.skip_latency else a.latency_repeats):
            print("# npstream group latency", file=sys.stderr)
            out["latency_runs"].append(npstream_latency(client, broker.address, a, filler))
        stream = f"bench-shared-{uuid.uuid4().hex[:8]}"
        create_bench_stream(client, stream)
        table = pa.table({"value": pa.array([filler] * min(PUBLISH_BATCH, a.messages),
                                            type=pa.binary())})
        sent = 0
        while sent < a.messages:
            k = min(table.num_rows, a.messages - sent)
            client.publish_batch(stream, table.slice(0, k), ack="write")
            sent += k
        for consumers in [] if a.skip_throughput else a.consumers:
            print(f"# npstream shared group, {consumers} consumer(s), {a.messages:,} messages",
                  file=sys.stderr)
            out["throughput"].append(shared_throughput(
                client, broker, stream, a.messages, a.size, consumers, a.max_in_flight))
    out["floor_latency_runs"] = []
    if not a.skip_floor and not a.skip_latency:
        with FloorServer() as floor:
            for _ in range(a.latency_repeats):
                print("# grpc-floor latency, server-streaming", file=sys.stderr)
                out["floor_latency_runs"].append(measure_floor_latency(
                    floor, "tail", size=a.size, filler=filler,
                    messages=a.latency_messages, rate_hz=a.latency_rate))
    return out


def paired_rounds(broker: BrokerUnderTest, client: Any,
                  a: argparse.Namespace) -> list[dict[str, list[float]]]:
    """Per batch size: msg/s of ours (receive_batches) and of each peer, round by round,
    each round ours then the peers back to back (see BATCH_ROUNDS)."""
    out: list[dict[str, list[float]]] = []
    for size in BATCH_SIZES:
        n = _batch_count(a, size)
        rates: dict[str, list[float]] = {"npstream": []}
        for round_ in range(a.batch_rounds):
            print(f"# paired round {round_ + 1}/{a.batch_rounds}, {n:,} x {size} B",
                  file=sys.stderr)
            ours = npstream_batches(broker, client, n, size, a.batch, prefetch=True)
            theirs = {}
            for name in a.peers:
                try:
                    theirs[name] = peer_batches(name, n, size, a.batch).get("msgs_per_s")
                except Exception as exc:  # a peer that fails leaves the single runs to decide
                    print(f"# {name} paired round failed: {exc}", file=sys.stderr)
                    theirs[name] = None
            if ours.get("msgs_per_s") and all(theirs.values()):
                rates["npstream"].append(ours["msgs_per_s"])
                for name, rate_ in theirs.items():
                    rates.setdefault(name, []).append(rate_)  # type: ignore[arg-type]
        out.append(rates)
    return out


# ---------------------------------------------------------------- peers

def run_peer(name: str, a: argparse.Namespace) -> dict[str, Any]:
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peer_groups.py")
    runs = []
    durability = None
    batches = ([peer_batches(name, _batch_count(a, size), size, a.batch)
                for size in BATCH_SIZES] if not a.skip_batches else [])
    with peer_running(name):
        for _ in range(0 if a.skip_latency else a.latency_repeats):
            print(f"# {name} group latency", file=sys.stderr)
            res = run_peer_script(script, [
                "--system", name, "--messages", "1", "--batch", "1", "--size", str(a.size),
                "--latency-messages", str(a.latency_messages),
                "--latency-rate", str(a.latency_rate)])
            durability = res.get("durability")
            runs.append(res.get("latency", {}))
    durability = durability or next((b.get("durability") for b in batches), None)
    return {"system": PEER_LABEL[name], "durability": durability, "latency_runs": runs,
            "batches": batches}


def _batch_count(a: argparse.Namespace, size: int) -> int:
    """Section 3's message count at ``size``: 1 KB runs move twice the bytes of 100 B runs."""
    return a.batch_messages if size <= 100 else max(a.batch, a.batch_messages // 5)


# ---------------------------------------------------------------- report

def _pressure(r: dict[str, Any]) -> str:
    pressure = r.get("cpu_pressure")
    return "-" if pressure is None else f"{pressure:.0%}"


def build_report(a: argparse.Namespace, ours: dict[str, Any],
                 peers: dict[str, dict[str, Any]]) -> tuple[str, list[Goal | Info]]:
    goals: list[Goal | Info] = []
    lat_rows = []
    sets = [("npstream", "subscribe(), ack each, publish ack=fsync", ours["latency_runs"])]
    if not a.skip_floor:
        sets.append(("grpc-floor", "trivial Python gRPC server, server-streaming push",
                     ours["floor_latency_runs"]))
    if "nats" in peers:
        sets.append(("nats-jetstream", "push consumer, deliver group, AckExplicit",
                     peers["nats"]["latency_runs"]))
    if "redis" in peers:
        sets.append(("redis-streams", "XREADGROUP BLOCK 200 + XACK",
                     peers["redis"]["latency_runs"]))
    errors = [f"{system} latency run failed: {r['error']}" for system, _c, runs in sets
              for r in runs if r and r.get("error")]
    for system, config, runs in sets:
        ok = [r for r in runs if r and r.get("p99_ms") is not None]
        if not ok:
            lat_rows.append([system, config, str(len(runs)), "-", "-", "-", "-"])
            continue
        received = sum(r["received"] for r in ok)
        sent = sum(r["sent"] for r in ok)
        lat_rows.append([system, config, str(len(ok)), f"{received:,}/{sent:,}",
                         fmt(median_of(ok, "p50_ms"), 2), fmt(median_of(ok, "p99_ms"), 2),
                         fmt(median_of(ok, "max_ms"), 2)])
    our_p99 = median_of([r for r in ours["latency_runs"] if r], "p99_ms")
    nats_p99 = median_of(peers["nats"]["latency_runs"], "p99_ms") if "nats" in peers else None
    name = "group delivery latency p99 <= JetStream push consumer's"
    if our_p99 is None or nats_p99 is None:
        goals.append(Goal(name, None, "not measured in this run"))
    else:
        goals.append(Goal(name, our_p99 <= nats_p99, f"{our_p99:.2f} ms vs {nats_p99:.2f} ms "
                          f"(median of {a.latency_repeats} runs)"))
    if not a.skip_floor and not a.skip_latency:
        floor_ok = [r for r in ours["floor_latency_runs"] if r and r.get("p99_ms") is not None]
        floor_p99 = median_of(floor_ok, "p99_ms")
        goals.append(floor_info(floor_p99, nats_p99))
        ratio = our_p99 / floor_p99 if our_p99 is not None and floor_p99 else None
        goals.append(Goal(
            "group delivery p99 at 1,000 msg/s no worse than at issue 16's filing, as a "
            f"multiple of the gRPC floor's p99 (0.79 / 0.47 ms = {GOAL_P99_OVER_FLOOR:.2f}x)",
            None if ratio is None else ratio <= GOAL_P99_OVER_FLOOR,
            "not measured in this run" if ratio is None else
            f"{ratio:.2f}x ({our_p99:.2f} ms vs floor {floor_p99:.2f} ms)"))

    tp_rows = []
    runs = [r for r in ours["throughput"] if "msgs_per_s" in r]
    base = runs[0]["msgs_per_s"] if runs else None
    for r in ours["throughput"]:
        if "msgs_per_s" not in r:
            tp_rows.append(["npstream", str(r.get("consumers", "-")), "failed", "", "", "", "",
                            "", "", ""])
            errors.append(f"npstream shared group, {r.get('consumers')} consumer(s): "
                          f"{r.get('error')}")
            continue
        tp_rows.append([
            "npstream", str(r["consumers"]), fmt(r["msgs_per_s"]), fmt(r["mb_per_s"]),
            f"{r['msgs_per_s'] / base:.2f}x" if base else "-",
            fmt(r["server_cores_busy"], 2), fmt(r["consumers_cores_busy"], 2),
            fmt(r["machine_cores_busy"], 2), _pressure(r),
            "yes" if r["all_acked"] else f"no ({r['committed_after']:,} committed, "
            f"{r['in_flight_after']} in flight)"])
    cores = os.cpu_count() or 1
    for prev, cur in itertools.pairwise(runs):
        grew = cur["msgs_per_s"] >= GROWTH_FACTOR * prev["msgs_per_s"]
        broker_busy = (prev["server_cores_busy"] or 0) >= BUSY_SHARE
        own_cores = (prev["server_cores_busy"] or 0) + (prev["consumers_cores_busy"] or 0)
        cores_full = own_cores >= BUSY_SHARE * cores
        # Other processes filling the machine starve ours: then a flat curve says nothing.
        crowded = prev["machine_cores_busy"] >= BUSY_SHARE * cores
        why = ("grew" if grew else "no growth, broker busy" if broker_busy
               else "no growth, broker + consumers filled the cores" if cores_full
               else "inconclusive: other processes kept the machine busy" if crowded
               else "no growth before the broker or the cores were busy")
        verdict = (True if grew or broker_busy or cores_full else None if crowded else False)
        goals.append(Goal(
            f"shared throughput {prev['consumers']} -> {cur['consumers']} consumers grows "
            "until the broker's cores are busy", verdict,
            f"{fmt(prev['msgs_per_s'])} -> {fmt(cur['msgs_per_s'])} msg/s ({why}; at "
            f"{prev['consumers']}: broker {prev['server_cores_busy']} cores, consumers "
            f"{prev['consumers_cores_busy']}, machine {prev['machine_cores_busy']}, of {cores})"))
    lost = [r for r in runs if not r["all_acked"]]
    failed = len(ours["throughput"]) - len(runs)
    if not a.skip_throughput:
        goals.append(Goal("every message acked in every throughput run",
                          not lost and not failed and bool(runs),
                          f"{failed} run(s) failed" if failed
                          else f"{len(lost)} run(s) left messages unacked" if lost
                          else "committed offset = messages, nothing in flight"))
    batch_text: list[str] = []
    if not a.skip_batches:
        batch_text, batch_goals = batch_report(
            BATCH_SIZES, a.batch, [_batch_count(a, size) for size in BATCH_SIZES], ours,
            peers, PEER_LABEL, {"redis": GOAL_VS_REDIS, "nats": GOAL_VS_NATS},
            GOAL_INFLIGHT_BYTES)
        goals += batch_goals
        redis = peers.get("redis", {}).get("batches", [])
        one = next((r for r in runs if r["consumers"] == 1), None)
        if not a.skip_throughput:
            redis_rate = redis[0].get("msgs_per_s") if redis else None
            goals.append(Goal(
                "subscribe() with one consumer >= Redis XREADGROUP+XACK (100 B)",
                None if one is None or redis_rate is None else one["msgs_per_s"] >= redis_rate,
                "not measured in this run" if one is None or redis_rate is None
                else f"{fmt(one['msgs_per_s'])} vs {fmt(redis_rate)} msg/s"))

    text = [
        f"publish-to-delivery latency of one group member at {a.latency_rate:g} msg/s, "
        f"{a.latency_messages:,} x {a.size} B per run, median of runs (ms)",
        render_table(["system", "config", "runs", "received", "p50 ms", "p99 ms", "max ms"],
                     lat_rows),
        "",
        f"shared group throughput: {a.messages:,} x {a.size} B, every message acked "
        f"(subscribe, max_in_flight {a.max_in_flight})",
        render_table(["system", "consumers", "msg/s", "MB/s", "vs 1", "broker cores",
                      "consumer cores", "machine cores", "cpu wait", "all acked"], tp_rows),
        "cores: CPU seconds per wall second during the run (machine: every process on it); "
        "cpu wait: share of the run in which some runnable thread waited for a core (PSI)",
        "",
        *batch_text,
        "",
        *errors,
        "durability: " + "; ".join(["npstream: publish ack=fsync"] + [
            f"{PEER_LABEL[k]}: {v.get('durability')}" for k, v in peers.items()]),
    ]
    return "\n".join(text), goals


def main(argv: list[str] | None = None) -> int:
    return run_comparison(parse_args(argv), "npstream consumer-group benchmark", run_peer,
                          run_npstream, build_report)


if __name__ == "__main__":
    sys.exit(main())
