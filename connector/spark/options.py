"""Every read option of the ``npstream`` Spark source: name, default, parser and checks.

This module holds the option table and the checks that span several options;
how one option's text becomes a value (the parsers the table names, and
``Position``) lives in ``option_values.py``.

Spark hands options over as strings in a case-insensitive dict whose keys are
lower-cased, so the table is keyed by the lower-cased name and every message
uses the documented camelCase spelling. Parsing happens once, on the driver,
when the query (or batch read) is planned: a typo or a bad value fails there
with a message naming the option, the value and what is accepted, instead of
surfacing later inside a task. The result, ``ReadOptions``, is a frozen,
picklable value that the readers ship to executors.

Names follow Spark's Kafka source where the meaning is the same
(``startingOffsets``, ``maxOffsetsPerTrigger``, ``failOnDataLoss``...).

Every default lives in the table (``OptionSpec.default``, as the text a user
would type) and nowhere else: the parsed option objects have no defaults of
their own but the table's. The table also holds each option's description:
the DataSource docstring's option list and docs/spark.md's option tables are
generated from it (``make docs``).
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from npstream.proto.defaults import BROKER_ADDRESS_ENV, DEFAULT_BROKER_ADDRESS, DEFAULT_FETCH_BYTES
from npstream.proto.names import validate_group_name
from npstream.spark.errors import InvalidOptionError
from npstream.spark.option_values import (
    LATEST_SENTINEL,
    OFFSETS_EXAMPLE,
    TIMESTAMP_ACCEPTED,
    Position,
    parse_bool,
    parse_broker,
    parse_certificates,
    parse_duration,
    parse_ending_offsets,
    parse_fetch_bytes,
    parse_glob,
    parse_non_empty,
    parse_positive_int,
    parse_private_key,
    parse_starting_offsets,
    parse_stream_list,
    parse_timestamp,
    parse_value_columns,
)
from npstream.spark.partitioning import AUTO_SPLIT_MIN_ROWS

if TYPE_CHECKING:
    from npstream.client.client import Client

__all__ = [
    "CONNECTION_OPTIONS",
    "DEFAULT_BROKER",
    "READ_OPTIONS",
    "ConnectionOptions",
    "InvalidOptionError",
    "OptionSpec",
    "Position",
    "ReadMode",
    "ReadOptions",
    "ValueColumns",
    "check_known_options",
    "check_read_options",
    "parse_connection_options",
    "parse_option_value",
    "parse_read_options",
    "table_default",
]

ReadMode = Literal["stream", "batch"]
ValueColumns = Literal["flatten", "struct"]
STREAM: frozenset[str] = frozenset({"stream"})
BATCH: frozenset[str] = frozenset({"batch"})
BOTH: frozenset[str] = frozenset({"stream", "batch"})

# Without the broker option: $NPSTREAM_BROKER, else the contract's default address.
DEFAULT_BROKER = DEFAULT_BROKER_ADDRESS

# ---------------------------------------------------------------- tuning defaults
# maxTriggerDelay: how long minOffsetsPerTrigger may hold back a batch before
# one runs anyway (Kafka's default, so jobs moved from Kafka behave the same).
DEFAULT_MAX_TRIGGER_DELAY = "15m"
# fetchMaxBytes: bytes per Fetch RPC; the contract's fetch default (the
# client's and the broker's) so one stored 8 MiB batch travels in one response.
DEFAULT_FETCH_MAX_BYTES = f"{DEFAULT_FETCH_BYTES >> 20}MiB"


@dataclass(frozen=True)
class OptionSpec:
    """One option: its documented name, default, parser, where it applies and what it does.

    The only description of the option: ``make docs`` (docs/generate.py) writes
    docs/spark.md's option tables and the DataSource docstring's option list
    from these fields.
    """

    name: str
    default: str | None  # as a user would type it; None: not set
    parse: Callable[[str], Any]
    accepted: str  # what the error message for a bad value says is accepted
    modes: frozenset[str]
    doc: str  # what it does, Markdown
    example: str = ""  # Markdown, docs/spark.md's example column
    shown: str | None = None  # the default as the docs tell it, when not `default` or "none"
    section: str = ""  # the subsection of docs/spark.md "Read options" it is listed under


# ---------------------------------------------------------------- the option table

CONNECTION_SPECS: tuple[OptionSpec, ...] = (
    OptionSpec("broker", None, parse_broker, "host:port or a gRPC target (dns:///h:7070)",
               BOTH, "broker address (host:port or a gRPC target: dns:, unix:, "
               "ipv4:, ipv6:, vsock:), checked by the rule `Client(address)` uses",
               example="`broker.internal:7070`, `dns:///np:7070`",
               shown=f"env `{BROKER_ADDRESS_ENV}`, else `{DEFAULT_BROKER}`",
               section="Connection"),
    OptionSpec("token", None, parse_non_empty, "a non-empty string", BOTH,
               "auth token, sent as `authorization: Bearer <token>`",
               example="`s3cret`",
               section="Connection"),
    OptionSpec("tls", "false", parse_bool, "true or false", BOTH,
               "connect with TLS (system CA roots unless `tlsRootCertificates`)",
               example="`true`",
               section="Connection"),
    OptionSpec("tlsRootCertificates", None, parse_certificates,
               "a readable PEM file path", BOTH,
               "PEM file of CA certificates to trust; implies `tls=true`. Read on the "
               "driver and shipped to tasks, so executors need no copy of the file",
               example="`/etc/np/ca.pem`",
               section="Connection"),
    OptionSpec("tlsClientCertificate", None, parse_certificates,
               "a readable PEM file path", BOTH,
               "PEM client certificate, for a broker that requires one "
               "(`tls_client_ca_file`, mutual TLS); needs `tlsClientKey`, implies "
               "`tls=true`",
               example="`/etc/np/client.pem`",
               section="Connection"),
    OptionSpec("tlsClientKey", None, parse_private_key,
               "a readable PEM file path", BOTH,
               "PEM private key of `tlsClientCertificate`. Both files are read on the "
               "driver and shipped to tasks with the plan, like the token: executors "
               "need no copy, and whoever can read the query's plan can read the key",
               example="`/etc/np/client-key.pem`",
               section="Connection"),
)

READ_SPECS: tuple[OptionSpec, ...] = (
    *CONNECTION_SPECS,
    OptionSpec("stream", None, parse_stream_list, "a stream name or a comma-separated list",
               BOTH, "one stream or a comma-separated list",
               example="`orders` or `orders,clicks`",
               shown="—",
               section="What to read"),
    OptionSpec("streamPattern", None, parse_glob, "a glob such as 'orders-*'", BOTH,
               "every stream whose name matches the glob (`*`, `?`, `[...]`, "
               "case-sensitive)",
               example="`orders-*`",
               shown="—",
               section="What to read"),
    OptionSpec("startingOffsets", None, parse_starting_offsets,
               f"earliest, latest, group or JSON like {OFFSETS_EXAMPLE}", BOTH,
               "where a **new** query starts",
               example='`earliest`, `group`, `{"orders": 42, "clicks": -2}`',
               shown="`latest` (streaming), `earliest` (batch)",
               section="Where to start and stop"),
    OptionSpec("startingTimestamp", None, parse_timestamp,
               TIMESTAMP_ACCEPTED, BOTH,
               "start at the first message with timestamp >= this (ISO-8601, UTC when "
               "no offset, or epoch ms)",
               example="`2025-01-01T00:00:00Z`, `1735689600000`",
               section="Where to start and stop"),
    OptionSpec("endingOffsets", "latest", parse_ending_offsets,
               f"latest or JSON like {OFFSETS_EXAMPLE}", BATCH,
               "exclusive end of a batch read",
               example='`{"orders": 100}`',
               section="Where to start and stop"),
    OptionSpec("endingTimestamp", None, parse_timestamp,
               TIMESTAMP_ACCEPTED, BATCH,
               "a batch read stops before the first message with timestamp >= this",
               example="`2025-01-02T00:00:00Z`",
               section="Where to start and stop"),
    OptionSpec("maxOffsetsPerTrigger", None, parse_positive_int, "a positive integer", STREAM,
               "at most about this many messages per micro-batch",
               example="`10000`",
               shown="none (all available)",
               section="Admission control"),
    OptionSpec("minOffsetsPerTrigger", None, parse_positive_int, "a positive integer", STREAM,
               "do not start a batch until this many new messages are available, or "
               "`maxTriggerDelay` has passed since the last batch",
               example="`500`",
               section="Admission control"),
    OptionSpec("maxTriggerDelay", DEFAULT_MAX_TRIGGER_DELAY, parse_duration,
               "a duration such as 30s, 15m, 1h (a bare number is seconds)", STREAM,
               "longest time `minOffsetsPerTrigger` may hold back a batch after the last "
               "one",
               example="`30s`, `1h`",
               section="Admission control"),
    OptionSpec("minPartitions", None, parse_positive_int, "a positive integer", BOTH,
               "at least this many Spark partitions per batch",
               example="`8`",
               shown="none (the default split, below)",
               section="Parallelism"),
    OptionSpec("maxRecordsPerPartition", None, parse_positive_int, "a positive integer", BOTH,
               "at most this many messages per Spark partition",
               example="`100000`",
               section="Parallelism"),
    OptionSpec("defaultParallelism", None, parse_positive_int, "a positive integer", BOTH,
               "without `minPartitions` and `maxRecordsPerPartition`, a batch of at least "
               f"{AUTO_SPLIT_MIN_ROWS:,} messages per partition is split into up to this "
               "many partitions; "
               "on a cluster pass `spark.sparkContext.defaultParallelism`",
               example="`16`",
               shown="the planning host's CPUs",
               section="Parallelism"),
    OptionSpec("failOnDataLoss", "true", parse_bool, "true or false", BOTH,
               "fail when messages the query needs were removed by retention; `false` "
               "skips them with a warning ([Data loss](#data-loss-failondataloss))",
               example="`false`",
               section="Everything else"),
    OptionSpec("group", None, validate_group_name,
               "a group name of [A-Za-z0-9._-], starting with a letter or digit", BOTH,
               "streaming: after each batch, record the processed position in this "
               "consumer group; batch: only with `startingOffsets=group`",
               example="`orders-etl`",
               section="Everything else"),
    OptionSpec("includeHeaders", "false", parse_bool, "true or false", BOTH,
               "add the `headers` column",
               example="`true`",
               section="Everything else"),
    OptionSpec("valueColumns", "flatten", parse_value_columns, "flatten or struct", BOTH,
               "typed streams: the value's fields as top-level columns (`flatten`) or "
               "one `value` struct column (`struct`); no effect on untyped streams "
               "([Typed streams](#typed-streams))",
               example="`struct`",
               section="Everything else"),
    OptionSpec("fetchMaxBytes", DEFAULT_FETCH_MAX_BYTES, parse_fetch_bytes,
               "a size such as 8MiB or 1048576 (at most 64MiB)", BOTH,
               "bytes per Fetch RPC (or local read step) made by a task (at most "
               "`64MiB`)",
               example="`1MiB`, `16MiB`",
               section="Everything else"),
    OptionSpec("localReads", "true", parse_bool, "true or false", BOTH,
               "a task on the broker's machine reads the stored frames from the "
               "broker's segment files instead of over gRPC (see [client.md, local "
               "reads](client.md#local-reads)); `false`: always gRPC",
               example="`false`",
               section="Everything else"),
)

READ_OPTIONS: dict[str, OptionSpec] = {spec.name.lower(): spec for spec in READ_SPECS}
CONNECTION_OPTIONS: dict[str, OptionSpec] = {spec.name.lower(): spec for spec in CONNECTION_SPECS}


def table_default(specs: Mapping[str, OptionSpec], name: str) -> Any:
    """The parsed default of an option, for the fields below that mirror it."""
    spec = specs[name.lower()]
    return None if spec.default is None else spec.parse(spec.default)


# ---------------------------------------------------------------- parsed result


@dataclass(frozen=True)
class ConnectionOptions:
    """How to reach the broker; picklable so executors connect the same way."""

    broker: str
    token: str | None = table_default(CONNECTION_OPTIONS, "token")
    tls: bool = table_default(CONNECTION_OPTIONS, "tls")
    root_certificates: bytes | None = table_default(CONNECTION_OPTIONS, "tlsRootCertificates")
    # Read on the driver and pickled into every task like the token, so executors
    # need no copy of the files (the key is as secret as the token).
    client_cert: bytes | None = field(
        default=table_default(CONNECTION_OPTIONS, "tlsClientCertificate"), repr=False)
    client_key: bytes | None = field(
        default=table_default(CONNECTION_OPTIONS, "tlsClientKey"), repr=False)
    local_reads: bool = table_default(READ_OPTIONS, "localReads")

    def connect(self) -> Client:
        """A new client for this broker (the caller closes it)."""
        from npstream.client.client import Client

        return Client(self.broker, self.token, tls=self.tls,
                      root_certificates=self.root_certificates, client_cert=self.client_cert,
                      client_key=self.client_key, local_reads=self.local_reads)


@dataclass(frozen=True)
class ReadOptions:
    """The validated read options of one query or batch read (defaults: the option table)."""

    mode: ReadMode
    connection: ConnectionOptions
    streams: tuple[str, ...]
    stream_pattern: str | None
    starting: Position
    ending: Position
    max_offsets_per_trigger: int | None
    min_offsets_per_trigger: int | None
    max_trigger_delay_ms: int
    min_partitions: int | None
    max_records_per_partition: int | None
    parallelism: int
    fail_on_data_loss: bool
    group: str | None
    include_headers: bool
    fetch_max_bytes: int
    value_columns: ValueColumns

    def subscribes(self, stream: str) -> bool:
        """True when the stream belongs to this read (named, or matching the pattern)."""
        if self.stream_pattern is not None:
            return fnmatch.fnmatchcase(stream, self.stream_pattern)
        return stream in self.streams

    def describe_subscription(self) -> str:
        if self.stream_pattern is not None:
            return f"streamPattern={self.stream_pattern!r}"
        return f"stream={','.join(self.streams)!r}"


# ---------------------------------------------------------------- parsing


def _host_cpus() -> int:
    """CPUs this process may use: Spark's default parallelism for ``local[*]``.

    The data source is planned in a Python worker that cannot ask the
    SparkContext for its ``defaultParallelism`` (Spark passes it neither the
    context nor the setting), so the planning host's CPUs stand in for it;
    the ``defaultParallelism`` option gives the real figure on a cluster.
    """
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _closest(name: str, known: list[str]) -> str:
    by_lower = {candidate.lower(): candidate for candidate in known}
    match = difflib.get_close_matches(name.lower(), list(by_lower), n=1, cutoff=0.75)
    return f" Did you mean '{by_lower[match[0]]}'?" if match else ""


def check_known_options(options: Mapping[str, str], known: Mapping[str, str],
                        what: str) -> None:
    """Raise InvalidOptionError for the first option whose name is not in ``known``.

    ``known`` maps lower-cased names to their documented spelling; the message
    lists them all so the fix is one look away.
    """
    for key in options:
        if key.lower() not in known:
            names = sorted(known.values(), key=str.lower)
            raise InvalidOptionError(
                f"Unknown option '{key}' for {what}.{_closest(key, names)} "
                f"Accepted options: {', '.join(names)}."
            )


def parse_option_value(spec: OptionSpec, raw: str) -> Any:
    """The option's value; InvalidOptionError naming it, the value and what is accepted."""
    try:
        return spec.parse(raw)
    except ValueError as exc:
        raise InvalidOptionError(
            f"Invalid value {raw!r} for option '{spec.name}': {exc}. Accepted: {spec.accepted}."
        ) from None


