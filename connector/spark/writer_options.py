"""Every write option of the ``npstream`` Spark sink, and the input schema it accepts.

Checked once, on the driver, when the query (or batch write) is planned, so a
typo, a bad value or an unusable column fails the query at start with a
message naming the option (or column), the value and what is accepted —
never later inside a task. The connection options (``broker``, ``token``,
``tls``, ``tlsRootCertificates``) are the reader's (npstream.spark.options),
so both directions connect the same way.

Sink id, the name under which the broker records committed batches: option
``sinkId``; else, for streaming writes, ``query-<id>`` with the query's id as
Spark records it in the checkpoint (npstream.spark.checkpoint), so a
restarted query finds its own commits and no other query does. Read here from
the checkpoint's ``metadata`` file when ``checkpointLocation`` (which Spark
passes to the writer lower-cased) names a local directory; otherwise the sink
id stays None and each task takes the id from its local property. Batch
writes get a fresh sink id per job: one all-or-nothing commit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa

from npstream.errors import InvalidArgument
from npstream.proto.names import NAME_RULE, STREAM_NAME_RE, validate_stream_name
from npstream.proto.units import parse_size
from npstream.proto.value_schema import SchemaError, normalize_schema
from npstream.spark.checkpoint import checkpoint_query_id, query_sink_id
from npstream.spark.options import (
    BOTH,
    CONNECTION_SPECS,
    STREAM,
    ConnectionOptions,
    InvalidOptionError,
    OptionSpec,
    check_known_options,
    parse_bool,
    parse_connection_options,
    parse_option_value,
)

__all__ = [
    "ACCEPTED_COLUMNS",
    "IGNORED_COLUMNS",
    "WRITER_OPTIONS",
    "WriteMode",
    "WriteOptions",
    "parse_write_options",
]

WriteMode = Literal["stream", "batch"]

# ---- tuning -------------------------------------------------------------
# stageBytes: a task sends its rows in Stage requests of about this many Arrow
# bytes. 8 MiB amortises the per-request fsyncs and Python work on the broker
# (and each staged file becomes one segment) while staying far below the 64 MiB
# gRPC message limit (a single larger row still goes alone); against 4 MiB it
# took 10-25% off the broker's CPU and ~40% off the commit (docs/benchmarks.md,
# "Sink: Stage by file"). A task holds up to two requests in memory.
DEFAULT_STAGE_BYTES = "8MiB"
MIN_STAGE_BYTES = 64 << 10
MAX_STAGE_BYTES = 32 << 20



def _parse_stream(text: str) -> str:
    name = text.strip()
    if "," in name:
        raise ValueError("the writer takes one stream; route rows with a 'stream' column instead")
    return validate_stream_name(name)


def _parse_sink_id(text: str) -> str:
    sink_id = text.strip()
    if not STREAM_NAME_RE.fullmatch(sink_id):
        raise ValueError(f"use {NAME_RULE}")
    return sink_id


def _parse_stage_bytes(text: str) -> int:
    size = parse_size(text)
    if not MIN_STAGE_BYTES <= size <= MAX_STAGE_BYTES:
        raise ValueError(f"must be between {MIN_STAGE_BYTES} (64KiB) and {MAX_STAGE_BYTES} "
                         "(32MiB) bytes")
    return size


def _parse_any(text: str) -> str:
    return text


WRITE_SPECS: tuple[OptionSpec, ...] = (
    *CONNECTION_SPECS,
    OptionSpec("stream", None, _parse_stream, "one stream name", BOTH,
               "target stream (one name); overrides a `stream` column",
               example="`orders-clean`"),
    OptionSpec("sinkId", None, _parse_sink_id,
               NAME_RULE, STREAM,
               "name of the query's commit record on the broker "
               "(`[A-Za-z0-9][A-Za-z0-9._-]{0,254}`)",
               example="`orders-clean-v1`",
               shown="`query-<id>`, the query's id in its checkpoint"),
    OptionSpec("stageBytes", DEFAULT_STAGE_BYTES, _parse_stage_bytes,
               "a size between 64KiB and 32MiB such as 4MiB", BOTH,
               "Arrow bytes per Stage request sent by a task (64KiB to 32MiB). Each "
               "request's staged file of at least the broker's `sink_adopt_min_bytes` "
               "becomes a segment of the target stream at commit, so larger requests "
               "mean fewer, larger segments (and two requests in flight per task cost "
               "twice this in task memory)",
               example="`16MiB`"),
    OptionSpec("createStream", "false", parse_bool, "true or false", BOTH,
               "create the `stream` option's stream when missing: typed with the "
               "DataFrame's schema for a typed write, untyped otherwise "
               "([Writing typed streams](#writing-typed-streams))",
               example="`true`"),
    OptionSpec("localStaging", "true", parse_bool, "true or false", BOTH,
               "a task on the broker's machine hands its rows over in a file of the "
               "broker's stage inbox instead of sending them over gRPC (checked by both "
               "sides; anything unusable falls back to gRPC). `false`: always gRPC "
               "([exactly-once.md](exactly-once.md#stage-by-file-on-the-brokers-machine))",
               example="`false`"),
    OptionSpec("checkpointLocation", None, _parse_any, "a path (set by Spark)", STREAM,
               "set on the query as usual; the driver reads the query's id from it "
               "(the default sink id)",
               example="`/data/ckpt/q`",
               shown="—"),
    OptionSpec("queryName", None, _parse_any, "a name (set by Spark)", STREAM,
               "set by Spark; not used for the sink id",
               example="set with `.queryName()`",
               shown="—"),
)

_SPECS_BY_KEY: dict[str, OptionSpec] = {spec.name.lower(): spec for spec in WRITE_SPECS}
# The documented names of every write option (source.py checks unknown options against it).
WRITER_OPTIONS: frozenset[str] = frozenset(spec.name for spec in WRITE_SPECS)

# Input columns: name -> the Spark types accepted (simpleString form). A struct
# ``value`` (a typed stream's record) is accepted too, and with no ``value``
# column at all the other columns are a typed stream's fields (module doc).
ACCEPTED_COLUMNS: dict[str, tuple[str, ...]] = {
    "value": ("string", "binary"),
    "key": ("string", "binary"),
    "id": ("string",),
    "headers": ("map<string,string>", "map<string,binary>"),
    "stream": ("string",),
}
# Columns of the npstream reader's schema that the broker assigns itself; a
# DataFrame read from one stream can be written to another without a select.
IGNORED_COLUMNS: frozenset[str] = frozenset({"offset", "timestamp"})


@dataclass(frozen=True)
class WriteOptions:
    """The validated write options of one query or batch write; picklable for tasks.

    No defaults of its own: they are the option table's (WRITE_SPECS).
    """

    mode: WriteMode
    connection: ConnectionOptions
    # None: the query's id, known to the tasks only (npstream.spark.checkpoint).
    sink_id: str | None
    stream: str | None
    stage_bytes: int
    columns: tuple[str, ...]  # input columns sent to the broker, in input order
    use_stream_column: bool
    local_staging: bool
    create_stream: bool = False
    checkpoint: str | None = None  # the checkpointLocation option (streaming), as given
    # Typed writes (docs/typed-streams.md): the input columns a task packs into the
    # ``value`` struct (empty: the value is a column of its own), and the value's
    # Arrow schema (fields of the struct), None for a binary/string value.
    value_fields: tuple[str, ...] = ()
    value_schema: pa.Schema | None = None


@dataclass(frozen=True)
class _Columns:
    """What the input schema says about a write (``_check_columns``)."""

    sent: tuple[str, ...]  # input columns sent to the broker, in input order
    value_fields: tuple[str, ...] = ()  # packed into the value struct by each task
    value_schema: pa.Schema | None = None  # the typed value's fields; None: bytes


def _value_schema(fields: list[Any], where: str) -> pa.Schema:
    """The Arrow schema of a typed value's Spark fields, as a value schema (normalized)."""
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType

    try:
        return normalize_schema(to_arrow_schema(StructType(fields), timezone="UTC"))
    except SchemaError as exc:
        name = (exc.field or "").split(".")[0]
        spark_type = next((f.dataType.simpleString() for f in fields if f.name == name), "?")
        raise InvalidOptionError(
            f"{where.format(name=name)} has type {spark_type}, which a typed stream cannot "
            f"hold: {exc}. Cast or drop it before writing.") from None
    except (TypeError, AssertionError) as exc:  # pyspark's converter refuses the type
        raise InvalidOptionError(f"The data to write has a type a typed stream cannot hold: "
                                 f"{exc}") from None


