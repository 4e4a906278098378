#!/usr/bin/env python3
"""The latency floor of Python gRPC on this machine: the same probe against a trivial server.

Why: our latency goal is "p99 no worse than JetStream's", and JetStream is a Go server
while npstream is a Python gRPC one. On a 2-core VM, grpcio itself costs a few hundred
microseconds of CPU per call on each side, so a Python gRPC broker cannot go below a
certain latency whatever its storage does. This module measures that floor in the same
run as our rows and the peers', so a reader can tell which part of a latency verdict is
the transport and which part is ours.

The server runs in a spawned child process: ``grpc.server`` on a ThreadPoolExecutor (as
our broker), generic handlers on raw bytes (no protobuf), no storage, bound to 127.0.0.1
on an ephemeral port, pinned to CPUs as our broker pins itself (``[server]
cpu_affinity``, default one CPU; ``NPSTREAM_CPU_AFFINITY`` applies to both). Its three
methods:

* ``Publish`` (unary): append the value to an in-memory list, wake the waiters, reply.
* ``Fetch`` (unary long-poll): from an offset, wait up to the request's wait for data,
  reply with up to ``max`` messages from that offset, length-prefixed (offset -1: reply
  with the end offset only, the consumer's starting point).
* ``Tail`` (server-streaming): one empty message once subscribed at the end of the log,
  then every new message as it arrives.
* ``Fill`` (unary): append ``count`` random messages of ``size`` bytes at once, so the
  batch-consumption floor (bench/group_batches.py) starts from a full log.
* ``FillKeyed`` and ``FetchRows`` (unary): the floor of ordering by key (issue 16).
  ``FillKeyed`` stores ``count`` keyed messages as Arrow batches of 10,000 rows with our
  stored columns (MESSAGE_SCHEMA: offset, id, key, value, timestamp, null headers), the
  keys those of our bench stream (bench_common.bench_keys); ``FetchRows`` hands out the
  next ``max`` rows as an Arrow IPC stream, as they are, or with the key rule applied
  (``_KeyedRows``). The rule's extra cost in this server is the least any server pays
  for it, so it bounds what ordering=key can reach next to our unordered rows.

The latency is measured by bench/latency_probe.probe_latency, exactly as for our broker:
same message count, rate, stamps, consumer process, ready/settle handshake and summary.
Consumers: ``fetch`` long-polls like latency_probe's ``fetch_batches`` consumer (same wait
and max messages); ``tail`` reads the stream like a subscriber (without acks).

    .venv/bin/python bench/transport_floor.py                # both consumers, 2000 messages
    .venv/bin/python bench/transport_floor.py --consumer tail --repeats 3
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import struct
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa
from bench_common import PUBLISH_BATCH, CpuMeter, bench_keys, rate, stamp_of
from latency_probe import FETCH_MAX_MESSAGES, FETCH_WAIT_S, probe_latency
from report import Info

__all__ = ["CONSUMERS", "FloorServer", "fill_keyed", "floor_info", "measure_floor_keyed",
           "measure_floor_latency"]

SERVICE = "npstream.bench.TransportFloor"
# Our broker's default thread pool (conf: server.max_workers).
SERVER_WORKERS = 64
# How long the parent waits for the server process to report its port.
SERVER_START_TIMEOUT_S = 60.0
# Grace for in-flight calls when the server stops.
SERVER_STOP_GRACE_S = 1.0
# Deadline of a unary call beyond its own long-poll wait.
CALL_MARGIN_S = 10.0
# How often an idle Tail handler checks that its caller is still there.
TAIL_IDLE_CHECK_S = 1.0

_FETCH_REQUEST = struct.Struct("<qId")  # offset (-1: end offset only), max messages, wait s
_OFFSET = struct.Struct("<q")           # Fetch reply header: the next offset to ask for
_LENGTH = struct.Struct("<I")           # Fetch reply: each message's length, then its bytes
_FILL_REQUEST = struct.Struct("<qI")    # Fill: message count, message bytes
_FILL_KEYED_REQUEST = struct.Struct("<qIIB")  # FillKeyed: count, bytes, keys, drawn at random
_FETCH_ROWS_REQUEST = struct.Struct("<IB")  # FetchRows: max messages, apply the key rule
# measure_floor_keyed: drains of the keyed rows per measurement, the fastest kept.
KEYED_DRAINS = 3


class _Log:
    """The server's whole state: a list of values and a condition to wait on."""

    def __init__(self) -> None:
        self.values: list[bytes] = []
        self.cond = threading.Condition()

    def publish(self, request: bytes, context: Any) -> bytes:
        with self.cond:
            self.values.append(request)
            self.cond.notify_all()
        return b""

    def fetch(self, request: bytes, context: Any) -> bytes:
        offset, max_messages, wait_s = _FETCH_REQUEST.unpack(request)
        with self.cond:
            if offset < 0:
                return _OFFSET.pack(len(self.values))
            deadline = time.monotonic() + wait_s
            while offset >= len(self.values):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.cond.wait(left)
            batch = self.values[offset:offset + max_messages]
        parts = [_OFFSET.pack(offset + len(batch))]
        for value in batch:
            parts += (_LENGTH.pack(len(value)), value)
        return b"".join(parts)

    def fill(self, request: bytes, context: Any) -> bytes:
        count, size = _FILL_REQUEST.unpack(request)
        value = os.urandom(size)
        with self.cond:
            self.values.extend([value] * count)
            self.cond.notify_all()
        return b""

    def tail(self, request: bytes, context: Any) -> Iterator[bytes]:
        with self.cond:
            position = len(self.values)
        yield b""  # subscribed: the caller may start its producer
        while context.is_active():
            with self.cond:
                while position >= len(self.values) and context.is_active():
                    self.cond.wait(TAIL_IDLE_CHECK_S)
                batch = self.values[position:]
            position += len(batch)
            yield from batch