def check_read_options(options: Mapping[str, str],
                       env: Mapping[str, str] | None = None) -> ReadOptions:
    """Every check that does not depend on streaming vs batch (used at ``load()``).

    Spark asks for the schema at ``load()``, before it knows whether the read
    is streaming; checking names and values there makes a typo fail on the
    line that made it. The mode-specific checks follow when the reader is built.
    Returns the options as a streaming read would see them (the mode-free parts
    are what ``load()`` needs: the streams, includeHeaders, valueColumns).
    """
    return _parse(options, None, env)


def parse_read_options(options: Mapping[str, str], mode: ReadMode,
                       env: Mapping[str, str] | None = None) -> ReadOptions:
    """Validate the options of a streaming (``mode="stream"``) or batch read.

    Raises InvalidOptionError naming the option, the value and the accepted
    values; option names are matched case-insensitively.
    """
    return _parse(options, mode, env)


def _parse(options: Mapping[str, str], mode: ReadMode | None,
           env: Mapping[str, str] | None) -> ReadOptions:
    environ = os.environ if env is None else env
    check_known_options(options, {k: s.name for k, s in READ_OPTIONS.items()},
                        'the "npstream" source')
    raw = {key.lower(): str(value) for key, value in options.items()}
    values: dict[str, Any] = {}
    for key, spec in READ_OPTIONS.items():
        if key in raw:
            if mode is not None and mode not in spec.modes:
                where = "batch reads (spark.read)" if spec.modes == BATCH else (
                    "streaming reads (spark.readStream)")
                raise InvalidOptionError(
                    f"Option '{spec.name}' (value {raw[key]!r}) applies to {where} only; "
                    "remove it from this "
                    f"{'streaming query' if mode == 'stream' else 'batch read'}."
                )
            values[spec.name] = parse_option_value(spec, raw[key])
        elif spec.default is not None:
            values[spec.name] = spec.parse(spec.default)

    connection = dataclasses.replace(_connection(values, raw, environ),
                                     local_reads=values["localReads"])
    streams: tuple[str, ...] = values.get("stream", ())
    pattern: str | None = values.get("streamPattern")
    if bool(streams) == (pattern is not None):
        raise InvalidOptionError(
            "Set exactly one of the options 'stream' (a name or comma-separated list) and "
            "'streamPattern' (a glob such as 'orders-*')"
            + (f"; got stream={raw['stream']!r} and streamPattern={raw['streampattern']!r}."
               if pattern is not None else "; neither is set.")
        )
    starting = _starting(values, raw, mode)
    if mode == "batch" and "group" in values and starting.kind != "group":
        raise InvalidOptionError(
            f"Option 'group' ({raw['group']!r}) is only used by batch reads together with "
            "startingOffsets='group'; batch reads never commit a group position."
        )
    if starting.kind == "group" and "group" not in values:
        raise InvalidOptionError(
            "Option startingOffsets='group' needs the option 'group' (the group whose "
            "committed position to start from)."
        )
    low, high = values.get("minOffsetsPerTrigger"), values.get("maxOffsetsPerTrigger")
    if low is not None and high is not None and low > high:
        raise InvalidOptionError(
            f"Option 'minOffsetsPerTrigger' ({low}) must not exceed "
            f"'maxOffsetsPerTrigger' ({high})."
        )
    parsed = ReadOptions(
        mode=mode or "stream",
        connection=connection,
        streams=streams,
        stream_pattern=pattern,
        starting=starting,
        ending=_ending(values, raw),
        max_offsets_per_trigger=high,
        min_offsets_per_trigger=low,
        max_trigger_delay_ms=values["maxTriggerDelay"],
        min_partitions=values.get("minPartitions"),
        max_records_per_partition=values.get("maxRecordsPerPartition"),
        parallelism=values.get("defaultParallelism") or _host_cpus(),
        fail_on_data_loss=values["failOnDataLoss"],
        group=values.get("group"),
        include_headers=values["includeHeaders"],
        fetch_max_bytes=values["fetchMaxBytes"],
        value_columns=values["valueColumns"],
    )
    for position, option in ((parsed.starting, "startingOffsets"),
                             (parsed.ending, "endingOffsets")):
        for stream in position.offsets:
            if not parsed.subscribes(stream):
                raise InvalidOptionError(
                    f"Invalid value {raw[option.lower()]!r} for option '{option}': stream "
                    f"'{stream}' is not read by this query ({parsed.describe_subscription()})."
                )
    return parsed


