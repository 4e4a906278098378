"""Unit tests of the writer's option and schema checks, sink ids and request chunking."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql.types import (
    BinaryType,
    DayTimeIntervalType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from npstream.errors import SinkConflict
from npstream.proto.value_schema import to_ddl
from npstream.spark.checkpoint import check_planned_batches, checkpoint_dir
from npstream.spark.options import InvalidOptionError
from npstream.spark.writer import (
    NpstreamCommitMessage,
    _chunks,
    _staging_ids,
    make_batch_writer,
    make_stream_writer,
)
from npstream.spark.writer_options import (
    WRITER_OPTIONS,
    parse_write_options,
)

VALUE_ONLY = StructType([StructField("value", StringType())])
READER_SCHEMA = StructType([
    StructField("stream", StringType()), StructField("offset", LongType()),
    StructField("id", StringType()), StructField("key", BinaryType()),
    StructField("value", BinaryType()), StructField("timestamp", TimestampType()),
    StructField("headers", MapType(StringType(), BinaryType())),
])


def test_writer_options_lists_every_documented_name():
    expected = {"broker", "token", "tls", "tlsRootCertificates", "tlsClientCertificate",
                "tlsClientKey", "stream", "sinkId",
                "stageBytes", "createStream", "localStaging", "checkpointLocation", "queryName"}
    assert set(WRITER_OPTIONS) == expected


QUERY_ID = "8bc9f2af-bcc0-43d2-a8dc-0f061cb3e56e"


def make_checkpoint(path: Path, query_id: str = QUERY_ID) -> Path:
    """A checkpoint as Spark leaves it once the query started: its metadata file."""
    path.mkdir(parents=True)
    (path / "metadata").write_text(json.dumps({"id": query_id}) + "\n")
    return path


def test_parse_stream_sink_id_is_the_checkpoints_query_id(tmp_path, monkeypatch):
    checkpoint = make_checkpoint(tmp_path / "ck")
    (tmp_path / "link").symlink_to(checkpoint)
    monkeypatch.chdir(tmp_path)
    for location in (str(checkpoint), f"file://{checkpoint}", f"file:{checkpoint}/", "ck",
                     str(tmp_path / "link")):
        writer = parse_write_options({"checkpointlocation": location, "stream": "b"},
                                     VALUE_ONLY, "stream")
        assert writer.sink_id == f"query-{QUERY_ID}", location


def test_parse_stream_checkpoint_deleted_and_recreated_gets_a_new_sink_id(tmp_path):
    checkpoint = make_checkpoint(tmp_path / "ck")
    first = parse_write_options({"checkpointlocation": str(checkpoint), "stream": "b"},
                                VALUE_ONLY, "stream")
    shutil.rmtree(checkpoint)
    make_checkpoint(checkpoint, "0f061cb3-bcc0-43d2-a8dc-8bc9f2afe56e")
    again = parse_write_options({"checkpointlocation": str(checkpoint), "stream": "b"},
                                VALUE_ONLY, "stream")
    assert first.sink_id != again.sink_id == "query-0f061cb3-bcc0-43d2-a8dc-8bc9f2afe56e"


def test_parse_stream_sink_id_option_wins_over_checkpoint(tmp_path):
    writer = parse_write_options({"sinkid": "orders-copy", "stream": "b",
                                  "checkpointlocation": str(tmp_path / "absent")}, VALUE_ONLY,
                                 "stream")
    assert writer.sink_id == "orders-copy"


@pytest.mark.parametrize("options", [{"queryname": "copy"}, {},
                                     {"checkpointlocation": "hdfs://nn/ck/q"}])
def test_parse_stream_without_a_readable_checkpoint_leaves_the_id_to_tasks(options):
    # The tasks stage under query-<their sql.streaming.queryId local property>.
    assert parse_write_options({**options, "stream": "b"}, VALUE_ONLY, "stream").sink_id is None


def test_checkpoint_dir_resolves_as_spark_does(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert checkpoint_dir("ck/q") == tmp_path / "ck" / "q"
    assert checkpoint_dir("file:///tmp/a%20b/") == Path("/tmp/a b")
    assert checkpoint_dir("s3a://bucket/ck") is None


def test_check_planned_batches_refuses_a_later_broker_batch_only(tmp_path):
    checkpoint = make_checkpoint(tmp_path / "ck")
    check_planned_batches("s", "ck", checkpoint, -1, "b:1")  # nothing committed
    with pytest.raises(SinkConflict, match=r"^npstream sink 's' has batches up to 0 committed "
                       r"on broker b:1, but the query's checkpoint 'ck' has planned no batch: "
                       r"it is not the checkpoint that wrote them"):
        check_planned_batches("s", "ck", checkpoint, 0, "b:1")
    (checkpoint / "offsets").mkdir()
    for batch in ("0", "1", ".1.crc"):
        (checkpoint / "offsets" / batch).write_text("")
    check_planned_batches("s", "ck", checkpoint, 1, "b:1")  # the replay of a crash: planned
    with pytest.raises(SinkConflict, match=r"has planned batches only up to 1: it is not the"):
        check_planned_batches("s", "ck", checkpoint, 2, "b:1")


def test_make_batch_writer_each_job_gets_a_fresh_sink_id():
    first = make_batch_writer({"stream": "b"}, VALUE_ONLY, False)
    second = make_batch_writer({"stream": "b"}, VALUE_ONLY, False)
    assert first.sink_id.startswith("batch-") and first.sink_id != second.sink_id


def test_make_batch_writer_sink_id_option_is_rejected():
    with pytest.raises(InvalidOptionError, match=r"Option 'sinkId' \(value 'x'\) applies to "
                                                 r"streaming writes"):
        make_batch_writer({"stream": "b", "sinkId": "x"}, VALUE_ONLY, False)


def test_make_batch_writer_overwrite_mode_is_rejected():
    with pytest.raises(InvalidOptionError, match=r"'overwrite' is not supported.*append"):
        make_batch_writer({"stream": "b"}, VALUE_ONLY, True)


def test_unknown_option_is_rejected_with_suggestion_and_accepted_list():
    with pytest.raises(InvalidOptionError, match=r"Unknown option 'streem' for the \"npstream\" "
                                                 r"sink. Did you mean 'stream'\? Accepted options: "
                                                 r"broker, checkpointLocation"):
        make_batch_writer({"streem": "b"}, VALUE_ONLY, False)


@pytest.mark.parametrize(("key", "value", "message"), [
    ("stream", "a,b", r"Invalid value 'a,b' for option 'stream': the writer takes one stream"),
    ("stream", "../x", r"Invalid value '\.\./x' for option 'stream': invalid stream name"),
    ("stageBytes", "1KiB", r"Invalid value '1KiB' for option 'stageBytes': must be between "
                           r"65536 \(64KiB\) and 33554432 \(32MiB\)"),
    ("stageBytes", "lots", r"Invalid value 'lots' for option 'stageBytes'"),
    ("tls", "maybe", r"Invalid value 'maybe' for option 'tls': not a boolean"),
    ("localStaging", "yes please", r"Invalid value 'yes please' for option 'localStaging': not "
                                   r"a boolean.*Accepted: true or false"),
    ("broker", "no port", r"Invalid value 'no port' for option 'broker'"),
])
def test_bad_option_value_names_option_value_and_accepted(key, value, message):
    with pytest.raises(InvalidOptionError, match=message):
        make_batch_writer({"stream": "b", key: value}, VALUE_ONLY, False)


def test_stream_writer_bad_sink_id_is_rejected():
    with pytest.raises(InvalidOptionError, match=r"Invalid value 'a/b' for option 'sinkId'"):
        make_stream_writer({"stream": "b", "sinkId": "a/b"}, VALUE_ONLY)


def test_no_stream_option_and_no_stream_column_is_rejected():
    with pytest.raises(InvalidOptionError, match=r"No target stream: set the option 'stream'"):
        make_batch_writer({}, VALUE_ONLY, False)


def test_missing_value_column_is_rejected_listing_columns():
    schema = StructType([StructField("key", StringType())])
    with pytest.raises(InvalidOptionError, match=r"no 'value' column \(columns: key\)"):
        make_batch_writer({"stream": "b"}, schema, False)


def test_unknown_column_is_rejected_naming_it():
    schema = StructType([StructField("value", StringType()), StructField("n", IntegerType())])
    with pytest.raises(InvalidOptionError, match=r"Column 'n' \(int\) cannot be written"):
        make_batch_writer({"stream": "b"}, schema, False)


def test_wrong_column_type_is_rejected_naming_accepted_types():
    schema = StructType([StructField("value", IntegerType())])
    with pytest.raises(InvalidOptionError, match=r"Column 'value' has type int; the npstream "
                                                 r"writer accepts string or binary"):
        make_batch_writer({"stream": "b"}, schema, False)


def test_reader_schema_with_stream_option_drops_stream_offset_timestamp():
    writer = make_batch_writer({"stream": "copy"}, READER_SCHEMA, False)
    assert writer.options.columns == ("id", "key", "value", "headers")
    assert writer.options.use_stream_column is False


def test_stream_column_without_option_routes_per_row():
    writer = make_batch_writer({}, READER_SCHEMA, False)
    assert writer.options.columns == ("stream", "id", "key", "value", "headers")
    assert writer.options.use_stream_column is True


def test_chunks_group_small_batches_and_split_large_ones():
    small = pa.record_batch({"value": pa.array([b"x" * 100] * 10), "skip": pa.array([1] * 10)})
    big = pa.record_batch({"value": pa.array([b"y" * 1000] * 100), "skip": pa.array([2] * 100)})
    chunks = list(_chunks([small, small, pa.record_batch({"value": pa.array([], pa.binary()),
                                                         "skip": pa.array([], pa.int64())}),
                           big], ("value",), 20_000))
    assert [c.column_names for c in chunks] == [["value"]] * len(chunks)
    assert sum(c.num_rows for c in chunks) == 120
    assert all(c.nbytes <= 20_000 + 1100 for c in chunks)
    assert len(chunks) >= 6
    rows = pa.concat_tables(chunks).column("value").to_pylist()
    assert rows == [b"x" * 100] * 20 + [b"y" * 1000] * 100


def test_staging_ids_follow_partition_order_and_skip_failed_tasks():
    messages = [NpstreamCommitMessage(2, ["2a"], brokers={"b:1": ["2a"]}), None,
                NpstreamCommitMessage(0, ["0a", "0b"], brokers={"b:1": ["0a", "0b"]}),
                NpstreamCommitMessage(1, [])]
    assert _staging_ids(messages) == {"b:1": ["0a", "0b", "2a"]}


def test_staging_ids_are_grouped_by_the_broker_that_holds_them():
    """A cluster: a staging id split over two members is committed on both."""
    messages = [NpstreamCommitMessage(1, ["1a"], brokers={"b:2": ["1a"]}),
                NpstreamCommitMessage(0, ["0a", "0b"], brokers={"b:1": ["0a", "0b"],
                                                                "b:2": ["0b"]})]
    assert _staging_ids(messages) == {"b:1": ["0a", "0b"], "b:2": ["0b", "1a"]}


# ---------------------------------------------------------------- typed writes

READINGS = StructType([
    StructField("id", StringType()), StructField("sensorId", StringType(), False),
    StructField("reading", DoubleType()), StructField("ts", TimestampType()),
    StructField("offset", LongType()),
])


def test_columns_without_value_are_a_typed_record_with_the_envelope_kept_apart():
    options = parse_write_options({"stream": "t"}, READINGS, "batch", batch_sink_id="b")
    assert options.columns == ("id", "sensorId", "reading", "ts")
    assert options.value_fields == ("sensorId", "reading", "ts")
    assert to_ddl(options.value_schema) == "sensorId STRING NOT NULL, reading DOUBLE, ts TIMESTAMP"


def test_struct_value_column_is_a_typed_record():
    schema = StructType([StructField("key", StringType()), StructField("value", StructType([
        StructField("sensorId", StringType()), StructField("reading", DoubleType())]))])
    options = parse_write_options({"stream": "t"}, schema, "batch", batch_sink_id="b")
    assert options.value_fields == ()
    assert options.columns == ("key", "value")
    assert to_ddl(options.value_schema) == "sensorId STRING, reading DOUBLE"


def test_a_column_type_no_typed_stream_holds_is_named():
    schema = StructType([StructField("sensorId", StringType()),
                         StructField("took", DayTimeIntervalType())])
    with pytest.raises(InvalidOptionError, match=r"Column 'took' has type interval day to "
                                                 r"second, which a typed stream cannot hold"):
        make_batch_writer({"stream": "t"}, schema, False)


def test_envelope_column_of_a_typed_record_keeps_its_type_rule():
    schema = StructType([StructField("key", IntegerType()), StructField("n", IntegerType())])
    with pytest.raises(InvalidOptionError, match=r"Column 'key' has type int; the npstream "
                                                 r"writer accepts string or binary"):
        make_batch_writer({"stream": "t"}, schema, False)


def test_create_stream_needs_the_stream_option():
    with pytest.raises(InvalidOptionError, match=r"'createStream' \(value 'true'\) needs the "
                                                 r"option 'stream'"):
        make_batch_writer({"createStream": "true"}, READER_SCHEMA, False)


def test_chunks_pack_record_columns_into_the_value_struct_without_copying():
    sensor = pa.array(["a", "b"])
    batch = pa.record_batch({"id": ["r1", "r2"], "sensorId": sensor, "reading": [1.5, None]})
    (table,) = _chunks([batch], ("id", "sensorId", "reading"), 1 << 20, ("sensorId", "reading"))
    assert table.column_names == ["id", "value"]
    assert table.column("value").to_pylist() == [{"sensorId": "a", "reading": 1.5},
                                                 {"sensorId": "b", "reading": None}]
    packed = table.column("value").chunk(0).field("sensorId")
    assert packed.buffers()[2].address == sensor.buffers()[2].address
