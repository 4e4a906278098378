"""NpstreamDataSource itself: schema, option checks at load(), reader choice, write-option names."""

from __future__ import annotations

import pytest
from pyspark.sql.datasource import CaseInsensitiveDict
from pyspark.sql.types import StringType, StructField, StructType

from npstream.spark.batch_reader import NpstreamBatchReader, NpstreamPushdownBatchReader
from npstream.spark.options import InvalidOptionError
from npstream.spark.range_reader import spark_read_schema
from npstream.spark.source import NpstreamDataSource
from npstream.spark.stream_reader import NpstreamStreamReader


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
    with pytest.raises(InvalidOptionError, match="has a fixed schema") as info:
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