def parse_connection_options(options: Mapping[str, str],
                             env: Mapping[str, str] | None = None) -> ConnectionOptions:
    """Only the connection options (broker, token and the tls* options: CONNECTION_SPECS)."""
    environ = os.environ if env is None else env
    raw = {key.lower(): str(value) for key, value in options.items()}
    values = {spec.name: parse_option_value(spec, raw[key]) if key in raw
              else table_default(CONNECTION_OPTIONS, key)
              for key, spec in CONNECTION_OPTIONS.items()}
    return _connection(values, raw, environ)


def _connection(values: dict[str, Any], raw: dict[str, str],
                environ: Mapping[str, str]) -> ConnectionOptions:
    broker = values.get("broker")
    if broker is None:
        from_env = environ.get(BROKER_ADDRESS_ENV, "").strip()
        if from_env:
            try:
                broker = parse_broker(from_env)
            except ValueError as exc:
                raise InvalidOptionError(
                    f"Invalid value {from_env!r} in environment variable {BROKER_ADDRESS_ENV} "
                    f"(used because option 'broker' is not set): {exc}. Accepted: host:port."
                ) from None
        else:
            broker = DEFAULT_BROKER
    certificates = values.get("tlsRootCertificates")
    client_cert, client_key = values.get("tlsClientCertificate"), values.get("tlsClientKey")
    if (client_cert is None) != (client_key is None):
        given, missing = (("tlsClientCertificate", "tlsClientKey") if client_cert is not None
                          else ("tlsClientKey", "tlsClientCertificate"))
        raise InvalidOptionError(
            f"Option '{given}' ({raw[given.lower()]!r}) needs option '{missing}' too: a client "
            "certificate and its private key go together."
        )
    tls = values["tls"]
    for option, value in (("tlsRootCertificates", certificates),
                          ("tlsClientCertificate", client_cert)):
        if value is None:
            continue
        if "tls" in raw and not tls:
            raise InvalidOptionError(
                f"Option '{option}' ({raw[option.lower()]!r}) needs TLS, "
                f"but option 'tls' is {raw['tls']!r}; set tls=true or drop the certificates."
            )
        tls = True
    return ConnectionOptions(broker=broker, token=values.get("token"), tls=tls,
                             root_certificates=certificates, client_cert=client_cert,
                             client_key=client_key)