class _KeyedRows:
    """Keyed messages as stored Arrow batches and one consumer's cursor over them.

    ``fetch_rows`` with the key rule hands out, of the rows held back by the last
    call followed by the next fresh ones, the first row of each key, and holds
    the others back for the next call. That is ordering=key's rule for a consumer
    that acks each batch by asking for the next (receive_batch(ack=previous)):
    every key delivered before is finished, so only repeats within the call wait.
    Done with the fewest Arrow kernels found: one ``dictionary_encode`` of the
    keys, a ``filter`` of the rows delivered and a ``take`` of the rows held (a
    filter of both, or a Python set of the keys, cost more). Nothing else:
    no storage, no leases, no acks.
    """

    def __init__(self) -> None:
        self.batches: list[pa.RecordBatch] = []
        self.count = 0
        self.position = 0
        self.held: pa.RecordBatch | None = None
        self.lock = threading.Lock()

    def fill(self, request: bytes, context: Any) -> bytes:
        from npstream.proto.schema import MESSAGE_SCHEMA

        count, size, keys, random_keys = _FILL_KEYED_REQUEST.unpack(request)
        names = bench_keys(count, keys, bool(random_keys))
        value = pa.array([os.urandom(size)] * min(count, PUBLISH_BATCH), pa.binary())
        stamp = MESSAGE_SCHEMA.field("timestamp").type
        batches = []
        for first in range(0, count, PUBLISH_BATCH):
            rows = min(PUBLISH_BATCH, count - first)
            batches.append(pa.RecordBatch.from_arrays([
                pa.array(np.arange(first, first + rows, dtype=np.int64)),
                pa.array([f"{offset:032x}" for offset in range(first, first + rows)]),
                pa.array(names[first:first + rows], pa.binary()),
                value.slice(0, rows),
                pa.array(np.full(rows, int(time.time() * 1000), np.int64)).cast(stamp),
                pa.nulls(rows, MESSAGE_SCHEMA.field("headers").type),
            ], schema=MESSAGE_SCHEMA))
        with self.lock:
            self.batches, self.count, self.position, self.held = batches, count, 0, None
        return b""

    def fetch_rows(self, request: bytes, context: Any) -> bytes:
        from npstream.proto.schema import MESSAGE_SCHEMA
        from npstream.proto.wire import arrow_stream_buffer

        max_messages, keyed = _FETCH_ROWS_REQUEST.unpack(request)
        if max_messages == 0:  # rewind: the next call starts again at offset 0
            with self.lock:
                self.position, self.held = 0, None
            return b""
        with self.lock:
            if not keyed:
                rows: pa.Table | pa.RecordBatch = pa.Table.from_batches(
                    self._fresh(max_messages), MESSAGE_SCHEMA)
            else:
                rows = self._ordered(max_messages)
        return arrow_stream_buffer(rows).to_pybytes()

    def _fresh(self, limit: int) -> list[pa.RecordBatch]:
        out = []
        while limit and self.position < self.count:
            batch = self.batches[self.position // PUBLISH_BATCH]
            start = self.position % PUBLISH_BATCH
            rows = min(limit, batch.num_rows - start)
            out.append(batch.slice(start, rows))
            self.position += rows
            limit -= rows
        return out

    def _ordered(self, limit: int) -> pa.RecordBatch | pa.Table:
        from npstream.proto.schema import MESSAGE_SCHEMA

        held = [self.held] if self.held is not None else []
        parts = held + self._fresh(limit - sum(len(part) for part in held))
        if not parts:
            return pa.Table.from_batches([], MESSAGE_SCHEMA)
        rows = (parts[0] if len(parts) == 1 else
                pa.Table.from_batches(parts).combine_chunks().to_batches()[0])
        index = rows.column("key").dictionary_encode().indices.to_numpy()
        first = np.empty(len(index), dtype=bool)
        first[0] = True
        first[1:] = index[1:] > np.maximum.accumulate(index)[:-1]
        later = np.flatnonzero(~first)
        self.held = rows.take(pa.array(later)) if len(later) else None
        return rows.filter(pa.array(first))


def _serve(port_q: Any, stop: Any) -> None:
    import grpc

    from npstream.broker.server.affinity import apply_cpu_affinity
    from npstream.broker.server.config import load_config

    apply_cpu_affinity(load_config(None).server.cpu_affinity)  # before the server's threads start
    log = _Log()
    keyed = _KeyedRows()
    server = grpc.server(ThreadPoolExecutor(max_workers=SERVER_WORKERS,
                                            thread_name_prefix="rpc"))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {
        "Publish": grpc.unary_unary_rpc_method_handler(log.publish),
        "Fetch": grpc.unary_unary_rpc_method_handler(log.fetch),
        "Tail": grpc.unary_stream_rpc_method_handler(log.tail),
        "Fill": grpc.unary_unary_rpc_method_handler(log.fill),
        "FillKeyed": grpc.unary_unary_rpc_method_handler(keyed.fill),
        "FetchRows": grpc.unary_unary_rpc_method_handler(keyed.fetch_rows),
    }),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    port_q.put(port)
    stop.wait()
    server.stop(SERVER_STOP_GRACE_S).wait()


