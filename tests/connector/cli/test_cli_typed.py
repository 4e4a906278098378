"""The `npstream` command on typed streams: --schema, describe, produce checks, typed consume.

Subprocesses against a real broker process, as in test_cli.py.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import os
import subprocess
import sys

import pyarrow as pa
import pytest

from npstream.cli.consume import format_messages, typed_value_json
from npstream.client.values import ms_to_iso

READINGS = "sensorId STRING NOT NULL, reading DOUBLE"


def npstream(broker, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NPSTREAM_BROKER": broker.address}
    env.pop("NPSTREAM_TOKEN", None)
    return subprocess.run([sys.executable, "-m", "npstream.cli", *args], input=stdin,
                          capture_output=True, text=True, env=env, timeout=60)


# ---------------------------------------------------------------- streams create/update/describe


def test_create_with_schema_then_describe_shows_it(broker, client, stream_name):
    created = npstream(broker, "streams", "create", stream_name, "--schema", READINGS)
    assert created.returncode == 0, created.stderr
    info = client.stream_info(stream_name)
    assert info.value_schema is not None and info.value_schema.names == ["sensorId", "reading"]
    version = info.schema_versions[0]
    when = f"{ms_to_iso(version.created_ms)} ({version.created_ms} ms)"
    assert created.stdout.splitlines()[-2:] == [
        f"schema:             {READINGS} (version 1)",
        f"  version 1:        {when}  {READINGS}",
    ]
    described = npstream(broker, "streams", "describe", stream_name, "--json")
    assert described.returncode == 0, described.stderr
    data = json.loads(described.stdout)
    assert data == info.to_dict()
    assert data["value_schema"] == READINGS
    assert data["schema_versions"] == [{"version": 1, "ddl": READINGS,
                                        "created_ms": version.created_ms,
                                        "created": ms_to_iso(version.created_ms)}]


def test_describe_untyped_stream_says_so(broker, client, stream_name):
    client.create_stream(stream_name)
    described = npstream(broker, "streams", "describe", stream_name)
    assert described.returncode == 0, described.stderr
    assert "schema:             none (untyped: binary values)" in described.stdout.splitlines()
    data = json.loads(npstream(broker, "streams", "describe", stream_name, "--json").stdout)
    assert (data["value_schema"], data["schema_versions"]) == (None, [])


def test_create_with_spark_json_schema(broker, client, stream_name):
    spark_json = json.dumps({"type": "struct", "fields": [
        {"name": "n", "type": "long", "nullable": True, "metadata": {}}]})
    created = npstream(broker, "streams", "create", stream_name, "--schema", spark_json,
                       "--json")
    assert created.returncode == 0, created.stderr
    assert json.loads(created.stdout)["value_schema"] == "n BIGINT"


def test_update_schema_makes_a_version_and_refuses_an_incompatible_one(broker, client,
                                                                       stream_name):
    client.create_stream(stream_name, schema=READINGS)
    newer = READINGS + ", unit STRING"
    updated = npstream(broker, "streams", "update", stream_name, "--schema", newer)
    assert updated.returncode == 0, updated.stderr
    lines = updated.stdout.splitlines()
    assert f"schema:             {newer} (version 2)" in lines
    assert [line.split("  ")[-1] for line in lines if line.startswith("  version")] == [
        READINGS, newer]
    refused = npstream(broker, "streams", "update", stream_name, "--schema", "sensorId INT")
    assert refused.returncode == 1
    assert refused.stderr.startswith("npstream: error: ")
    assert "sensorId" in refused.stderr and refused.stderr.count("\n") == 1
    assert client.stream_info(stream_name).value_schema_ddl == newer


def test_update_settings_only_and_nothing_to_update(broker, client, stream_name):
    client.create_stream(stream_name)
    updated = npstream(broker, "streams", "update", stream_name, "--max-age", "1d", "--json")
    assert updated.returncode == 0, updated.stderr
    assert json.loads(updated.stdout)["config"]["max_age_ms"] == 86_400_000
    nothing = npstream(broker, "streams", "update", stream_name)
    assert (nothing.returncode, nothing.stderr) == (
        2, "npstream: error: nothing to update: give at least one of --max-age, --max-bytes, "
           "--dedup-window, --max-message-bytes, --schema\n")


def test_create_with_bad_schema_fails_naming_the_problem(broker, client, stream_name):
    result = npstream(broker, "streams", "create", stream_name, "--schema", "a INT, b FOO")
    assert result.returncode == 1
    assert result.stderr.startswith("npstream: error: ") and "FOO" in result.stderr
    assert result.stderr.count("\n") == 1


# ---------------------------------------------------------------- produce


def test_produce_checks_lines_and_consume_prints_typed_values(broker, client, stream_name,
                                                              tmp_path):
    client.create_stream(stream_name, schema=READINGS)
    source = tmp_path / "readings.jsonl"
    source.write_text('{"id": "r1", "sensorId": "s1", "reading": 21.5}\n\n'
                      '{"id": "r2", "sensorId": "s2"}\n')
    produced = npstream(broker, "produce", stream_name, str(source), "--id-field", "id")
    assert produced.returncode == 0, produced.stderr
    assert produced.stdout == (f"produced 2 message(s) to '{stream_name}': first offset 0, "
                               "last offset 1, 0 duplicate(s)\n")
    # The id field is the message id, not a value field (the schema has none of that name).
    table = client.fetch(stream_name, 0)
    assert table.column("id").to_pylist() == ["r1", "r2"]
    consumed = npstream(broker, "consume", stream_name)
    assert consumed.returncode == 0, consumed.stderr
    stamps = table.column("timestamp").cast("int64").to_pylist()
    assert consumed.stdout.splitlines() == [
        json.dumps({"offset": 0, "id": "r1", "key": None,
                    "value": {"sensorId": "s1", "reading": 21.5},
                    "timestamp": ms_to_iso(stamps[0]), "headers": {}}, ensure_ascii=False),
        json.dumps({"offset": 1, "id": "r2", "key": None,
                    "value": {"sensorId": "s2", "reading": None},
                    "timestamp": ms_to_iso(stamps[1]), "headers": {}}, ensure_ascii=False),
    ]


def test_produce_bad_line_names_line_field_and_type_and_sends_nothing_of_its_batch(
        broker, client, stream_name, tmp_path):
    client.create_stream(stream_name, schema=READINGS)
    good = [json.dumps({"sensorId": f"s{i}", "reading": i}) for i in range(4)]
    source = tmp_path / "r.jsonl"
    # Batches of 2: lines 1-2 go in; line 4 is bad, so nothing of lines 3-4 is sent.
    source.write_text("\n".join([*good[:3], '{"sensorId": "s3", "reading": "warm"}',
                                 good[3]]) + "\n")
    result = npstream(broker, "produce", stream_name, str(source), "--batch-size", "2")
    assert result.returncode == 1
    assert result.stdout == (f"produced 2 message(s) to '{stream_name}': first offset 0, "
                             "last offset 1, 0 duplicate(s)\n")
    assert result.stderr == (
        f"npstream: error: line 4 of {source}: field 'reading' is \"warm\"; expected DOUBLE "
        f"(stream '{stream_name}' is typed); nothing of lines 3..4 was produced; 2 message(s) "
        "before them were\n")
    assert client.stream_info(stream_name).end_offset == 2


def test_produce_missing_not_null_field_and_unknown_field(broker, client, stream_name):
    client.create_stream(stream_name, schema=READINGS)
    missing = npstream(broker, "produce", stream_name, stdin='{"reading": 1}\n')
    assert missing.returncode == 1
    assert missing.stderr == (
        "npstream: error: line 1 of stdin: field 'sensorId' is null (NOT NULL); expected STRING "
        f"(stream '{stream_name}' is typed); nothing of lines 1..1 was produced; 0 message(s) "
        "before them were\n")
    unknown = npstream(broker, "produce", stream_name,
                       stdin='{"sensorId": "a"}\n{"sensorId": "b", "colour": "red"}\n')
    assert unknown.returncode == 1
    assert unknown.stderr.startswith(
        "npstream: error: line 2 of stdin: field 'colour' is not in the schema; expected ")
    assert client.stream_info(stream_name).end_offset == 0


def test_produce_raw_into_typed_stream_is_refused(broker, client, stream_name):
    client.create_stream(stream_name, schema=READINGS)
    result = npstream(broker, "produce", stream_name, "--raw", stdin="x\n")
    assert (result.returncode, result.stderr) == (
        2, f"npstream: error: stream '{stream_name}' is typed: its values are records of its "
           "schema, given as JSON lines; drop --raw\n")


def test_produce_untyped_stream_unchanged(broker, client, stream_name):
    # Not created: the first publish creates it untyped; the line's bytes are the value.
    result = npstream(broker, "produce", stream_name, "--id-field", "id",
                      stdin='{"id": "a", "x": 1}\n')
    assert result.returncode == 0, result.stderr
    assert client.fetch(stream_name, 0).column("value").to_pylist() == [b'{"id": "a", "x": 1}']


def test_consume_round_trips_every_type_through_produce(broker, client, stream_name):
    schema = ("d DECIMAL(10, 2), day DATE, ts TIMESTAMP, tags ARRAY<STRING>, "
              "pos STRUCT<x: DOUBLE, y: DOUBLE>, attrs MAP<STRING, INT>, n BIGINT, f FLOAT, "
              "ok BOOLEAN, raw BINARY")
    client.create_stream(stream_name, schema=schema)
    record = {"d": decimal.Decimal("12.50"), "day": dt.date(2025, 3, 1),
              "ts": dt.datetime(2025, 3, 1, 12, 0, 0, 123456, tzinfo=dt.UTC),
              "tags": ["a", None], "pos": {"x": 1.0, "y": None}, "attrs": [("k", 3)],
              "n": 2**40, "f": 0.1, "ok": True, "raw": b"text"}
    client.publish(stream_name, {"d": 12.5, "day": "2025-03-01",
                                 "ts": "2025-03-01T12:00:00.123456Z", "tags": ["a", None],
                                 "pos": {"x": 1.0}, "attrs": {"k": 3}, "n": 2**40, "f": 0.1,
                                 "ok": True, "raw": "text"})
    expected = ('{"d": 12.50, "day": "2025-03-01", "ts": "2025-03-01T12:00:00.123456Z", '
                '"tags": ["a", null], "pos": {"x": 1.0, "y": null}, "attrs": {"k": 3}, '
                '"n": 1099511627776, "f": 0.1, "ok": true, "raw": "text"}')
    consumed = npstream(broker, "consume", stream_name)
    assert consumed.returncode == 0, consumed.stderr
    line = consumed.stdout.splitlines()[0]
    assert f'"value": {expected}, ' in line
    # What consume prints goes back in unchanged.
    again = npstream(broker, "produce", stream_name,
                     stdin=json.dumps(json.loads(line)["value"]) + "\n")
    assert again.returncode == 0, again.stderr
    values = client.fetch(stream_name, 0).column("value").to_pylist()
    assert values[1] == values[0]
    assert values[0]["d"] == record["d"] and values[0]["ts"] == record["ts"]


# ---------------------------------------------------------------- formatting (pure)


def test_typed_value_json_of_nested_and_special_values():
    value_type = pa.struct([
        pa.field("m", pa.map_(pa.int32(), pa.float64())),
        pa.field("md", pa.map_(pa.date32(), pa.int8())),
        pa.field("f", pa.float32()),
        pa.field("nan", pa.float64()),
        pa.field("bin", pa.binary()),
        pa.field("ts", pa.timestamp("us", tz="UTC")),
    ])
    row = pa.array([{"m": [(1, 2.0)], "md": [(dt.date(2025, 1, 2), 1)], "f": 0.1,
                     "nan": float("-inf"), "bin": b"\xff\x00",
                     "ts": dt.datetime(2025, 1, 1, tzinfo=dt.UTC)}], value_type).to_pylist()[0]
    assert typed_value_json(row, value_type) == (
        '{"m": {"1": 2.0}, "md": {"2025-01-02": 1}, "f": 0.1, "nan": "-Infinity", '
        '"bin": "/wA=", "ts": "2025-01-01T00:00:00.000Z"}')


@pytest.mark.parametrize("typed", [False, True])
def test_format_messages_matches_json_dumps_of_the_whole_line(typed):
    value = (pa.array([{"a": "ü"}], pa.struct([("a", pa.string())])) if typed
             else pa.array([b'{"a": "\xc3\xbc"}'], pa.binary()))
    batch = pa.RecordBatch.from_pydict({
        "offset": pa.array([3], pa.int64()), "id": ["i"], "key": pa.array([b"k"]),
        "value": value, "timestamp": pa.array([1000], pa.timestamp("ms", tz="UTC")),
        "headers": pa.array([[("h", b"v")]], pa.map_(pa.string(), pa.binary())),
    })
    assert format_messages(batch) == [json.dumps(
        {"offset": 3, "id": "i", "key": "k", "value": {"a": "ü"},
         "timestamp": "1970-01-01T00:00:01.000Z", "headers": {"h": "v"}}, ensure_ascii=False)]