def _starting(values: dict[str, Any], raw: dict[str, str], mode: ReadMode | None) -> Position:
    position: Position | None = values.get("startingOffsets")
    timestamp: int | None = values.get("startingTimestamp")
    if position is not None and timestamp is not None:
        raise InvalidOptionError(
            f"Set either 'startingOffsets' ({raw['startingoffsets']!r}) or "
            f"'startingTimestamp' ({raw['startingtimestamp']!r}), not both."
        )
    if timestamp is not None:
        return Position("timestamp", timestamp_ms=timestamp)
    if position is None:
        return Position("latest" if mode == "stream" else "earliest")
    if mode == "batch" and (
        position.kind == "latest" or LATEST_SENTINEL in position.offsets.values()
    ):
        raise InvalidOptionError(
            f"Invalid value {raw['startingoffsets']!r} for option 'startingOffsets': "
            "'latest' (-1) is not allowed for batch reads, which would read nothing. "
            f"Accepted: earliest, group or JSON like {OFFSETS_EXAMPLE}."
        )
    return position


def _ending(values: dict[str, Any], raw: dict[str, str]) -> Position:
    timestamp: int | None = values.get("endingTimestamp")
    if timestamp is None:
        return values["endingOffsets"]  # the table's default when not given
    if "endingoffsets" in raw:
        raise InvalidOptionError(
            f"Set either 'endingOffsets' ({raw['endingoffsets']!r}) or "
            f"'endingTimestamp' ({raw['endingtimestamp']!r}), not both."
        )
    return Position("timestamp", timestamp_ms=timestamp)
