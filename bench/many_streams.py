#!/usr/bin/env python3
"""Streams as cheap as keys (issue 19): many streams on one broker, printed as a table of goals.

Phases, against one broker subprocess on a fresh data dir:

1. create: ``--streams`` streams, each by its first publish (one 5-byte message,
   ``--ack``), from one client process, two ways side by side: the first half over
   ``--calls`` PublishStream calls in parallel, each naming a new stream per request
   (a client sending one unary call at a time measures its own round trips; the
   ``floor`` row shows what a trivial Python gRPC server answers per request on this
   machine, the ceiling for any Python broker taking one request per stream), the
   second half with ``Client.publish_many`` (PublishMany: ``--many-entries`` streams
   per call, ``--many-calls`` calls in parallel), where one request carries many
   streams. The goal row takes the better of the two and says which.
2. memory: the broker's RSS before and after creating, and after a restart (every
   stream idle: what the broker holds per stream that nobody uses), per stream; the
   RSS right after creating also holds the freed heap glibc keeps for reuse
   (``retain_freed_memory``) and the ``max_open_logs`` logs the LRU keeps.
3. reload: messages published to and fetched from ``--reload`` streams created at
   the start (their log state long evicted), checked exactly.
4. listing: ``list_streams`` first page (1,000), a prefix and a glob listing of
   10,000 matches (page size 10,000; names are ``s-NNNNNNN``), timed.
5. restart: SIGTERM, start again on the same data dir; time until it serves, and
   after ``kill -9`` too. Then the data dir's bytes (allocated blocks).

    .venv/bin/python bench/many_streams.py                    # 100,000 streams
    .venv/bin/python bench/many_streams.py --streams 1000000  # the issue's size
    .venv/bin/python bench/many_streams.py --streams 2000 --json out.json

The machine is shared and has 2 cores: rates vary run to run (the load average is
printed with the table).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc

from npstream import Client
from npstream.proto import pb, pb_grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import machine_info

GOAL_CREATE_RATE = 5000.0  # streams/s by first publish, from one client
GOAL_IDLE_BYTES = 1024  # broker memory per idle stream
GOAL_RESTART_S = 30.0
GOAL_LISTING_S = 1.0  # a prefix/glob listing of 10,000 matches
LISTING_MATCHES = 10_000
START_TIMEOUT_S = 300.0
WINDOW = 64  # requests in flight per PublishStream call, as a producer with a window


def stream_name(i: int) -> str:
    return f"s-{i:07d}"


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def cpu_s(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def dir_bytes(path: Path) -> tuple[int, int]:
    """(allocated bytes, files) under ``path``: what the data dir costs on disk."""
    total = files = 0
    stack = [str(path)]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for entry in entries:
                st = entry.stat(follow_symlinks=False)
                total += st.st_blocks * 512
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                else:
                    files += 1
    return total, files


class Broker:
    """The broker as a subprocess on a given data dir (kept across restarts)."""

    def __init__(self, data_dir: Path, log_path: Path, extra_env: dict[str, str]) -> None:
        self.data_dir = data_dir
        self.log_path = log_path
        self.extra_env = extra_env
        self.proc: subprocess.Popen[bytes] | None = None
        self.address = ""

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> float:
        """Start and wait until it answers a ListStreams; seconds taken."""
        ready = self.data_dir.parent / "ready"
        ready.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "npstream.broker", "--data-dir", str(self.data_dir),
               "--host", "127.0.0.1", "--port", "0", "--ready-file", str(ready)]
        env = {**os.environ, "NPSTREAM_METRICS_PORT": "0", **self.extra_env}
        started = time.monotonic()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        while time.monotonic() - started < START_TIMEOUT_S:
            text = ready.read_text().strip() if ready.exists() else ""
            if text:
                self.address = text
                with grpc.insecure_channel(text) as channel:
                    pb_grpc.StreamServiceStub(channel).ListStreams(
                        pb.ListStreamsRequest(page_size=1), timeout=START_TIMEOUT_S)
                return time.monotonic() - started
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited with {self.proc.returncode}: "
                                   f"{self.log_path.read_text()[-2000:]}")
            time.sleep(0.02)
        raise TimeoutError("broker did not start")

    def stop(self, sig: int = signal.SIGTERM) -> float:
        """Stop with ``sig``; seconds until the process ended."""
        if self.proc is None or self.proc.poll() is not None:
            return 0.0
        started = time.monotonic()
        self.proc.send_signal(sig)
        try:
            self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        return time.monotonic() - started


def create_by_first_publish(address: str, names: list[str], calls: int, ack: int,
                            on_progress: Any = None) -> float:
    """Publish one message to each new stream over ``calls`` PublishStream calls; seconds."""
    errors: list[BaseException] = []
    done = [0]
    lock = threading.Lock()

    def one_call(part: list[str]) -> None:
        window = threading.Semaphore(WINDOW)  # requests in flight on this call

        def requests() -> Iterator[pb.PublishRequest]:
            for name in part:
                window.acquire()
                yield pb.PublishRequest(stream=name, messages=[pb.Message(value=b"hello")],
                                        ack=ack)

        try:
            with grpc.insecure_channel(address) as channel:
                stub = pb_grpc.StreamServiceStub(channel)
                for count, reply in enumerate(stub.PublishStream(requests()), 1):
                    window.release()
                    if reply.first_offset != 0 or reply.stored_count != 1:
                        raise AssertionError(f"unexpected reply {reply}")
                    if count % 1000 == 0:
                        with lock:
                            done[0] += 1000
                            if on_progress is not None:
                                on_progress(done[0])
                if count != len(part):
                    raise AssertionError(f"{count} replies for {len(part)} requests")
        except BaseException as exc:  # reported below
            errors.append(exc)

    parts = [names[k::calls] for k in range(calls)]
    started = time.monotonic()
    threads = [threading.Thread(target=one_call, args=(part,)) for part in parts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return time.monotonic() - started


def create_by_publish_many(address: str, names: list[str], calls: int, entries: int,
                           ack: str, on_progress: Any = None) -> float:
    """Publish one message to each new stream with Client.publish_many: ``entries`` names
    per call, ``calls`` calls in parallel on one client; seconds."""
    chunks = [names[i:i + entries] for i in range(0, len(names), entries)]
    done = [0]
    lock = threading.Lock()
    with Client(address) as client:

        def one(chunk: list[str]) -> None:
            results = client.publish_many([(name, b"hello") for name in chunk], ack=ack)
            bad = [r for r in results if r.error is not None or r.offset != 0]
            if bad:
                raise AssertionError(f"unexpected result {bad[0]}")
            with lock:
                before, done[0] = done[0], done[0] + len(chunk)
                if on_progress is not None and before // 1000 != done[0] // 1000:
                    on_progress(done[0] // 1000 * 1000)

        started = time.monotonic()
        with ThreadPoolExecutor(calls) as pool:
            list(pool.map(one, chunks))
        return time.monotonic() - started


def check_reload(address: str, names: list[str]) -> float:
    """Publish a second message to each (evicted) stream and fetch both back; seconds."""
    started = time.monotonic()
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.StreamServiceStub(channel)
        with ThreadPoolExecutor(16) as pool:
            def one(name: str) -> None:
                reply = stub.Publish(pb.PublishRequest(
                    stream=name, messages=[pb.Message(value=b"again")]), timeout=60)
                if reply.first_offset != 1:
                    raise AssertionError(f"{name}: second message at {reply.first_offset}")
                ends = stub.EndOffsets(pb.EndOffsetsRequest(streams=[name]), timeout=60)
                if [(s.start_offset, s.end_offset) for s in ends.streams] != [(0, 2)]:
                    raise AssertionError(f"{name}: offsets {ends}")
            list(pool.map(one, names))
    return time.monotonic() - started


def timed_listing(address: str, **request: Any) -> tuple[float, int]:
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.StreamServiceStub(channel)
        started = time.monotonic()
        reply = stub.ListStreams(pb.ListStreamsRequest(**request), timeout=300)
        return time.monotonic() - started, len(reply.streams)


def trivial_floor(seconds: float = 3.0) -> float:
    """Requests/s a trivial Python gRPC server answers on a streaming call (no storage)."""
    ctx = mp.get_context("spawn")
    ports: Any = ctx.Queue()
    server = ctx.Process(target=_floor_server, args=(ports,), daemon=True)
    server.start()
    try:
        port = ports.get(timeout=60)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.stream_stream("/floor.Floor/Echo")
            stop = time.monotonic() + seconds
            payload = pb.PublishRequest(stream="s-0000000",
                                        messages=[pb.Message(value=b"hello")]).SerializeToString()

            def requests() -> Iterator[bytes]:
                while time.monotonic() < stop:
                    yield payload

            started = time.monotonic()
            count = sum(1 for _ in call(requests()))
            return count / (time.monotonic() - started)
    finally:
        server.terminate()
        server.join(10)


def _floor_server(ports: Any) -> None:
    if hasattr(os, "sched_setaffinity"):  # pinned to one CPU, as the broker pins itself
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})

    def echo(requests: Iterator[bytes], _context: Any) -> Iterator[bytes]:
        for _ in requests:
            yield b"ok"

    handler = grpc.method_handlers_generic_handler(
        "floor.Floor", {"Echo": grpc.stream_stream_rpc_method_handler(echo)})
    server = grpc.server(ThreadPoolExecutor(8))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    ports.put(port)
    server.wait_for_termination()


def run(streams: int, *, calls: int = 8, ack: str = "fsync", reload: int = 1000,
        skip_floor: bool = False, work_dir: Path | None = None,
        extra_env: dict[str, str] | None = None, progress: bool = True,
        many_calls: int = 4, many_entries: int = 1000) -> dict[str, Any]:
    """All phases; the figures as a dict (``rows``: the table's goal rows)."""
    own_dir = work_dir is None
    base = Path(tempfile.mkdtemp(prefix="npstream-many-")) if own_dir else Path(work_dir)
    base.mkdir(parents=True, exist_ok=True)
    broker = Broker(base / "data", base / "broker.log", extra_env or {})
    ack_mode = pb.ACK_FSYNC if ack == "fsync" else pb.ACK_WRITE
    names = [stream_name(i) for i in range(streams)]
    figures: dict[str, Any] = {"machine": machine_info(), "streams": streams, "calls": calls,
                               "many_calls": many_calls, "many_entries": many_entries,
                               "ack": ack, "load_average": os.getloadavg()}
    try:
        broker.start()
        time.sleep(0.5)
        rss0 = rss_bytes(broker.pid)
        cpu0 = cpu_s(broker.pid)
        samples: queue.SimpleQueue[tuple[int, int]] = queue.SimpleQueue()
        half = streams // 2

        def on_progress(done: int) -> None:
            if done >= half and samples.empty():
                samples.put((done, rss_bytes(broker.pid)))
            if progress and done % max(streams // 10, 1000) == 0:
                print(f"  created {done:,} streams", file=sys.stderr, flush=True)

        by_stream, by_many = names[:half], names[half:]
        seconds = create_by_first_publish(broker.address, by_stream, calls, ack_mode,
                                          on_progress)
        cpu1 = cpu_s(broker.pid)
        many_s = create_by_publish_many(broker.address, by_many, many_calls, many_entries, ack,
                                        lambda done: on_progress(half + done))
        cpu2 = cpu_s(broker.pid)
        time.sleep(1.0)  # writes settle, freed logs go
        rss1 = rss_bytes(broker.pid)
        figures["create_s"] = seconds
        figures["create_rate"] = len(by_stream) / seconds
        figures["broker_user_us_per_stream"] = (cpu1[0] - cpu0[0]) / len(by_stream) * 1e6
        figures["broker_sys_us_per_stream"] = (cpu1[1] - cpu0[1]) / len(by_stream) * 1e6
        figures["many_create_s"] = many_s
        figures["many_create_rate"] = len(by_many) / many_s
        figures["many_user_us_per_stream"] = (cpu2[0] - cpu1[0]) / len(by_many) * 1e6
        figures["many_sys_us_per_stream"] = (cpu2[1] - cpu1[1]) / len(by_many) * 1e6
        figures["rss_before"] = rss0
        figures["rss_after"] = rss1
        figures["bytes_per_stream_avg"] = (rss1 - rss0) / streams
        if not samples.empty():
            done_half, rss_half = samples.get()
            figures["bytes_per_stream_slope"] = (rss1 - rss_half) / max(streams - done_half, 1)
        sample = random.Random(19).sample(names[: max(streams // 2, 1)],
                                          min(reload, max(streams // 2, 1)))
        figures["reload_s"] = check_reload(broker.address, sample)
        figures["reload_streams"] = len(sample)
        figures["list_first_page_s"], _ = timed_listing(broker.address, page_size=1000)
        if streams >= 2 * LISTING_MATCHES:
            prefix = stream_name(LISTING_MATCHES)[: -len(str(LISTING_MATCHES)) + 1]
            seconds, count = timed_listing(broker.address, prefix=prefix,
                                           page_size=LISTING_MATCHES)
            figures["list_prefix"] = (prefix, seconds, count)
            seconds, count = timed_listing(broker.address, pattern=prefix + "*",
                                           page_size=LISTING_MATCHES)
            figures["list_glob"] = (prefix + "*", seconds, count)
            # The first listing may read the 10,000 directories from disk; this one
            # finds them in the kernel's caches, like the glob above.
            seconds, count = timed_listing(broker.address, prefix=prefix,
                                           page_size=LISTING_MATCHES)
            figures["list_prefix_again"] = (prefix, seconds, count)
        figures["stop_s"] = broker.stop()
        figures["restart_s"] = broker.start()
        figures["rss_restarted"] = rss_bytes(broker.pid)
        broker.stop(signal.SIGKILL)
        figures["restart_after_kill_s"] = broker.start()
        ends = check_reload_after_restart(broker.address, sample[:100])
        figures["after_restart_ok"] = ends
        broker.stop()
        figures["data_dir_bytes"], figures["data_dir_files"] = dir_bytes(broker.data_dir)
    finally:
        broker.stop(signal.SIGKILL)
        if own_dir:
            subprocess.run(["rm", "-rf", str(base)], check=False)
    if not skip_floor:
        figures["floor_rate"] = trivial_floor()
    figures["rows"] = goal_rows(figures)
    return figures


def check_reload_after_restart(address: str, names: list[str]) -> bool:
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.StreamServiceStub(channel)
        ends = stub.EndOffsets(pb.EndOffsetsRequest(streams=names), timeout=120)
        return all((s.start_offset, s.end_offset) == (0, 2) for s in ends.streams)


def goal_rows(f: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(figure, measured, goal, verdict) rows; verdict PASS/FAIL/INFO."""
    def verdict(ok: bool) -> str:
        return "PASS" if ok else "FAIL"

    best, how = max((f["create_rate"], "one PublishStream request per stream"),
                    (f["many_create_rate"], "publish_many"))
    rows = [
        (f"streams created by first publish (1 msg each, ack={f['ack']}, best: {how})",
         f"{best:,.0f} streams/s", ">= 5,000/s", verdict(best >= GOAL_CREATE_RATE)),
        (f"  one request per stream: {f['calls']} PublishStream calls "
         f"({f['streams'] // 2:,} streams)", f"{f['create_rate']:,.0f} streams/s", "", "INFO"),
        ("    broker CPU per stream created", f"{f['broker_user_us_per_stream']:.0f} us user + "
         f"{f['broker_sys_us_per_stream']:.0f} us system", "", "INFO"),
    ]
    if "floor_rate" in f:
        rows.append(("    trivial Python gRPC server, same streaming call (no storage)",
                     f"{f['floor_rate']:,.0f} requests/s", "", "INFO"))
    rows += [
        (f"  publish_many: {f['many_entries']:,} streams per call, {f['many_calls']} calls "
         f"({f['streams'] - f['streams'] // 2:,} streams)",
         f"{f['many_create_rate']:,.0f} streams/s", "", "INFO"),
        ("    broker CPU per stream created", f"{f['many_user_us_per_stream']:.0f} us user + "
         f"{f['many_sys_us_per_stream']:.0f} us system", "", "INFO"),
    ]
    idle = (f["rss_restarted"] - f["rss_before"]) / f["streams"]
    rows += [
        ("broker memory per idle stream (RSS after restart - empty broker's)", f"{idle:,.0f} B",
         "< 1 KB", verdict(idle < GOAL_IDLE_BYTES)),
        ("  RSS before / after creating / after restart",
         f"{f['rss_before'] / 2**20:,.0f} / {f['rss_after'] / 2**20:,.0f} / "
         f"{f['rss_restarted'] / 2**20:,.0f} MiB (after creating: "
         f"{f['bytes_per_stream_avg']:,.0f} B/stream, 2nd half "
         f"{f.get('bytes_per_stream_slope', 0):,.0f} B/stream)",
         "", "INFO"),
        (f"evicted streams reloaded: publish + offsets of {f['reload_streams']:,}",
         f"{f['reload_s']:.2f} s, exact", "correct", "PASS"),
        ("list_streams first page (1,000)", f"{f['list_first_page_s']:.3f} s", "", "INFO"),
    ]
    for key, label in (("list_prefix", "prefix"), ("list_glob", "glob (same names, after)"),
                       ("list_prefix_again", "prefix again")):
        if key in f:
            what, seconds, count = f[key]
            rows.append((f"{label} listing '{what}' ({count:,} matches)", f"{seconds:.3f} s",
                         "< 1 s", verdict(seconds < GOAL_LISTING_S
                                          and count == LISTING_MATCHES)))
    rows += [
        ("restart (SIGTERM, start, first ListStreams answered)", f"{f['restart_s']:.2f} s",
         "< 30 s", verdict(f["restart_s"] < GOAL_RESTART_S)),
        ("restart after kill -9", f"{f['restart_after_kill_s']:.2f} s", "< 30 s",
         verdict(f["restart_after_kill_s"] < GOAL_RESTART_S)),
        ("  offsets right after the restarts", str(f["after_restart_ok"]), "True",
         verdict(f["after_restart_ok"])),
        ("data dir on disk", f"{f['data_dir_bytes'] / 2**20:,.0f} MiB, "
         f"{f['data_dir_files']:,} files ({f['data_dir_bytes'] / f['streams']:,.0f} B/stream)",
         "", "INFO"),
    ]
    return rows


def print_table(f: dict[str, Any]) -> None:
    m = f["machine"]
    print(f"npstream many streams, {m['date_utc']}, {m['cores']} cores, Python {m['python']}, "
          f"{f['streams']:,} streams, load average at start "
          f"{' '.join(f'{x:.1f}' for x in f['load_average'])}")
    rows = f["rows"]
    width = max(len(r[0]) for r in rows)
    mwidth = max(len(r[1]) for r in rows)
    for label, measured, goal, verdict in rows:
        print(f"{verdict:4}  {label:<{width}}  {measured:<{mwidth}}  {goal}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=100_000)
    parser.add_argument("--calls", type=int, default=8, help="PublishStream calls in parallel")
    parser.add_argument("--ack", choices=("fsync", "write"), default="fsync")
    parser.add_argument("--many-calls", type=int, default=4,
                        help="publish_many calls in parallel")
    parser.add_argument("--many-entries", type=int, default=1000,
                        help="streams per publish_many call")
    parser.add_argument("--reload", type=int, default=1000)
    parser.add_argument("--skip-floor", action="store_true")
    parser.add_argument("--work-dir", type=Path, help="keep the data dir here")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    figures = run(args.streams, calls=args.calls, ack=args.ack, reload=args.reload,
                  skip_floor=args.skip_floor, work_dir=args.work_dir,
                  many_calls=args.many_calls, many_entries=args.many_entries)
    print_table(figures)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2, default=str))


if __name__ == "__main__":
    main()