class FloorServer:
    """The trivial server in a spawned process, as a context manager (``address``, ``pid``)."""

    def __init__(self) -> None:
        self.address = ""
        self._proc: Any = None
        self._stop: Any = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def __enter__(self) -> FloorServer:
        ctx = mp.get_context("spawn")
        port_q, self._stop = ctx.Queue(), ctx.Event()
        self._proc = ctx.Process(target=_serve, args=(port_q, self._stop), daemon=True)
        self._proc.start()
        try:
            port = port_q.get(timeout=SERVER_START_TIMEOUT_S)
        except Exception:
            self.__exit__()
            raise RuntimeError("transport-floor server did not start") from None
        self.address = f"127.0.0.1:{port}"
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._proc.join(SERVER_STOP_GRACE_S + 10)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(10)


def _fetch_consumer(address: str, n: int, limit_s: float, ready: Any, q: Any) -> None:
    import grpc

    lat: list[int] = []
    with grpc.insecure_channel(address) as channel:
        fetch = channel.unary_unary(f"/{SERVICE}/Fetch")
        reply = fetch(_FETCH_REQUEST.pack(-1, 0, 0.0), timeout=CALL_MARGIN_S)
        (offset,) = _OFFSET.unpack(reply)
        ready.set()
        end = time.monotonic() + limit_s
        while len(lat) < n and time.monotonic() < end:
            reply = fetch(_FETCH_REQUEST.pack(offset, FETCH_MAX_MESSAGES, FETCH_WAIT_S),
                          timeout=FETCH_WAIT_S + CALL_MARGIN_S)
            now = time.monotonic_ns()
            (offset,) = _OFFSET.unpack_from(reply, 0)
            pos = _OFFSET.size
            while pos < len(reply):
                (length,) = _LENGTH.unpack_from(reply, pos)
                pos += _LENGTH.size
                lat.append(now - stamp_of(reply[pos:pos + length]))
                pos += length
    q.put(lat)


