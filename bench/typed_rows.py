"""The rows of the typed-stream benchmarks (issue 17), shared by broker.py and spark.py.

Five columns, a sensor reading as an IoT job would publish it:

    sensorId STRING, reading DOUBLE, ts TIMESTAMP, seq BIGINT, ok BOOLEAN

``sensor-0000`` .. ``sensor-0999`` take turns (row i is sensor i % 1000, its ``seq``
is i // 1000), ``ts`` is 2026-11-22T00:00:00Z plus i milliseconds (1,000 rows a second,
so 1,000,000 rows span 16m40s), ``reading`` is a temperature rounded to 2 decimals
(18-26), ``ok`` is false for about 5% of rows. Deterministic (seeded), no nulls.

Three encodings of the same rows:

* ``typed_values``: the ``value`` struct a typed stream stores (what ``publish_batch``
  sends to a typed stream);
* ``packed_values``: each row's five fields packed into one binary value of exactly
  ``ROW_BYTES`` (36) bytes: the 11-byte sensorId, reading, ts (microseconds), seq
  (little-endian 8 bytes each) and ok (1 byte). That is the number of bytes the
  contract counts for a typed record (``value_schema.value_sizes``: fixed-width fields
  their width, strings their bytes), so an untyped stream of these values carries the
  same payload bytes as the typed one, as the rows a user would otherwise serialize
  themselves (a fixed binary layout);
* ``json_values``: each row as a JSON object in bytes (~100 bytes), the format
  ``publish`` sends for a dict and the one a typed stream also accepts; what an
  untyped stream read with ``from_json`` carries.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["DDL", "ROW_BYTES", "SENSORS", "VALUE_TYPE", "json_values", "packed_values",
           "typed_table", "typed_values"]

DDL = "sensorId STRING, reading DOUBLE, ts TIMESTAMP, seq BIGINT, ok BOOLEAN"
VALUE_TYPE = pa.struct([
    pa.field("sensorId", pa.string()),
    pa.field("reading", pa.float64()),
    pa.field("ts", pa.timestamp("us", tz="UTC")),
    pa.field("seq", pa.int64()),
    pa.field("ok", pa.bool_()),
])
SENSORS = 1000
START_US = 1_795_305_600_000_000  # 2026-11-22T00:00:00Z
STEP_US = 1000                     # 1 ms between rows
SENSOR_ID_BYTES = 11               # "sensor-0042"
# value_sizes of one row: 11 (sensorId) + 8 + 8 + 8 + 1 (BOOLEAN counts 1).
ROW_BYTES = SENSOR_ID_BYTES + 8 + 8 + 8 + 1

_PACKED = np.dtype([("sensorId", f"S{SENSOR_ID_BYTES}"), ("reading", "<f8"), ("ts", "<i8"),
                    ("seq", "<i8"), ("ok", "u1")])
assert _PACKED.itemsize == ROW_BYTES


def _columns(n: int, seed: int = 17) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    i = np.arange(n, dtype=np.int64)
    sensor = i % SENSORS
    reading = np.round(22.0 + 2.0 * np.sin(i / 50_000.0 + sensor)
                       + rng.normal(0.0, 0.5, n), 2).clip(18.0, 26.0)
    return {
        "sensor": sensor,
        "reading": reading,
        "ts": START_US + i * STEP_US,
        "seq": i // SENSORS,
        "ok": rng.random(n) >= 0.05,
    }


def _sensor_ids(sensor: np.ndarray) -> pa.Array:
    names = pa.array([f"sensor-{k:04d}" for k in range(SENSORS)], pa.string())
    return names.take(pa.array(sensor))


def typed_values(n: int) -> pa.StructArray:
    """The ``n`` rows as the typed stream's value struct (``VALUE_TYPE``)."""
    c = _columns(n)
    return pa.StructArray.from_arrays(
        [_sensor_ids(c["sensor"]), pa.array(c["reading"], pa.float64()),
         pa.array(c["ts"], pa.int64()).cast(pa.timestamp("us", tz="UTC")),
         pa.array(c["seq"], pa.int64()), pa.array(c["ok"], pa.bool_())],
        fields=list(VALUE_TYPE))


def typed_table(n: int) -> pa.Table:
    """A publish table: only a ``value`` column holding the struct (ids generated)."""
    return pa.table({"value": typed_values(n)})


def packed_values(n: int) -> pa.Array:
    """The ``n`` rows as binary values of ``ROW_BYTES`` bytes each (the same payload bytes)."""
    c = _columns(n)
    rows = np.empty(n, dtype=_PACKED)
    names = np.array([f"sensor-{k:04d}".encode() for k in range(SENSORS)],
                     dtype=f"S{SENSOR_ID_BYTES}")
    rows["sensorId"] = names[c["sensor"]]
    rows["reading"] = c["reading"]
    rows["ts"] = c["ts"]
    rows["seq"] = c["seq"]
    rows["ok"] = c["ok"]
    fixed = pa.FixedSizeBinaryArray.from_buffers(pa.binary(ROW_BYTES), n,
                                                 [None, pa.py_buffer(rows.tobytes())])
    return fixed.cast(pa.binary())


def json_values(n: int) -> pa.Array:
    """The ``n`` rows as JSON objects in bytes (timestamps ISO-8601 in UTC, as value_struct
    reads them), built column-wise."""
    c = _columns(n)
    ts = pa.array(c["ts"], pa.int64()).cast(pa.timestamp("us", tz="UTC"))
    parts = [
        '{"sensorId":"', _sensor_ids(c["sensor"]),
        '","reading":', pc.cast(pa.array(c["reading"], pa.float64()), pa.string()),
        ',"ts":"', pc.strftime(ts, format="%Y-%m-%dT%H:%M:%S"),  # %S has the microseconds
        'Z","seq":', pc.cast(pa.array(c["seq"], pa.int64()), pa.string()),
        ',"ok":', pc.if_else(pa.array(c["ok"]), "true", "false"),
        "}",
    ]
    return pc.binary_join_element_wise(*parts, "").cast(pa.binary())
