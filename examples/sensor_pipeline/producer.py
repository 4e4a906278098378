"""Publish simulated sensor readings to a typed npstream stream.

Each reading is a record of READING_SCHEMA (``sensorId``, ``ts`` the event
time, ``value``, ``unit``), checked by the broker when it is published. A
share of the readings is invalid and a share is late (event time shifted
5-30 s into the past), so the Spark job's filtering and watermark have
something to do. Of the invalid ones, a value that is not a number does not
fit the schema and is refused by the broker (counted as rejected); a missing
value or a wrong unit fits it and is left to the Spark job to drop.

    python examples/sensor_pipeline/producer.py --rate 200 --duration 30
"""

from __future__ import annotations

import argparse
import logging
import math
import random
import sys
import time
import uuid
from datetime import UTC, datetime

from npstream import Client
from npstream.errors import ValueMismatch

log = logging.getLogger("sensor-producer")

SENSORS = [f"sensor-{i}" for i in range(1, 6)]
# The readings stream's value schema (docs/typed-streams.md).
READING_SCHEMA = "sensorId STRING NOT NULL, ts TIMESTAMP NOT NULL, value DOUBLE, unit STRING"


def make_reading(rng: random.Random, now_ms: int, invalid_ratio: float, late_ratio: float,
                 sensors: list[str]) -> dict:
    """One reading: the tutorial's noisy sine around 50, sometimes invalid or late."""
    reading: dict = {
        "sensorId": rng.choice(sensors),
        "ts": now_ms,
        "value": round(rng.random() * 100 + math.sin(now_ms / 10_000) * 20, 3),
        "unit": "celsius",
    }
    roll = rng.random()
    if roll < invalid_ratio:
        kind = rng.choice(["missing", "text", "unit"])
        if kind == "missing":
            del reading["value"]
        elif kind == "text":
            reading["value"] = "n/a"
        else:
            reading["unit"] = "fahrenheit?"
    elif roll < invalid_ratio + late_ratio:
        reading["ts"] = now_ms - rng.randint(5_000, 30_000)
    reading["ts"] = datetime.fromtimestamp(reading["ts"] / 1000, UTC)
    return reading


def publish(client: Client, stream: str, messages: list[dict]) -> int:
    """Publish one batch; readings that do not fit the schema are refused one by one.

    A refused message refuses its whole request, so the batch goes first
    without the readings that cannot fit (a value that is not a number), which
    are then sent alone to show the broker's refusal. Returns how many were
    refused.
    """
    fits = [m for m in messages if not isinstance(m["value"].get("value"), str)]
    client.publish_batch(stream, fits, ack="write")
    refused = 0
    for message in messages:
        if isinstance(message["value"].get("value"), str):
            try:
                client.publish(stream, message["value"], id=message["id"], key=message["key"])
            except ValueMismatch as exc:
                refused += 1
                log.debug("refused by the stream's schema: %s", exc)
    return refused


def run(broker: str, stream: str, rate: float, duration: float, invalid_ratio: float,
        late_ratio: float, seed: int | None, sensors: list[str]) -> int:
    """Publish at `rate` readings/s for `duration` seconds; returns the number stored."""
    rng = random.Random(seed)
    run_id = uuid.uuid4().hex[:8]
    sent = refused = 0
    batch_every = 0.1  # seconds: publish in small batches, 10 per second
    with Client(broker) as client:
        client.create_stream(stream, schema=READING_SCHEMA, exist_ok=True)
        start = time.monotonic()
        next_tick = start
        while time.monotonic() - start < duration:
            due = int((time.monotonic() - start) * rate) - sent
            if due > 0:
                now_ms = int(time.time() * 1000)
                readings = [
                    make_reading(rng, now_ms, invalid_ratio, late_ratio, sensors)
                    for _ in range(due)
                ]
                messages = [
                    {"id": f"{run_id}-{sent + i}", "key": r["sensorId"], "value": r}
                    for i, r in enumerate(readings)
                ]
                refused += publish(client, stream, messages)
                sent += due
            next_tick += batch_every
            time.sleep(max(0.0, next_tick - time.monotonic()))
    log.info("published %d readings to stream %s (%d refused by its schema)", sent - refused,
             stream, refused)
    return sent - refused


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", default=None, help="host:port (default: $NPSTREAM_BROKER "
                        "or localhost:7070)")
    parser.add_argument("--stream", default="sensor-readings")
    parser.add_argument("--rate", type=float, default=200.0, help="readings per second")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds to run")
    parser.add_argument("--sensors", type=int, default=len(SENSORS))
    parser.add_argument("--invalid-ratio", type=float, default=0.02)
    parser.add_argument("--late-ratio", type=float, default=0.02)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    sensors = [f"sensor-{i}" for i in range(1, args.sensors + 1)]
    run(args.broker, args.stream, args.rate, args.duration, args.invalid_ratio,
        args.late_ratio, args.seed, sensors)
    return 0


if __name__ == "__main__":
    sys.exit(main())