def _tail_consumer(address: str, n: int, limit_s: float, ready: Any, q: Any) -> None:
    import grpc

    lat: list[int] = []
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_stream(f"/{SERVICE}/Tail")(b"")
        next(call)  # the server's empty message: subscribed at the end of the log
        ready.set()
        timer = threading.Timer(limit_s, call.cancel)
        timer.start()
        try:
            for value in call:
                lat.append(time.monotonic_ns() - stamp_of(value))
                if len(lat) >= n:
                    break
        except grpc.RpcError:  # cancelled at the time limit: report what arrived
            pass
        finally:
            timer.cancel()
            call.cancel()
    q.put(lat)


CONSUMERS = {
    "fetch": (_fetch_consumer, f"consumer process long-polling unary Fetch (wait "
              f"{FETCH_WAIT_S:g} s, max {FETCH_MAX_MESSAGES}); producer unary Publish; trivial "
              "Python gRPC server, no storage"),
    "tail": (_tail_consumer, "consumer process reading a server-streaming Tail; producer "
             "unary Publish; trivial Python gRPC server, no storage"),
}


def measure_floor_latency(server: FloorServer, consumer: str, *, size: int, filler: bytes,
                          messages: int, rate_hz: float) -> dict[str, Any]:
    """One latency run against ``server`` with the ``fetch`` or ``tail`` consumer.

    Besides latency_probe's summary, reports the CPU the producer process and the server
    process used per message over the run (all calls included: publishes, fetches or
    stream writes, the consumer's start-up calls).
    """
    import grpc

    target, method = CONSUMERS[consumer]
    with grpc.insecure_channel(server.address) as channel:
        publish = channel.unary_unary(f"/{SERVICE}/Publish")
        publish(filler[:size], timeout=CALL_MARGIN_S)  # connect before the timed run
        with CpuMeter(server.pid) as cpu:
            res = probe_latency(lambda value: publish(value, timeout=CALL_MARGIN_S), target,
                                (server.address,), size=size, filler=filler,
                                messages=messages, rate_hz=rate_hz, method=method)
    sent = res.get("sent") or 0
    if sent:
        res["producer_cpu_us_per_msg"] = round(cpu.client_s / sent * 1e6)
        if cpu.server_s is not None:
            res["server_cpu_us_per_msg"] = round(cpu.server_s / sent * 1e6)
    return res


def measure_floor_batches(server: FloorServer, n: int, size: int, batch: int) -> dict[str, Any]:
    """Batch consumption from the trivial server: Fetch ``batch`` messages per call, no acks.

    The throughput ceiling of a Python gRPC server handing out batches on this
    machine (no storage, no leases, no Arrow): one unary round trip per batch,
    as receive_batch(ack=previous) makes.
    """
    import grpc

    with grpc.insecure_channel(server.address) as channel:
        channel.unary_unary(f"/{SERVICE}/Fill")(_FILL_REQUEST.pack(n, size),
                                                 timeout=CALL_MARGIN_S)
        fetch = channel.unary_unary(f"/{SERVICE}/Fetch")
        offset = 0
        with CpuMeter(server.pid) as cpu:
            t0 = time.perf_counter()
            while offset < n:
                reply = fetch(_FETCH_REQUEST.pack(offset, batch, 0.0), timeout=CALL_MARGIN_S)
                (offset,) = _OFFSET.unpack_from(reply, 0)
            seconds = time.perf_counter() - t0
    res = rate(n, size, seconds)
    res.update(cpu.as_dict())
    res["method"] = (f"trivial Python gRPC server: Fetch {batch} length-prefixed messages per "
                     "unary call from memory, no storage, no acks")
    return res


