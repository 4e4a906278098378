"""Shared-group consumption in batches, side by side with the peers (bench/groups.py section 3).

One consumer drains a stream through a shared group in batches of --batch (1,000) and
acks each batch, with the ack carried by the next request where the system allows it:

  npstream  client.receive_batch(max=B, ack=<previous batch>): one ReceiveBatch round trip
            per batch; the deliveries come as one Arrow batch, the ack as one offset range.
  redis     XREADGROUP COUNT B + XACK of the batch's ids pipelined with the next read
            (../shared/bench/peers/bench_redis.py, phase consume_group).
  nats      JetStream pull consumer, MSG.NEXT {batch: B}, msg.ack() on every message
            (bench_nats.py, phase consume).

Messages are published before the clock starts (not timed), at 100 B and 1 KB. The
memory row leases 1,000,000 messages without acking any and reports the broker's RSS
growth per message in flight.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
import uuid
from typing import Any

import pyarrow as pa
from bench_common import (
    PUBLISH_BATCH,
    BrokerUnderTest,
    CpuMeter,
    bench_keys,
    create_bench_stream,
    rate,
)
from peer_runner import PEERS, peer_running, peers_dir, run_peer_script
from report import Goal, Info
from transport_floor import FloorServer, measure_floor_batches

from npstream.groups.batch_stream import DEFAULT_PREFETCH

__all__ = ["floor_batches", "inflight_memory", "npstream_batches", "peer_batches"]

DRAIN_TIMEOUT_S = 300.0
# The everyday loop, receive_batch + ack() (two round trips a batch), vs Redis (issue 32).
GOAL_SIMPLE_LOOP_X = 3.0


def _fill(client: Any, stream: str, n: int, size: int, keys: int = 0,
          random_keys: bool = False) -> None:
    """n messages of ``size`` bytes; with ``keys``, keyed k0..k<keys-1> round-robin, or
    drawn at random (seeded, bench_keys): then a batch of 1,000 repeats some keys, and
    ordering=key holds those messages back until the one before them is acked."""
    create_bench_stream(client, stream)
    rows = min(PUBLISH_BATCH, n)
    value = pa.array([os.urandom(size)] * rows, type=pa.binary())
    names = bench_keys(n, keys, random_keys) if keys else []
    sent = 0
    while sent < n:
        k = min(rows, n - sent)
        columns = {"value": value.slice(0, k)}
        if keys:
            columns["key"] = pa.array(names[sent:sent + k], pa.binary())
        client.publish_batch(stream, pa.table(columns), ack="write")
        sent += k


def _rss_bytes(pid: int | None) -> int:
    if pid is None:
        return 0
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def npstream_batches(broker: BrokerUnderTest, client: Any, n: int, size: int,
                     batch: int, keys: int = 0, ordering: str | None = None,
                     prefetch: bool = False, random_keys: bool = False,
                     simple: bool = False) -> dict[str, Any]:
    """Drain n messages of one stream with receive_batch(ack=previous), or with
    receive_batches (its default prefetch: the next batches already asked for, each
    batch acked when the next is taken), or (``simple``) the everyday loop:
    receive_batch, then the batch's ack(), two round trips per batch."""
    stream = f"bench-batches-{uuid.uuid4().hex[:8]}"
    _fill(client, stream, n, size, keys, random_keys)
    group = "bench"
    got = 0
    current = None
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    client_cpu0 = time.process_time()
    with CpuMeter(broker.pid) as cpu:
        t0 = time.perf_counter()
        if prefetch:  # wait=0: the stream is filled, an empty batch means drained
            with client.receive_batches(stream, group, max=batch, wait=0, until_empty=True,
                                        ordering=ordering) as batches:
                for current in batches:
                    got += len(current)
                    if got >= n or time.monotonic() >= deadline:
                        current.ack()
                        break
        while simple and got < n and time.monotonic() < deadline:
            taken = client.receive_batch(stream, group, max=batch, wait=1.0, ordering=ordering)
            taken.ack()
            got += len(taken)
        while got < n and time.monotonic() < deadline:
            current = client.receive_batch(stream, group, max=batch, wait=1.0, ack=current,
                                           ordering=ordering)
            got += len(current)
        if current is not None:
            current.ack()
        seconds = time.perf_counter() - t0
    client_cpu = time.process_time() - client_cpu0
    info = client.describe_group(stream, group)
    res = rate(got, size, seconds)
    res.update(cpu.as_dict())
    res["client_cores_busy"] = round(client_cpu / seconds, 2) if seconds else None
    res["all_acked"] = info.committed_offset == n and info.in_flight == 0
    res["partial"] = got < n
    res["keys"] = keys
    res["method"] = ((f"receive_batches(max={batch}): {DEFAULT_PREFETCH} calls in flight "
                      "(prefetch), each batch acked when the next is taken" if prefetch else
                      f"receive_batch(max={batch}) then its ack(): two round trips per batch"
                      if simple else
                      f"receive_batch(max={batch}, ack=previous batch): one round trip per batch")
                     + (f", {keys:,} keys" if keys else "")
                     + (" drawn at random" if keys and random_keys else "")
                     + (f", ordering={ordering}" if ordering else ""))
    client.delete_stream(stream)
    return res


