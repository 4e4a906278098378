#!/usr/bin/env python3
"""Peer side of bench/groups.py: publish-to-delivery latency of a consumer *group* member.

Run with the peers' interpreter (/tmp/peersvenv/bin/python) and the peers folder on
PYTHONPATH (bench/peer_runner.py does both); the peers' own scripts measure plain reads
only, not group delivery, so this script adds that phase with the same method
(peers_common: stamped payloads, a consumer process, a paced single-message producer):

  redis  consumer process in XREADGROUP GROUP g c1 BLOCK 200 COUNT 100, XACK of every
         delivered id before the next read; producer single XADD.
  nats   durable push consumer with a deliver group (queue "g"), AckExplicit, callback
         that acks every message; producer single js.publish (awaits the PubAck).

  python peer_groups.py --system redis --messages 1 --size 100 --batch 1
         [--latency-messages 2000 --latency-rate 1000]   -> one JSON line
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import time
import uuid
from typing import Any

from peers_common import emit, latency_summary, parse_args, payload, stamp_of, stamped

REDIS = ("127.0.0.1", 6390)
NATS_URL = "nats://127.0.0.1:4223"
# As in the peers' scripts: a few ms for the consumer to enter its blocking read.
CONSUMER_SETTLE_S = 0.2


# ---------------------------------------------------------------- redis

def _redis_consumer(key: str, n: int, limit_s: float, ready: Any, q: Any) -> None:
    import redis

    r = redis.Redis(host=REDIS[0], port=REDIS[1])
    r.xgroup_create(key, "g", id="$", mkstream=True)
    lat: list[int] = []
    ready.set()
    end = time.monotonic() + limit_s
    while len(lat) < n and time.monotonic() < end:
        resp = r.xreadgroup("g", "c1", {key: ">"}, count=100, block=200)
        now = time.monotonic_ns()
        ids = []
        for _stream, entries in resp or []:
            for mid, fields in entries:
                lat.append(now - stamp_of(fields[b"d"]))
                ids.append(mid)
        if ids:
            r.xack(key, "g", *ids)
    pending = r.xpending(key, "g")["pending"]
    q.put((lat, pending))
    r.close()


def redis_latency(a: Any) -> dict[str, Any]:
    import redis

    r = redis.Redis(host=REDIS[0], port=REDIS[1])
    key = f"bench:grp:{uuid.uuid4().hex}"
    data = payload(a.size)
    n = a.latency_messages
    limit = n / a.latency_rate + 15
    ctx = mp.get_context("spawn")
    ready, q = ctx.Event(), ctx.Queue()
    p = ctx.Process(target=_redis_consumer, args=(key, n, limit, ready, q), daemon=True)
    p.start()
    if not ready.wait(30):
        p.terminate()
        return {"error": "group consumer did not start"}
    time.sleep(CONSUMER_SETTLE_S)
    sent = 0
    t0 = time.monotonic()
    for i in range(n):
        d = t0 + i / a.latency_rate - time.monotonic()
        if d > 0:
            time.sleep(d)
        r.xadd(key, {"d": stamped(a.size, data)})
        sent += 1
    send_s = time.monotonic() - t0
    try:
        lat, pending = q.get(timeout=limit + 10)
    except Exception:  # queue.Empty: consumer died; report nothing received
        lat, pending = [], None
    p.join(10)
    if p.is_alive():
        p.terminate()
    r.delete(key)
    res = latency_summary(lat, sent, send_s, "XREADGROUP BLOCK 200 COUNT 100 + XACK each "
                          "batch, consumer process; producer single XADD")
    res["pending_after"] = pending
    return res


# ---------------------------------------------------------------- nats

def _nats_consumer(stream: str, subj: str, n: int, limit_s: float, ready: Any, q: Any) -> None:
    async def run() -> list[int]:
        import nats
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        nc = await nats.connect(NATS_URL, allow_reconnect=False, max_reconnect_attempts=0)
        js = nc.jetstream()
        lat: list[int] = []
        done = asyncio.Event()

        async def cb(m: Any) -> None:
            lat.append(time.monotonic_ns() - stamp_of(m.data))
            await m.ack()
            if len(lat) >= n:
                done.set()

        cfg = ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, deliver_policy=DeliverPolicy.ALL)
        sub = await js.subscribe(subj, queue="g", durable="g", stream=stream, cb=cb,
                                 manual_ack=True, config=cfg)
        await nc.flush()
        ready.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), timeout=limit_s)
        await nc.flush()
        await sub.unsubscribe()
        await nc.close()
        return lat

    q.put((asyncio.run(run()), None))


async def _nats_latency(a: Any) -> dict[str, Any]:
    import nats
    from nats.js.api import StorageType, StreamConfig

    nc = await nats.connect(NATS_URL, allow_reconnect=False, max_reconnect_attempts=0)
    js = nc.jetstream()
    stream = f"BENCH_GRP_{uuid.uuid4().hex[:12]}"
    subj = f"bench.{stream.lower()}"
    await js.add_stream(StreamConfig(name=stream, subjects=[subj], storage=StorageType.FILE))
    data = payload(a.size)
    n = a.latency_messages
    limit = n / a.latency_rate + 15
    ctx = mp.get_context("spawn")
    ready, q = ctx.Event(), ctx.Queue()
    p = ctx.Process(target=_nats_consumer, args=(stream, subj, n, limit, ready, q), daemon=True)
    p.start()
    loop = asyncio.get_running_loop()
    try:
        if not await loop.run_in_executor(None, ready.wait, 30):
            p.terminate()
            return {"error": "group consumer did not start"}
        await asyncio.sleep(CONSUMER_SETTLE_S)
        sent = 0
        t0 = time.monotonic()
        for i in range(n):
            d = t0 + i / a.latency_rate - time.monotonic()
            if d > 0:
                await asyncio.sleep(d)
            await js.publish(subj, stamped(a.size, data))
            sent += 1
        send_s = time.monotonic() - t0
        try:
            lat, _ = await loop.run_in_executor(None, q.get, True, limit + 10)
        except Exception:  # queue.Empty: consumer died; report nothing received
            lat = []
        await loop.run_in_executor(None, p.join, 10)
        if p.is_alive():
            p.terminate()
        info = await js.consumer_info(stream, "g")
        res = latency_summary(lat, sent, send_s, "durable push consumer, deliver group g, "
                              "AckExplicit, ack each in the callback; producer single js.publish")
        res["pending_after"] = info.num_ack_pending
        return res
    finally:
        await js.delete_stream(stream)
        await nc.close()


def main() -> None:
    def extra(p: Any) -> None:
        p.add_argument("--system", choices=["redis", "nats"], required=True)

    a = parse_args(__doc__.splitlines()[0], extra)
    if a.system == "redis":
        out = {"peer": "redis-streams", "latency": redis_latency(a),
               "durability": "appendonly yes, appendfsync everysec"}
    else:
        out = {"peer": "nats-jetstream", "latency": asyncio.run(_nats_latency(a)),
               "durability": "file storage, server default sync (fsync every 2 min), R1"}
    emit(out)


if __name__ == "__main__":
    main()
