"""NpstreamDataSource itself: schema, option checks at load(), reader choice, write-option names.

The broker's answer (which streams exist, typed or not) is replaced by
``broker_schemas``: no broker, no Spark session.
"""

from __future__ import annotations

import pickle

import pyarrow as pa
import pytest
from pyspark.sql.datasource import CaseInsensitiveDict
from pyspark.sql.types import StringType, StructField, StructType

from npstream.errors import StreamNotFound
from npstream.spark import read_schema
from npstream.spark.batch_reader import NpstreamBatchReader, NpstreamPushdownBatchReader
from npstream.spark.options import InvalidOptionError
from npstream.spark.range_reader import spark_read_schema
from npstream.spark.read_schema import ReadSchemaError
from npstream.spark.source import NpstreamDataSource
from npstream.spark.stream_reader import NpstreamStreamReader

READINGS = pa.schema([pa.field("sensorId", pa.string()), pa.field("reading", pa.float64())])


class FakeBroker:
    """What the broker would say: stream -> value schema (absent: untyped); ``gone``: no stream."""

    def __init__(self) -> None:
        self.streams: dict[str, pa.Schema | None] = {}
        self.gone: set[str] = set()
        self.lookups = 0

    def lookup(self, client, options):
        self.lookups += 1
        return {name: self.streams.get(name) for name in options.streams
                if name not in self.gone}


@pytest.fixture(autouse=True)
def broker(monkeypatch: pytest.MonkeyPatch) -> FakeBroker:
    fake = FakeBroker()
    monkeypatch.setattr(read_schema, "lookup_value_schemas", fake.lookup)
    return fake


def source(**options: str) -> NpstreamDataSource:
    return NpstreamDataSource(CaseInsensitiveDict(options))


def test_schema_follows_include_headers():
    assert source(stream="a").schema() == spark_read_schema(False)
    assert source(stream="a", includeHeaders="TRUE").schema() == spark_read_schema(True)


def test_schema_checks_names_and_values_before_the_mode_is_known():
    with pytest.raises(InvalidOptionError, match=r"Unknown option 'strem'.*Did you mean 'stream'"):
        source(strem="a").schema()
    with pytest.raises(InvalidOptionError, match="Invalid value 'x' for option 'minPartitions'"):
        source(stream="a", minPartitions="x").schema()
    # Mode-specific rules wait for the reader: both of these load fine.
    assert source(stream="a", endingOffsets="latest").schema() == spark_read_schema(False)
    assert source(stream="a", maxOffsetsPerTrigger="5").schema() == spark_read_schema(False)


def test_readers_check_mode_specific_options():
    with pytest.raises(InvalidOptionError, match="applies to batch reads"):
        source(stream="a", endingOffsets="latest").streamReader(spark_read_schema(False))
    with pytest.raises(InvalidOptionError, match="applies to streaming reads"):
        source(stream="a", maxOffsetsPerTrigger="5").reader(spark_read_schema(False))
    assert isinstance(source(stream="a").streamReader(spark_read_schema(False)),
                      NpstreamStreamReader)


def test_batch_reader_without_pushdown_worker_has_no_push_filters():
    reader = source(stream="a").reader(spark_read_schema(False))
    assert type(reader) is NpstreamBatchReader
    assert not isinstance(reader, NpstreamPushdownBatchReader)


def test_user_schema_different_from_fixed_schema_fails():
    other = StructType([StructField("value", StringType())])
    with pytest.raises(InvalidOptionError, match="schema is set by its streams") as info:
        source(stream="a").streamReader(other)
    assert "struct<value:string>" in str(info.value)


def test_write_with_unknown_or_read_only_option_fails_naming_it():
    schema = StructType([StructField("value", StringType())])
    with pytest.raises(InvalidOptionError, match="Unknown option 'bogus' for the \"npstream\" "
                                                 "sink") as info:
        source(stream="a", bogus="1").streamWriter(schema, False)
    assert "Accepted options: broker, checkpointLocation" in str(info.value)
    with pytest.raises(InvalidOptionError, match="Unknown option 'startingoffsets' for the "
                                                 "\"npstream\" sink"):
        source(stream="a", startingOffsets="earliest").writer(schema, False)


# ---------------------------------------------------------------- typed streams


def test_schema_of_typed_stream_flattens_its_fields(broker):
    broker.streams["r"] = READINGS
    schema = source(stream="r").schema()
    assert schema.simpleString() == (
        "struct<stream:string,offset:bigint,id:string,key:binary,timestamp:timestamp,"
        "sensorId:string,reading:double>")
    assert source(stream="r", valueColumns="STRUCT", includeHeaders="true").schema() \
        .simpleString() == (
        "struct<stream:string,offset:bigint,id:string,key:binary,timestamp:timestamp,"
        "headers:map<string,binary>,value:struct<sensorId:string,reading:double>>")


def test_schema_asks_the_broker_once_and_the_readers_reuse_the_answer(broker):
    broker.streams["r"] = READINGS
    data_source = source(stream="r")
    schema = data_source.schema()
    # Spark pickles the data source after schema() and builds readers from the copy.
    copy = pickle.loads(pickle.dumps(data_source))
    broker.streams["r"] = None  # the broker changed its mind: the plan stands
    reader = copy.streamReader(schema)
    batch_reader = copy.reader(schema)
    assert broker.lookups == 1
    assert reader._schema.spark_schema() == schema
    assert batch_reader._schema.spark_schema() == schema


def test_user_schema_is_checked_against_the_broker(broker):
    broker.streams["r"] = READINGS
    typed = source(stream="r").schema()
    fresh = source(stream="r")  # .schema(typed) given by the user: Spark skips schema()
    assert fresh.streamReader(typed)._schema.typed
    wrong = StructType([*typed.fields[:-1], StructField("reading", StringType())])
    with pytest.raises(InvalidOptionError) as info:
        source(stream="r").reader(wrong)
    assert str(info.value) == (
        "The npstream source's schema is set by its streams (struct<stream:string,"
        "offset:bigint,id:string,key:binary,timestamp:timestamp,sensorId:string,"
        "reading:double>); got struct<stream:string,offset:bigint,id:string,key:binary,"
        "timestamp:timestamp,sensorId:string,reading:string>. Drop .schema(...) and select "
        "or cast columns after load() instead.")


def test_schema_missing_named_stream_fails_at_load(broker):
    broker.streams["r"] = READINGS
    broker.gone.add("gone")
    with pytest.raises(StreamNotFound, match=r"^stream\(s\) 'gone' named by option 'stream' "
                       "do not exist on broker localhost:7070; create them first"):
        source(stream="r,gone", broker="localhost:7070").schema()


def test_typed_and_untyped_together_fail_at_load(broker):
    broker.streams.update({"a": READINGS, "b": None})
    with pytest.raises(ReadSchemaError, match="Cannot read typed and untyped streams together"):
        source(stream="a,b").schema()


def test_value_columns_checked_at_load():
    with pytest.raises(InvalidOptionError) as info:
        source(stream="a", valueColumns="columns").schema()
    assert str(info.value) == ("Invalid value 'columns' for option 'valueColumns': not a value "
                               "layout. Accepted: flatten or struct.")