def _check_columns(schema: Any) -> _Columns:
    """The input columns to send; InvalidOptionError for an unusable column or type.

    Three shapes: a binary/string ``value`` (untyped, or JSON objects for a
    typed stream), a struct ``value`` (a typed stream's record, e.g. a read
    with valueColumns=struct), or no ``value`` column: then every column
    that is not ``id``, ``key``, ``headers``, ``stream`` (or the ignored
    ``offset``, ``timestamp``) is a field of a typed stream's record.
    """
    fields = {f.name: f.dataType.simpleString() for f in schema.fields}
    accepted = ", ".join(f"{name} ({' or '.join(types)})"
                         for name, types in ACCEPTED_COLUMNS.items())
    value = next((f for f in schema.fields if f.name == "value"), None)
    if value is None:
        envelope = [f for f in schema.fields if f.name in ACCEPTED_COLUMNS]
        record = [f for f in schema.fields
                  if f.name not in ACCEPTED_COLUMNS and f.name not in IGNORED_COLUMNS]
        if not record:
            raise InvalidOptionError(
                f"The data to write has no 'value' column (columns: {', '.join(fields) or 'none'})"
                f" and no other column to write as a typed stream's fields. Accepted columns: "
                f"{accepted}, or a typed stream's fields as columns.")
        _check_envelope_types(envelope)
        value_schema = _value_schema(record, "Column '{name}'")
        return _Columns(tuple(f.name for f in schema.fields if f.name not in IGNORED_COLUMNS),
                        tuple(f.name for f in record), value_schema)
    if value.dataType.typeName() == "struct":
        value_schema = _value_schema(list(value.dataType.fields), "Field 'value.{name}'")
    else:
        value_schema = None
    for name, type_name in fields.items():
        if name in IGNORED_COLUMNS:
            continue
        if name not in ACCEPTED_COLUMNS:
            raise InvalidOptionError(
                f"Column '{name}' ({type_name}) cannot be written to npstream. Accepted columns: "
                f"{accepted}; {' and '.join(repr(c) for c in sorted(IGNORED_COLUMNS))} are ignored "
                "(the broker assigns them). Select or rename the columns before writing; to "
                "write a typed stream's fields as columns, drop the 'value' column.")
    _check_envelope_types([f for f in schema.fields if f.name in ACCEPTED_COLUMNS
                           and not (f.name == "value" and value_schema is not None)])
    return _Columns(tuple(name for name in fields if name not in IGNORED_COLUMNS),
                    (), value_schema)


