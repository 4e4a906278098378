"""Publish-to-fetch latency of npstream, measured the way the peers measure theirs.

A consumer process (own interpreter, own connection) long-polls ``Client.fetch_batches``
from the stream's end; the producer (this process) publishes single stamped messages with
``Client.publish`` at a fixed rate. Latency = consumer's monotonic clock on receipt minus
the stamp in the value's first 8 bytes.

``probe_latency`` is the producer side and the consumer handshake, shared with
bench/transport_floor.py, which runs the same probe against a trivial gRPC server.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Callable
from typing import Any

from bench_common import latency_summary, pct, stamp_of, stamped

__all__ = ["measure_fetch_latency", "probe_latency"]

# Long-poll length of each fetch (Redis' peer uses BLOCK 200 ms, JetStream's pull 1 s);
# it bounds how often an idle consumer re-asks, not the latency of a message that arrives.
FETCH_WAIT_S = 1.0
# Rows per fetch, as COUNT 100 / batch:100 in the peers' consumers.
FETCH_MAX_MESSAGES = 100
# Time for the consumer to enter its first long poll before the producer starts.
CONSUMER_SETTLE_S = 0.2


def _consumer(address: str, stream: str, n: int, limit_s: float, ready: Any, q: Any) -> None:
    from npstream import Client

    lat: list[int] = []
    with Client(address) as client:
        offset = client.stream_info(stream).end_offset
        ready.set()
        end = time.monotonic() + limit_s
        while len(lat) < n and time.monotonic() < end:
            batches, offset = client.fetch_batches(
                stream, offset, max_messages=FETCH_MAX_MESSAGES, wait=FETCH_WAIT_S)
            now = time.monotonic_ns()
            for batch in batches:
                lat.extend(now - stamp_of(v) for v in batch.column("value").to_pylist())
    q.put(lat)


def probe_latency(publish: Callable[[bytes], object], consumer: Callable[..., None],
                  consumer_args: tuple[Any, ...], *, size: int, filler: bytes, messages: int,
                  rate_hz: float, method: str) -> dict[str, Any]:
    """Publish ``messages`` stamped values at ``rate_hz``; a consumer process receives them.

    ``consumer`` runs in a spawned process as ``consumer(*consumer_args, n, limit_s,
    ready, q)``: it sets ``ready`` once it is positioned at the end of the log, then puts
    the list of latencies (ns) it measured on ``q``. ``publish`` sends one value and
    returns once it is acknowledged; its round trips are reported as ``produce_ack``.
    """
    ctx = mp.get_context("spawn")
    ready, q = ctx.Event(), ctx.Queue()
    limit = messages / rate_hz + 15
    proc = ctx.Process(target=consumer, args=(*consumer_args, messages, limit, ready, q),
                       daemon=True)
    proc.start()
    if not ready.wait(60):
        proc.terminate()
        return {"error": "latency consumer did not start"}
    time.sleep(CONSUMER_SETTLE_S)
    acks: list[int] = []
    t0 = time.monotonic()
    for i in range(messages):
        delay = t0 + i / rate_hz - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        value = stamped(size, filler)
        s = time.monotonic_ns()
        publish(value)
        acks.append(time.monotonic_ns() - s)
        if time.monotonic() - t0 > limit:
            break
    send_s = time.monotonic() - t0
    try:
        lat = q.get(timeout=limit + 10)
    except Exception:  # queue.Empty: the consumer died or timed out; report what we have
        lat = []
    proc.join(10)
    if proc.is_alive():
        proc.terminate()
    res = latency_summary(lat, len(acks), send_s, method)
    ack_ms = sorted(x / 1e6 for x in acks)
    if ack_ms:
        res["produce_ack"] = {"p50_ms": round(pct(ack_ms, 50) or 0.0, 3),
                              "p99_ms": round(pct(ack_ms, 99) or 0.0, 3)}
    return res


def measure_fetch_latency(client: Any, address: str, stream: str, *, size: int, filler: bytes,
                          messages: int, rate_hz: float, ack: str) -> dict[str, Any]:
    """Run one latency phase on ``stream`` (created empty by the caller)."""
    return probe_latency(
        lambda value: client.publish(stream, value, ack=ack), _consumer, (address, stream),
        size=size, filler=filler, messages=messages, rate_hz=rate_hz,
        method=f"consumer process long-polling fetch (wait {FETCH_WAIT_S:g} s, max "
               f"{FETCH_MAX_MESSAGES}); producer single publish(ack={ack})")