def inflight_memory(broker: BrokerUnderTest, client: Any, n: int, batch: int) -> dict[str, Any]:
    """Broker RSS growth per message leased and not acked, for n messages in flight."""
    stream = f"bench-inflight-{uuid.uuid4().hex[:8]}"
    _fill(client, stream, n, 100)
    held = []
    before = _rss_bytes(broker.pid)
    got = 0
    while got < n:
        leased = client.receive_batch(stream, "held", max=batch, wait=1.0, ack_wait=3600)
        if not len(leased):
            break
        held.append(leased)
        got += len(leased)
    after = _rss_bytes(broker.pid)
    info = client.describe_group(stream, "held")
    for leased in held:
        leased.ack()
    client.delete_stream(stream)
    return {"in_flight": info.in_flight, "rss_growth_bytes": after - before,
            "bytes_per_message": round((after - before) / max(1, info.in_flight), 1)}


def floor_batches(n: int, size: int, batch: int) -> dict[str, Any]:
    """The same drain from the trivial gRPC server (transport_floor.py): the transport's ceiling."""
    with FloorServer() as server:
        print(f"# grpc-floor batch consumption {n:,} x {size} B, batch {batch}",
              file=sys.stderr)
        return measure_floor_batches(server, n, size, batch)


def peer_batches(name: str, n: int, size: int, batch: int) -> dict[str, Any]:
    """The peer's batch-consumption phase (produce first, untimed)."""
    script = str(peers_dir() / PEERS[name][0])
    # bench_redis.py's "consume" phase runs XRANGE and then the group read (consume_group).
    result = "consume_group" if name == "redis" else "consume"
    with peer_running(name):
        print(f"# {name} shared consumption {n:,} x {size} B, batch {batch}", file=sys.stderr)
        res = run_peer_script(script, ["--messages", str(n), "--size", str(size),
                                       "--batch", str(batch), "--phases", "produce,consume"])
    return {**res.get(result, {}), "durability": res.get("durability")}


def keyed_row(label: str, size: int, r: dict[str, Any], note: str) -> list[str]:
    """A table row of a keyed run (unordered or ordering=key): no message count, no ratio."""
    from report import fmt

    return [label, f"{size} B", "-", fmt(r["msgs_per_s"]), fmt(r["mb_per_s"]), "-",
            fmt(r.get("server_cores_busy"), 2), "yes" if r.get("all_acked") else "no",
            r["method"] + note]


def _rule_cost_us(floor: list[dict[str, Any]]) -> float:
    """The trivial server's extra time per 1,000 messages with the key rule (us)."""
    free, ordered = floor
    return (1 / ordered["msgs_per_s"] - 1 / free["msgs_per_s"]) * 1e9


def _rule_ceiling(ours_free: dict[str, Any], floor: list[dict[str, Any]] | None) -> float | None:
    """The most ordering=key can reach next to our unordered run: its time per message
    plus the least the key rule costs (the trivial server's extra time, _rule_cost_us),
    over its time per message. None without a complete floor pair."""
    if floor is None or not all("msgs_per_s" in r for r in floor):
        return None
    ours_us = 1e9 / ours_free["msgs_per_s"]  # per 1,000 messages
    return ours_us / (ours_us + max(0.0, _rule_cost_us(floor)))