def fill_keyed(server: FloorServer, n: int, size: int, keys: int, random_keys: bool) -> None:
    """Store the keyed rows ``FetchRows`` hands out (the same keys as our bench stream's)."""
    import grpc

    with grpc.insecure_channel(server.address) as channel:
        channel.unary_unary(f"/{SERVICE}/FillKeyed")(
            _FILL_KEYED_REQUEST.pack(n, size, keys, random_keys), timeout=SERVER_START_TIMEOUT_S)


def measure_floor_keyed(server: FloorServer, n: int, size: int, batch: int,
                        ordered: bool, drains: int = KEYED_DRAINS) -> dict[str, Any]:
    """Drain the rows of ``fill_keyed`` from the start in batches of ``batch``, each an
    Arrow IPC stream read into a table, with the key rule (``ordered``) or without.

    The fastest of ``drains`` drains: a floor is the least the work costs, and the
    machine's noise only ever adds to it (one drain of 200,000 rows takes ~0.2 s).
    """
    import grpc

    runs = []
    with grpc.insecure_channel(server.address) as channel:
        fetch = channel.unary_unary(f"/{SERVICE}/FetchRows")
        for _ in range(drains):
            fetch(_FETCH_ROWS_REQUEST.pack(0, 0), timeout=CALL_MARGIN_S)  # rewind
            got = calls = 0
            with CpuMeter(server.pid) as cpu:
                t0 = time.perf_counter()
                while got < n:
                    reply = fetch(_FETCH_ROWS_REQUEST.pack(batch, ordered),
                                  timeout=CALL_MARGIN_S)
                    rows = pa.ipc.open_stream(reply).read_all()
                    if not rows.num_rows:
                        break
                    got += rows.num_rows
                    calls += 1
                seconds = time.perf_counter() - t0
            res = rate(got, size, seconds)
            res.update(cpu.as_dict())
            res["calls"] = calls
            runs.append(res)
    best = max(runs, key=lambda r: r["msgs_per_s"])
    best["method"] = (f"trivial Python gRPC server: {batch} stored Arrow rows per unary call "
                      "as an IPC stream, no storage, no acks"
                      + (", the key rule applied (one dictionary_encode, a filter and a take "
                         "per call)" if ordered else "")
                      + f"; fastest of {drains} drains")
    return best


def floor_info(floor_p99: float | None, nats_p99: float | None) -> Info:
    """The INFO line under a latency goal: the Python gRPC floor next to JetStream's p99."""
    floor = f"{floor_p99:.2f} ms" if floor_p99 is not None else "not measured"
    nats = f"{nats_p99:.2f} ms" if nats_p99 is not None else "not measured in this run"
    return Info("latency floor of Python gRPC on this machine (trivial server, no storage, "
                "same probe)", f"p99 {floor} vs JetStream push {nats}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--consumer", choices=[*CONSUMERS, "both"], default="both")
    p.add_argument("--messages", type=int, default=2000)
    p.add_argument("--rate", type=float, default=1000.0, help="msg/s (default 1000)")
    p.add_argument("--size", type=int, default=100, help="payload bytes (>= 8)")
    p.add_argument("--repeats", type=int, default=1)
    a = p.parse_args(argv)
    if a.size < 8:
        p.error("--size must be >= 8 (the payload carries a timestamp)")
    filler = os.urandom(a.size)
    consumers = list(CONSUMERS) if a.consumer == "both" else [a.consumer]
    with FloorServer() as server:
        for consumer in consumers:
            for _ in range(a.repeats):
                res = measure_floor_latency(server, consumer, size=a.size, filler=filler,
                                            messages=a.messages, rate_hz=a.rate)
                print(json.dumps({"consumer": consumer, **res}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
