"""Read options: every option's parsing, defaults, and each error message (no broker, no Spark)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from npstream.spark.options import (
    ConnectionOptions,
    InvalidOptionError,
    Position,
    parse_read_options,
)

NO_ENV: dict[str, str] = {}


def parse(mode: str = "stream", env: dict[str, str] | None = None, **options: str):
    # Spark hands options over with lower-cased keys; do the same.
    return parse_read_options({k.lower(): v for k, v in options.items()}, mode,  # type: ignore[arg-type]
                              env=NO_ENV if env is None else env)


def error(mode: str = "stream", **options: str) -> str:
    with pytest.raises(InvalidOptionError) as info:
        parse(mode, **options)
    return str(info.value)


def test_parse_minimal_stream_options_gives_documented_defaults():
    opts = parse(stream="orders")
    assert opts.connection == ConnectionOptions("localhost:7070", None, False, None)
    assert opts.streams == ("orders",)
    assert opts.stream_pattern is None
    assert opts.starting == Position("latest")
    assert opts.max_offsets_per_trigger is None
    assert opts.min_offsets_per_trigger is None
    assert opts.max_trigger_delay_ms == 15 * 60 * 1000
    assert opts.min_partitions is None and opts.max_records_per_partition is None
    assert opts.fail_on_data_loss is True
    assert opts.group is None
    assert opts.include_headers is False
    assert opts.fetch_max_bytes == 8 << 20


def test_parse_batch_defaults_start_earliest_end_latest():
    opts = parse("batch", stream="orders")
    assert opts.starting == Position("earliest")
    assert opts.ending == Position("latest")


def test_parse_mixed_case_keys_are_accepted():
    opts = parse_read_options({"STREAM": "a", "MaxOffsetsPerTrigger": "5"}, "stream", env=NO_ENV)
    assert opts.streams == ("a",)
    assert opts.max_offsets_per_trigger == 5


def test_parse_broker_from_env_when_option_absent():
    assert parse(stream="a", env={"NPSTREAM_BROKER": "b1:7000"}).connection.broker == "b1:7000"
    assert parse(stream="a", broker="b2:7001",
                 env={"NPSTREAM_BROKER": "b1:7000"}).connection.broker == "b2:7001"


def test_parse_bad_broker_env_names_the_variable():
    with pytest.raises(InvalidOptionError, match="environment variable NPSTREAM_BROKER"):
        parse(stream="a", env={"NPSTREAM_BROKER": "no port"})


@pytest.mark.parametrize("value", ["localhost:7070", "10.0.0.1:1", "[::1]:7070",
                                   "dns:///broker:7070", "unix:/tmp/np.sock"])
def test_parse_broker_accepts_addresses(value):
    assert parse(stream="a", broker=value).connection.broker == value


@pytest.mark.parametrize("value", ["localhost", "host:0", "host:70000", "a b:1", "",
                                   "http://broker:7070", "grpc://broker:7070", "tcp:broker:7070"])
def test_parse_broker_rejects_bad_address(value):
    message = error(stream="a", broker=value)
    assert f"Invalid value {value!r} for option 'broker'" in message
    assert "Accepted: host:port" in message


@pytest.mark.parametrize(("value", "reason"), [
    ("localhost", "invalid broker address 'localhost': no port"),
    ("http://broker:7070", "invalid broker address 'http://broker:7070': not host:port"),
    ("host:70000", "port 70000 is not within 1..65535"),
])
def test_parse_broker_bad_address_gives_the_sdk_reason(value, reason):
    # One rule for an address: the option says what Client(address) would say.
    from npstream.client.connection import resolve_address
    from npstream.errors import InvalidArgument

    message = error(stream="a", broker=value)
    assert reason in message
    with pytest.raises(InvalidArgument, match=re.escape(reason)):
        resolve_address(value)


def test_parse_local_reads_default_on_and_off():
    assert parse(stream="a").connection.local_reads is True
    assert parse(stream="a", localReads="false").connection.local_reads is False
    with pytest.raises(InvalidOptionError,
                       match=r"'maybe' for option 'localReads'.*Accepted: true or false"):
        parse(stream="a", localReads="maybe")


def test_parse_token_and_tls():
    opts = parse(stream="a", token="s3cret", tls="TRUE")
    assert opts.connection.token == "s3cret"
    assert opts.connection.tls is True


def test_parse_tls_root_certificates_reads_file_and_implies_tls(tmp_path: Path):
    pem = tmp_path / "ca.pem"
    pem.write_bytes(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    opts = parse(stream="a", tlsRootCertificates=str(pem))
    assert opts.connection.tls is True
    assert opts.connection.root_certificates == pem.read_bytes()


def test_parse_tls_root_certificates_missing_file_fails(tmp_path: Path):
    missing = tmp_path / "nope.pem"
    message = error(stream="a", tlsRootCertificates=str(missing))
    assert f"Invalid value '{missing}' for option 'tlsRootCertificates': cannot read" in message


def test_parse_tls_false_with_certificates_conflicts(tmp_path: Path):
    pem = tmp_path / "ca.pem"
    pem.write_bytes(b"-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n")
    assert "set tls=true or drop the certificates" in error(
        stream="a", tls="false", tlsRootCertificates=str(pem))


def test_parse_stream_list_strips_and_dedups():
    assert parse(stream=" a , b,a ").streams == ("a", "b")


@pytest.mark.parametrize("value,reason", [("a,,b", "empty stream name"),
                                          ("../etc", "invalid stream name")])
def test_parse_stream_rejects_bad_names(value, reason):
    message = error(stream=value)
    assert f"Invalid value {value!r} for option 'stream'" in message
    assert reason in message


def test_parse_stream_pattern_and_subscription():
    opts = parse(streamPattern="orders-*")
    assert opts.stream_pattern == "orders-*"
    assert opts.subscribes("orders-eu") and not opts.subscribes("clicks")


def test_parse_stream_pattern_rejects_path_characters():
    assert "Invalid value 'a/*' for option 'streamPattern'" in error(streamPattern="a/*")


def test_parse_neither_stream_nor_pattern_fails():
    assert "Set exactly one of the options 'stream'" in error()
    assert "neither is set" in error()


def test_parse_both_stream_and_pattern_fails():
    message = error(stream="a", streamPattern="b*")
    assert "Set exactly one of the options 'stream'" in message
    assert "stream='a' and streamPattern='b*'" in message


def test_parse_unknown_option_names_it_and_suggests():
    message = error(stream="a", maxOffsetPerTrigger="10")
    assert "Unknown option 'maxoffsetpertrigger'" in message
    assert "Did you mean 'maxOffsetsPerTrigger'?" in message
    assert "Accepted options: broker, defaultParallelism, endingOffsets" in message


def test_parse_path_option_is_unknown():
    assert "Unknown option 'path'" in error(stream="a", path="/x")


@pytest.mark.parametrize("keyword", ["earliest", "LATEST", "group"])
def test_parse_starting_offsets_keywords(keyword):
    opts = parse(stream="a", startingOffsets=keyword, group="g")
    assert opts.starting == Position(keyword.lower())


def test_parse_starting_offsets_json_with_sentinels():
    opts = parse(stream="a,b,c", startingOffsets='{"a": 5, "b": -2, "c": -1}')
    assert opts.starting.for_stream("a", "earliest") == ("offsets", 5)
    assert opts.starting.for_stream("b", "latest") == ("earliest", None)
    assert opts.starting.for_stream("c", "earliest") == ("latest", None)


def test_parse_starting_offsets_malformed_json_quotes_it():
    message = error(stream="a", startingOffsets='{"a": }')
    assert "Invalid value '{\"a\": }' for option 'startingOffsets': not valid JSON" in message
    assert "Accepted: earliest, latest, group or JSON like" in message


@pytest.mark.parametrize("value,reason", [
    ('{"a": -3}', "offset for stream 'a' is -3"),
    ('{"a": "5"}', "offset for stream 'a' is \"5\""),
    ('{"a": 1.5}', "offset for stream 'a' is 1.5"),
    ("[1]", "the JSON must be a non-empty object"),
    ("{}", "the JSON must be a non-empty object"),
    ("newest", "not a keyword or a JSON object"),
])
def test_parse_starting_offsets_bad_values(value, reason):
    message = error(stream="a", startingOffsets=value)
    assert f"for option 'startingOffsets': {reason}" in message


def test_parse_starting_offsets_unsubscribed_stream_fails():
    message = error(stream="a", startingOffsets='{"b": 1}')
    assert "stream 'b' is not read by this query (stream='a')" in message
    message = error(streamPattern="o-*", startingOffsets='{"b": 1}')
    assert "(streamPattern='o-*')" in message


def test_parse_starting_offsets_group_requires_group():
    assert "needs the option 'group'" in error(stream="a", startingOffsets="group")


def test_parse_starting_timestamp_iso_and_epoch():
    assert parse(stream="a", startingTimestamp="1970-01-01T00:00:01Z").starting == Position(
        "timestamp", timestamp_ms=1000)
    assert parse(stream="a", startingTimestamp="1700000000000").starting.timestamp_ms == (
        1700000000000)


def test_parse_starting_timestamp_bad_value():
    message = error(stream="a", startingTimestamp="yesterday")
    assert "Invalid value 'yesterday' for option 'startingTimestamp'" in message
    assert "Accepted: ISO-8601" in message


def test_parse_starting_offsets_and_timestamp_together_fail():
    assert "not both" in error(stream="a", startingOffsets="earliest", startingTimestamp="0")


def test_parse_batch_rejects_latest_start():
    assert "'latest' (-1) is not allowed for batch reads" in error(
        "batch", stream="a", startingOffsets="latest")
    assert "'latest' (-1) is not allowed for batch reads" in error(
        "batch", stream="a", startingOffsets='{"a": -1}')


def test_parse_ending_offsets_json_and_timestamp():
    assert parse("batch", stream="a", endingOffsets='{"a": 7}').ending.for_stream(
        "a", "latest") == ("offsets", 7)
    assert parse("batch", stream="a", endingTimestamp="2000").ending == Position(
        "timestamp", timestamp_ms=2000)


def test_parse_ending_offsets_earliest_sentinel_fails():
    assert "ending offset -2 (earliest) for stream 'a' reads nothing" in error(
        "batch", stream="a", endingOffsets='{"a": -2}')


def test_parse_ending_offsets_and_timestamp_together_fail():
    assert "not both" in error("batch", stream="a", endingOffsets="latest", endingTimestamp="5")


@pytest.mark.parametrize("option", ["endingOffsets", "endingTimestamp"])
def test_parse_batch_only_option_in_stream_fails(option):
    message = error(stream="a", **{option: "latest" if option == "endingOffsets" else "1"})
    assert f"Option '{option}'" in message
    assert "applies to batch reads (spark.read) only" in message


@pytest.mark.parametrize("option", ["maxOffsetsPerTrigger", "minOffsetsPerTrigger",
                                    "maxTriggerDelay"])
def test_parse_stream_only_option_in_batch_fails(option):
    message = error("batch", stream="a", **{option: "10"})
    assert f"Option '{option}' (value '10') applies to streaming reads" in message


@pytest.mark.parametrize("option", ["maxOffsetsPerTrigger", "minOffsetsPerTrigger",
                                    "minPartitions", "maxRecordsPerPartition"])
@pytest.mark.parametrize("value,reason", [("0", "must be greater than 0"),
                                          ("-4", "not an integer"),
                                          ("ten", "not an integer")])
def test_parse_positive_int_options_reject_bad_values(option, value, reason):
    message = error(stream="a", **{option: value})
    assert (f"Invalid value {value!r} for option '{option}': {reason}. "
            "Accepted: a positive integer.") in message


def test_parse_int_options_set():
    opts = parse(stream="a", maxOffsetsPerTrigger="100", minOffsetsPerTrigger="10",
                 maxTriggerDelay="30s", minPartitions="4", maxRecordsPerPartition="1000")
    assert (opts.max_offsets_per_trigger, opts.min_offsets_per_trigger) == (100, 10)
    assert opts.max_trigger_delay_ms == 30_000
    assert (opts.min_partitions, opts.max_records_per_partition) == (4, 1000)


def test_parse_min_above_max_per_trigger_fails():
    assert "'minOffsetsPerTrigger' (50) must not exceed 'maxOffsetsPerTrigger' (10)" in error(
        stream="a", minOffsetsPerTrigger="50", maxOffsetsPerTrigger="10")


def test_parse_bad_max_trigger_delay():
    message = error(stream="a", maxTriggerDelay="soon")
    assert "Invalid value 'soon' for option 'maxTriggerDelay'" in message
    assert "Accepted: a duration such as 30s" in message


@pytest.mark.parametrize("option", ["failOnDataLoss", "includeHeaders", "tls"])
def test_parse_bool_options_reject_bad_values(option):
    assert f"Invalid value 'yes' for option '{option}': not a boolean. Accepted: true or false." \
        in error(stream="a", **{option: "yes"})


def test_parse_bool_options_set():
    opts = parse(stream="a", failOnDataLoss="False", includeHeaders="true")
    assert opts.fail_on_data_loss is False and opts.include_headers is True


def test_parse_group_name_validated():
    assert parse(stream="a", group="spark-job.1").group == "spark-job.1"
    assert "Invalid value '-bad' for option 'group'" in error(stream="a", group="-bad")


def test_parse_group_in_batch_only_with_group_start():
    assert parse("batch", stream="a", group="g", startingOffsets="group").group == "g"
    assert "batch reads never commit" in error("batch", stream="a", group="g")


def test_parse_fetch_max_bytes_sizes():
    assert parse(stream="a", fetchMaxBytes="1MiB").fetch_max_bytes == 1 << 20
    assert parse(stream="a", fetchMaxBytes="4096").fetch_max_bytes == 4096
    assert "at most 64MiB" in error(stream="a", fetchMaxBytes="1GiB")
    assert "Invalid value 'lots' for option 'fetchMaxBytes'" in error(
        stream="a", fetchMaxBytes="lots")


def test_value_columns_default_flatten_and_case_insensitive():
    assert parse(stream="a").value_columns == "flatten"
    assert parse("batch", stream="a", valueColumns=" Struct ").value_columns == "struct"
    assert error(stream="a", valueColumns="nested") == (
        "Invalid value 'nested' for option 'valueColumns': not a value layout. "
        "Accepted: flatten or struct.")


def test_parse_default_parallelism_defaults_to_host_cpus_and_is_overridden():
    import os

    assert parse(stream="a").parallelism == len(os.sched_getaffinity(0))
    assert parse(stream="a", defaultParallelism="16").parallelism == 16
    assert "defaultParallelism" in error(stream="a", defaultParallelism="0")