def batch_report(sizes: tuple[int, ...], batch: int, counts: list[int], ours: dict[str, Any],
                 peers: dict[str, dict[str, Any]], labels: dict[str, str],
                 goals_vs: dict[str, float], inflight_goal: int,
                 ) -> tuple[list[str], list[Goal | Info]]:
    """Section 3's table lines and its goal (and INFO) lines."""
    from report import fmt, render_table

    rows: list[list[str]] = []
    goals: list[Goal | Info] = []
    for i, size in enumerate(sizes):
        plain = ours["batches"][i] if i < len(ours["batches"]) else {}
        prefetched = ours.get("prefetched", [])
        ahead = prefetched[i] if i < len(prefetched) else {}
        rows.append(["npstream", f"{size} B", f"{counts[i]:,}", fmt(plain.get("msgs_per_s")),
                     fmt(plain.get("mb_per_s")), "1.00x", fmt(plain.get("server_cores_busy"), 2),
                     "yes" if plain.get("all_acked") else "no",
                     plain.get("method", plain.get("error", "failed"))])
        if ahead:
            rows.append(["npstream, prefetch", f"{size} B", f"{counts[i]:,}",
                         fmt(ahead.get("msgs_per_s")), fmt(ahead.get("mb_per_s")),
                         f"{ahead['msgs_per_s'] / plain['msgs_per_s']:.2f}x"
                         if ahead.get("msgs_per_s") and plain.get("msgs_per_s") else "-",
                         fmt(ahead.get("server_cores_busy"), 2),
                         "yes" if ahead.get("all_acked") else "no",
                         ahead.get("method", ahead.get("error", "failed"))])
        loop = ours.get("simple", [])
        simple = loop[i] if i < len(loop) else {}
        if simple:
            rows.append(["npstream, simple loop", f"{size} B", f"{counts[i]:,}",
                         fmt(simple.get("msgs_per_s")), fmt(simple.get("mb_per_s")),
                         f"{simple['msgs_per_s'] / plain['msgs_per_s']:.2f}x"
                         if simple.get("msgs_per_s") and plain.get("msgs_per_s") else "-",
                         fmt(simple.get("server_cores_busy"), 2),
                         "yes" if simple.get("all_acked") else "no",
                         simple.get("method", simple.get("error", "failed"))])
            redis_runs = peers.get("redis", {}).get("batches", [])
            redis = redis_runs[i] if i < len(redis_runs) else {}
            if redis.get("msgs_per_s") and simple.get("msgs_per_s"):
                x = simple["msgs_per_s"] / redis["msgs_per_s"]
                goals.append(Goal(f"simple loop (receive_batch(max={batch}) + ack()), {size} B: "
                                  f">= {GOAL_SIMPLE_LOOP_X:g}x Redis XREADGROUP + XACK",
                                  x >= GOAL_SIMPLE_LOOP_X,
                                  f"{x:.2f}x ({fmt(simple['msgs_per_s'])} vs "
                                  f"{fmt(redis['msgs_per_s'])} msg/s, single runs)"))
        # The goals take our better row of the two (both are one consumer, batches of `batch`).
        mine = max((plain, ahead), key=lambda r: r.get("msgs_per_s") or 0)
        floor = ours.get("floor_batches", [])
        if i < len(floor):
            f = floor[i]
            rows.append(["grpc-floor", f"{size} B", f"{counts[i]:,}", fmt(f.get("msgs_per_s")),
                         fmt(f.get("mb_per_s")),
                         f"{f['msgs_per_s'] / mine['msgs_per_s']:.2f}x"
                         if mine.get("msgs_per_s") and f.get("msgs_per_s") else "-",
                         fmt(f.get("server_cores_busy"), 2), "-", f.get("method", "")])
        for name, peer in peers.items():
            theirs = peer.get("batches", [])
            res = theirs[i] if i < len(theirs) else {}
            ratio = (mine["msgs_per_s"] / res["msgs_per_s"]
                     if mine.get("msgs_per_s") and res.get("msgs_per_s") else None)
            rows.append([labels[name], f"{size} B", f"{counts[i]:,}",
                         fmt(res.get("msgs_per_s")), fmt(res.get("mb_per_s")),
                         f"{1 / ratio:.2f}x" if ratio else "-",
                         fmt(res.get("server_cores_busy"), 2),
                         "yes" if res and not res.get("pending_after", 0)
                         and not res.get("ack_pending_after", 0) else "-",
                         res.get("method", "not measured")])
            goal = goals_vs.get(name)
            if goal is not None:
                way = "receive_batches" if mine is ahead else "receive_batch"
                single = ("not measured in this run" if ratio is None else
                          f"{ratio:.2f}x ({way}: {fmt(mine['msgs_per_s'])} vs "
                          f"{fmt(res['msgs_per_s'])} msg/s)")
                paired = ours.get("paired", [])
                rounds = paired[i] if i < len(paired) else {}
                ratios = [o / t for o, t in zip(rounds.get("npstream", []), rounds.get(name, []),
                                                strict=False)]
                if ratios:  # the paired rounds decide (groups.py, BATCH_ROUNDS)
                    median = statistics.median(ratios)
                    goals.append(Goal(f"shared consume + ack, batches of {batch}, {size} B: >= "
                                  f"{goal:g}x {labels[name]}", median >= goal,
                                  f"{median:.2f}x, median of {len(ratios)} paired rounds ("
                                  + ", ".join(f"{r:.2f}x" for r in ratios)
                                  + f"; receive_batches, ours then theirs back to back); "
                                  f"single runs above: {single}"))
                else:
                    goals.append(Goal(f"shared consume + ack, batches of {batch}, {size} B: >= "
                                  f"{goal:g}x {labels[name]}",
                                  None if ratio is None else ratio >= goal, single))
    for entry, how in (("keyed", "round-robin"), ("keyed_random", "drawn at random")):
        floors = ours.get(f"floor_{entry}") or []
        rounds = [(pair, floors[i] if i < len(floors) else None)
                  for i, pair in enumerate(ours.get(entry) or [])
                  if len(pair) == 2 and all("msgs_per_s" in r for r in pair)]
        if not rounds:
            continue
        ratios = [ordered["msgs_per_s"] / free["msgs_per_s"] for (free, ordered), _f in rounds]
        median = statistics.median_low(ratios)  # a round that was measured, not a mean of two
        (free, ordered), floor = rounds[ratios.index(median)]
        rows.append(keyed_row(f"npstream, keyed ({how})", sizes[0], free, ""))
        rows.append(keyed_row(f"npstream, ordering=key ({how})", sizes[0], ordered, ""))
        # Rounds with a complete floor pair: each one's bound and the rule's cost.
        bounded = [(ceiling, pair) for (ours_free, _o), pair in rounds
                   if (ceiling := _rule_ceiling(ours_free, pair)) is not None]
        ceilings = [ceiling for ceiling, _pair in bounded]
        detail = (f"{median:.2f}x ({fmt(ordered['msgs_per_s'])} vs "
                  f"{fmt(free['msgs_per_s'])} msg/s), "
                  + (f"median of {len(ratios)} paired rounds ("
                     + ", ".join(f"{r:.2f}x" for r in ratios) + "; unordered, then "
                     "ordering=key, back to back; the rows above are that round)"
                     if len(ratios) > 1 else "one round"))
        if ceilings:
            detail += (f"; the key rule's floor leaves at most "
                       f"{statistics.median_low(ceilings):.2f}x (INFO below)")
        goals.append(Goal(f"ordering=key with many keys ({how}) within 20% of unordered "
                          "(same keyed data)", median >= 0.8, detail))
        if floor is not None and _rule_ceiling(free, floor) is not None:
            for label, r in zip(("keyed", "key rule"), floor, strict=True):
                rows.append([f"grpc-floor, {label} ({how})", f"{sizes[0]} B", "-",
                             fmt(r["msgs_per_s"]), fmt(r["mb_per_s"]), "-",
                             fmt(r.get("server_cores_busy"), 2), "-", r["method"]])
        if ceilings:
            extras = [_rule_cost_us(pair) for _ceiling, pair in bounded]
            goals.append(Info(
                f"ordering=key's floor ({how})",
                "the trivial gRPC server, same rows, spends "
                f"{statistics.median_low(extras):.0f} us more per 1,000 messages with the key "
                "rule than without (rounds: " + ", ".join(f"{x:.0f}" for x in extras)
                + "); on top of our unordered round's time per 1,000 messages that leaves "
                f"ordering=key at most {statistics.median_low(ceilings):.2f}x (rounds: "
                + ", ".join(f"{c:.2f}x" for c in ceilings) + ")"))
    more = [pair for pair in ours.get("keyed_random_more") or []
            if all("msgs_per_s" in r for r in pair)]
    for free, ordered in more:
        how = f"{free['keys']:,} keys at random"
        rows.append(keyed_row(f"npstream, keyed ({how})", sizes[0], free, ""))
        rows.append(keyed_row(f"npstream, ordering=key ({how})", sizes[0], ordered,
                              f"; {ordered['msgs_per_s'] / free['msgs_per_s']:.2f}x the "
                              "unordered row above (information)"))
    held = ours.get("inflight")
    if held:
        goals.append(Goal(f"memory per message in flight < {inflight_goal} B",
                      held["bytes_per_message"] < inflight_goal,
                      f"{held['bytes_per_message']} B ({held['in_flight']:,} leased, broker RSS "
                      f"+{held['rss_growth_bytes'] / 1e6:.1f} MB)"))
    text = [f"shared consumption in batches of {batch}, one consumer, every message acked",
            render_table(["system", "size", "messages", "msg/s", "MB/s", "vs npstream",
                          "server cores", "all acked", "method"], rows)]
    return text, goals
