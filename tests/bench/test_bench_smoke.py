"""Smoke test of bench/broker.py: the benchmark code must keep running against the real broker.

Not a performance test: it runs the quick configuration without peers and checks that the
table has our publish, replay and latency rows (and the gRPC floor's) with sane numbers, so
a contract change in the client or the broker shows up here instead of on the next
benchmark day.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness import REPO_ROOT

BENCH = REPO_ROOT / "bench" / "broker.py"


def _number(cell: str) -> float:
    return float(cell.replace(",", ""))


@pytest.mark.slow
def test_broker_bench_quick_without_peers_prints_our_rows(tmp_path: Path) -> None:
    raw = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--skip-peers", "--json", str(raw)],
        capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert re.search(r"^system\s+config\s+msg/s\s+MB/s\s+vs Redis\s+vs JetStream$", out, re.M)

    publish = re.findall(r"^npstream\s+publish (\S+) x (\d+) B, (\d+) rows/publish_batch, "
                         r"ack=fsync \(info\)\s+([\d,]+)\s+([\d.,]+)\s+-\s+-$", out, re.M)
    assert [(n, s, b) for n, s, b, _rate, _mb in publish] == [
        ("20,000", "100", "1000"), ("5,000", "1000", "500")]
    one_table = re.findall(r"^npstream\s+publish (\S+) x (\d+) B, one table/publish_batch, "
                           r"ack=fsync \(info\)\s+([\d,]+)\s+([\d.,]+)\s+-\s+-$",
                           out, re.M)
    assert [(n, s) for n, s, _rate, _mb in one_table] == [("20,000", "100"), ("5,000", "1000")]
    generator = re.findall(r"^npstream\s+publish (\S+) x (\d+) B, 10 MB tables from a "
                           r"generator/publish_batch, ack=fsync \(goal row\)\s+([\d,]+)\s+"
                           r"([\d.,]+)\s+-\s+-$", out, re.M)
    assert [(n, s) for n, s, _rate, _mb in generator] == [("20,000", "100"), ("5,000", "1000")]
    replay = re.findall(r"^npstream\s+replay (\S+) x (\d+) B into an Arrow table, "
                        r"(local reads \(same host\)|over gRPC \(ReadRange\))"
                        r"\s+([\d,]+)\s+([\d.,]+)", out, re.M)
    assert [(n, s, how[:5]) for n, s, how, _r, _mb in replay] == [
        ("20,000", "100", "local"), ("20,000", "100", "over "),
        ("5,000", "1000", "local"), ("5,000", "1000", "over ")]
    for size, msgs, mb in [(s, r, m) for _n, s, _b, r, m in publish] + [
            (s, r, m) for _n, s, r, m in one_table + generator]:
        assert _number(msgs) > 0
        assert _number(mb) == pytest.approx(_number(msgs) * int(size) / 1e6, rel=0.05, abs=0.1)

    latency = re.findall(r"^npstream\s+size (\d+), fetch long-poll, ack=fsync\s+1\s+"
                         r"(\d+)/(\d+)\s+([\d.]+)\s+([\d.]+)", out, re.M)
    assert [(size, got, sent) for size, got, sent, _p50, _p99 in latency] == [
        ("100", "200", "200"), ("1000", "200", "200")]
    assert all(0 < float(p50) <= float(p99) for *_x, p50, p99 in latency)
    # The transport floor: the same probe against a trivial Python gRPC server, one row
    # per size, and an INFO line (never a verdict) under each latency goal.
    floor = re.findall(r"^grpc-floor\s+size (\d+), trivial Python gRPC server, fetch "
                       r"long-poll\s+1\s+(\d+)/(\d+)\s+([\d.]+)\s+([\d.]+)", out, re.M)
    assert [(size, got, sent) for size, got, sent, _p50, _p99 in floor] == [
        ("100", "200", "200"), ("1000", "200", "200")]
    assert all(0 < float(p50) <= float(p99) for *_x, p50, p99 in floor)
    info = re.findall(r"^INFO  latency floor of Python gRPC on this machine \(trivial server, "
                      r"no storage, same probe\): p99 ([\d.]+) ms vs JetStream push not "
                      r"measured in this run$", out, re.M)
    assert [float(p99) for p99 in info] == [float(p99) for *_x, p99 in floor]
    # Typed streams (issue 17): the four publishes of 20,000 rows x 5 columns, each with
    # its time over its untyped baseline's; the 1.2x goal is not judged at --quick sizes.
    assert re.search(r"^typed streams \(issue 17\): publish 20,000 rows x 5 columns \(sensorId "
                     r"STRING, reading DOUBLE, ts TIMESTAMP, seq BIGINT, ok BOOLEAN\)", out, re.M)
    typed = re.findall(r"^(typed|untyped)\s+(binary value|struct value|JSON object bytes|the "
                       r"same JSON bytes)[^\n]*?\s+([\d,]+)\s+([\d.,]+)\s+([\d.]+)\s+"
                       r"([\d.]+)x$", out, re.M)
    assert [(kind, sent) for kind, sent, *_rest in typed] == [
        ("untyped", "binary value"), ("typed", "struct value"),
        ("untyped", "JSON object bytes"), ("typed", "the same JSON bytes")]
    assert all(_number(msgs) > 0 and float(secs) > 0 for _k, _s, msgs, _mb, secs, _x in typed)
    assert [x for *_rest, x in typed][0::2] == ["1.00", "1.00"]  # the baselines
    assert re.search(r"^N/A   typed publish 20,000 x 5 columns <= 1.2x the time of the untyped "
                     r"publish of the same payload bytes: [\d.]+x .*; not judged at --quick "
                     r"sizes$", out, re.M)
    assert re.search(r"^PASS  typed-stream publishes stored and read back all 20,000 rows "
                     r"intact: untyped_packed ok, typed_struct ok, untyped_json ok, "
                     r"typed_json ok", out, re.M)
    # Goals that need peers (and the typed publish ratio at --quick sizes) are reported as
    # not measured, never as passed; our own integrity checks pass.
    assert "FAIL" not in out
    assert out.count("N/A ") == 13
    dicts_goals = re.findall(r"^N/A   publish of dicts (\S+) x (\d+) B >= 5x Redis Streams XADD "
                             r"pipelined \(publish_batch of (\d+) dicts per call\): not "
                             r"measured in this run$", out, re.M)
    assert dicts_goals == [("20,000", "100", "1000"), ("5,000", "1000", "500")]
    dicts_rows = re.findall(r"^npstream\s+publish (\S+) x (\d+) B, list of (\d+) "
                            r"dicts/publish_batch, ack=fsync\s+([\d,]+)", out, re.M)
    assert [(n, s, b) for n, s, b, _rate in dicts_rows] == [
        ("20,000", "100", "1000"), ("5,000", "1000", "500")]
    assert all(_number(rate) > 0 for *_x, rate in dicts_rows)
    intact = re.findall(r"^PASS  npstream stored and replayed all (\S+) x (\d+) B intact "
                        r"\((local reads|over gRPC)\): "
                        r"stored \1, replayed \1, offsets 0..n-1 ok, payload bytes ok$",
                        out, re.M)
    assert intact == [("20,000", "100", "local reads"), ("20,000", "100", "over gRPC"),
                      ("5,000", "1000", "local reads"), ("5,000", "1000", "over gRPC")]
    assert re.findall(r"^PASS  npstream stored and replayed all (\S+) x (\d+) B intact "
                      r"\((generator of tables|one-table call)\): stored \1, replayed \1, "
                      r"acked offsets ok, stored offsets 0..n-1 ok, every payload ok$",
                      out, re.M) == [("20,000", "100", "generator of tables"),
                                     ("20,000", "100", "one-table call"),
                                     ("5,000", "1000", "generator of tables"),
                                     ("5,000", "1000", "one-table call")]

    result = json.loads(raw.read_text())
    configs = result["npstream"]["configs"]
    assert [c["produce"]["stored"] for c in configs] == [20_000, 5_000]
    assert [c["produce_columnar"]["stored"] for c in configs] == [20_000, 5_000]
    assert [c["produce_chunks"]["stored"] for c in configs] == [20_000, 5_000]
    assert all(c[key]["offsets_ok"] and c[key]["payload_bytes_ok"]
               for c in configs for key in ("consume", "consume_grpc"))
    assert [(c["consume"]["local_reads"], c["consume_grpc"]["local_reads"])
            for c in configs] == [(True, False), (True, False)]
    assert [[r["received"] for r in c["floor_latency_runs"]] for c in configs] == [[200], [200]]
    typed_phases = result["npstream"]["typed"]["phases"]
    assert sorted(typed_phases) == ["typed_json", "typed_struct", "untyped_json",
                                    "untyped_packed"]
    assert all(p["stored_ok"] and p["content_ok"] for p in typed_phases.values())