def _check_envelope_types(columns: list[Any]) -> None:
    for column in columns:
        type_name = column.dataType.simpleString()
        if type_name not in ACCEPTED_COLUMNS[column.name]:
            raise InvalidOptionError(
                f"Column '{column.name}' has type {type_name}; the npstream writer accepts "
                f"{' or '.join(ACCEPTED_COLUMNS[column.name])}"
                + (" (or a struct: a typed stream's record)" if column.name == "value" else "")
                + ". Cast it before writing.")


def parse_write_options(options: Mapping[str, str], schema: Any, mode: WriteMode, *,
                        overwrite: bool = False, batch_sink_id: str | None = None,
                        env: Mapping[str, str] | None = None) -> WriteOptions:
    """Validate the options and input schema of a streaming or batch write.

    ``batch_sink_id`` is the fresh per-job sink id of a batch write.
    Raises InvalidOptionError naming the option or column at fault.
    """
    check_known_options(options, {key: spec.name for key, spec in _SPECS_BY_KEY.items()},
                        'the "npstream" sink')
    raw = {key.lower(): str(value) for key, value in options.items()}
    values: dict[str, Any] = {}
    for key, spec in _SPECS_BY_KEY.items():
        if key in raw:
            if mode not in spec.modes:
                raise InvalidOptionError(
                    f"Option '{spec.name}' (value {raw[key]!r}) applies to streaming writes "
                    "(writeStream) only; a batch write is one all-or-nothing commit under a "
                    "sink id of its own. Remove the option.")
            values[spec.name] = parse_option_value(spec, raw[key])
        elif spec.default is not None:
            values[spec.name] = spec.parse(spec.default)
    if mode == "batch" and overwrite:
        raise InvalidOptionError(
            "Save mode 'overwrite' is not supported: npstream streams are append-only logs. "
            "Use mode('append'), or delete the stream's messages first.")
    connection = parse_connection_options(
        {k: v for k, v in raw.items() if k in {s.name.lower() for s in CONNECTION_SPECS}}, env)
    checked = _check_columns(schema)
    columns = checked.sent
    stream: str | None = values.get("stream")
    if stream is None and "stream" not in columns:
        raise InvalidOptionError(
            "No target stream: set the option 'stream' (e.g. .option('stream', 'orders')) "
            "or give the data a 'stream' column (string) naming each row's stream.")
    use_stream_column = stream is None and "stream" in columns
    if not use_stream_column and "stream" in columns:
        columns = tuple(c for c in columns if c != "stream")  # the option wins, as in Kafka
    checkpoint = values.get("checkpointLocation", "").strip() or None
    sink_id: str | None
    if mode == "batch":
        if batch_sink_id is None:
            raise InvalidArgument("batch writes need batch_sink_id")
        sink_id = batch_sink_id
    elif "sinkId" in values:
        sink_id = values["sinkId"]
    else:
        query_id = checkpoint_query_id(checkpoint) if checkpoint else None
        sink_id = query_sink_id(query_id) if query_id else None
    if values["createStream"] and stream is None:
        raise InvalidOptionError(
            "Option 'createStream' (value 'true') needs the option 'stream' naming the stream "
            "to create; rows routed by a 'stream' column go to existing streams only.")
    return WriteOptions(mode=mode, connection=connection, sink_id=sink_id, stream=stream,
                        stage_bytes=values["stageBytes"], columns=columns,
                        use_stream_column=use_stream_column,
                        local_staging=values["localStaging"],
                        create_stream=values["createStream"], checkpoint=checkpoint,
                        value_fields=checked.value_fields,
                        value_schema=checked.value_schema)
