"""The read schema of the ``npstream`` source: untyped (binary value) or typed columns.

An untyped stream reads as ``stream, offset, id, key, value, timestamp[,
headers]`` with a binary ``value``. A typed stream (docs/typed-streams.md)
reads as ``stream, offset, id, key, timestamp[, headers]`` followed by the
value schema's fields as top-level columns (``valueColumns=flatten``, the
default) or by one ``value`` struct column (``valueColumns=struct``).

The schema is decided on the driver when the source is loaded, from one
stream description per stream (``lookup_value_schemas``), by the pure
``build_read_schema``: the streams must be all untyped, or all typed with
compatible schemas (the same field names with the same types, in any order;
nullability does not matter because every column is declared nullable).
Spark types come from pyspark's own Arrow converter (``from_arrow_schema``),
and the Arrow schema the tasks must return is pyspark's own conversion back
(``to_arrow_schema``), which is what Spark checks every batch against.

Tasks turn a stored batch into that schema with ``to_spark_batch``: the
stored ``value`` struct is projected by field name (``StructArray.flatten``:
no copy of the values), nested types are cast only where their Arrow type
differs from the declared one (nullability of child fields), so there is no
per-row Python.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from npstream.errors import StreamNotFound
from npstream.spark.errors import ReadSchemaError
from npstream.spark.options import ValueColumns

if TYPE_CHECKING:
    from npstream.client.client import Client
    from npstream.spark.options import ReadOptions

__all__ = [
    "ENVELOPE_COLUMNS",
    "ReadSchema",
    "ReadSchemaError",
    "ValueColumns",
    "build_read_schema",
    "lookup_value_schemas",
    "missing_streams_error",
    "resolve_read_schema",
    "spark_value_fields",
    "to_spark_batch",
]

# Envelope columns of every read, in order, before the value column(s).
ENVELOPE_COLUMNS: tuple[str, ...] = ("stream", "offset", "id", "key", "timestamp")


def _as_nullable(data_type: DataType) -> DataType:
    """The same type with every nested field, element and map value nullable."""
    if isinstance(data_type, StructType):
        return StructType([StructField(f.name, _as_nullable(f.dataType), True)
                           for f in data_type.fields])
    if isinstance(data_type, ArrayType):
        return ArrayType(_as_nullable(data_type.elementType), True)
    if isinstance(data_type, MapType):
        return MapType(_as_nullable(data_type.keyType), _as_nullable(data_type.valueType), True)
    return data_type


def spark_value_fields(value_schema: pa.Schema) -> StructType:
    """A typed stream's value fields as Spark fields, all nullable.

    pyspark's converter maps the types of typed streams exactly (bool, ints,
    floats, decimal, string, binary, date, timestamp with time zone, list,
    struct, map). Every column is nullable, as Spark makes the columns of its
    own streaming file sources: a later schema version may drop a NOT NULL
    while a query runs.
    """
    result = _as_nullable(from_arrow_schema(value_schema))
    assert isinstance(result, StructType)
    return result


@dataclass(frozen=True)
class ReadSchema:
    """The columns of one read: untyped, or typed with value fields flattened or as a struct."""

    include_headers: bool
    # The value schema's fields as Spark fields; None: untyped (binary value).
    value_fields: StructType | None = None
    value_columns: ValueColumns = "flatten"

    @property
    def typed(self) -> bool:
        return self.value_fields is not None

    @property
    def flattened(self) -> bool:
        return self.value_fields is not None and self.value_columns == "flatten"

    def spark_schema(self) -> StructType:
        """The DataFrame schema Spark gets from ``DataSource.schema()``."""
        fields = [
            StructField("stream", StringType()),
            StructField("offset", LongType()),
            StructField("id", StringType()),
            StructField("key", BinaryType()),
        ]
        if self.value_fields is None:
            fields.append(StructField("value", BinaryType()))
        fields.append(StructField("timestamp", TimestampType()))
        if self.include_headers:
            fields.append(StructField("headers", MapType(StringType(), BinaryType())))
        if self.value_fields is not None:
            if self.value_columns == "flatten":
                fields.extend(self.value_fields.fields)
            else:
                fields.append(StructField("value", self.value_fields))
        return StructType(fields)

    @functools.cached_property
    def arrow_schema(self) -> pa.Schema:
        """The Arrow schema of the batches handed to Spark (exactly what Spark checks)."""
        return to_arrow_schema(self.spark_schema(), timezone="UTC")

    def describe(self) -> str:
        if self.value_fields is None:
            return "untyped (binary value)"
        return f"typed, valueColumns={self.value_columns}"


# ---------------------------------------------------------------- choosing the schema


def _names(streams: list[str]) -> str:
    return ", ".join(f"'{name}'" for name in streams)


def _type_text(data_type: DataType) -> str:
    return data_type.simpleString()


def _compare(first: str, fields: StructType, other: str, other_fields: StructType) -> None:
    """ReadSchemaError naming both streams and the first differing field."""
    mine = {f.name: f.dataType for f in fields.fields}
    theirs = {f.name: f.dataType for f in other_fields.fields}
    for name in [*mine, *(n for n in theirs if n not in mine)]:
        if name not in theirs or name not in mine:
            has, lacks = (first, other) if name in mine else (other, first)
            raise ReadSchemaError(
                f"Typed streams '{first}' and '{other}' have incompatible value schemas: "
                f"field '{name}' is in '{has}' but not in '{lacks}'. Streams read together "
                "must have the same fields with the same types; read them in separate queries."
            )
        if mine[name] != theirs[name]:
            raise ReadSchemaError(
                f"Typed streams '{first}' and '{other}' have incompatible value schemas: "
                f"field '{name}' is {_type_text(mine[name])} in '{first}' and "
                f"{_type_text(theirs[name])} in '{other}'. Streams read together must have "
                "the same fields with the same types; read them in separate queries."
            )


def build_read_schema(value_schemas: Mapping[str, pa.Schema | None], include_headers: bool,
                      value_columns: ValueColumns = "flatten") -> ReadSchema:
    """The read schema for streams with these value schemas (None: untyped).

    No streams, or only untyped ones: the untyped schema. Only typed ones with
    compatible schemas: the typed schema, its fields in the order of the first
    stream by name. Anything else raises ReadSchemaError naming the streams.
    """
    typed = {name: schema for name, schema in sorted(value_schemas.items())
             if schema is not None}
    if not typed:
        return ReadSchema(include_headers)
    untyped = sorted(name for name, schema in value_schemas.items() if schema is None)
    if untyped:
        raise ReadSchemaError(
            f"Cannot read typed and untyped streams together: typed {_names(list(typed))}, "
            f"untyped {_names(untyped)}. An untyped stream's value is binary, a typed "
            "stream's value is columns; read them in separate queries."
        )
    first, *others = typed
    fields = spark_value_fields(typed[first])
    for other in others:
        _compare(first, fields, other, spark_value_fields(typed[other]))
    if value_columns == "flatten":
        envelope = [*ENVELOPE_COLUMNS, *(("headers",) if include_headers else ())]
        taken = {name.lower(): name for name in envelope}
        clashes = [f.name for f in fields.fields if f.name.lower() in taken]
        if clashes:
            raise ReadSchemaError(
                f"Stream '{first}' has value field(s) {_names(clashes)} named like the "
                f"source's column(s) {_names([taken[c.lower()] for c in clashes])}; with "
                "valueColumns=flatten (the default) they would collide. Set "
                ".option(\"valueColumns\", \"struct\") to read the value as one 'value' "
                f"struct column (then select value.{clashes[0]})."
            )
    return ReadSchema(include_headers, fields, value_columns)


def lookup_value_schemas(client: Client, options: ReadOptions) -> dict[str, pa.Schema | None]:
    """Each subscribed stream that exists now -> its latest value schema (None: untyped).

    One ListStreams for a pattern, one DescribeStream per named stream. A named
    stream that does not exist is left out (``resolve_read_schema`` names it).
    """
    if options.stream_pattern is not None:
        return {info.name: info.value_schema
                for info in client.list_streams(pattern=options.stream_pattern)}
    found: dict[str, pa.Schema | None] = {}
    for name in options.streams:
        try:
            found[name] = client.stream_info(name).value_schema
        except StreamNotFound:
            continue
    return found


def missing_streams_error(missing: list[str], broker: str) -> StreamNotFound:
    """The error for streams named by option 'stream' that do not exist (at load() or start)."""
    return StreamNotFound(
        f"stream(s) {', '.join(repr(name) for name in missing)} named by option 'stream' do "
        f"not exist on broker {broker}; create them first, or use streamPattern to pick "
        "streams up when they appear")


def resolve_read_schema(options: ReadOptions) -> ReadSchema:
    """Ask the broker (driver side) which schema the streams of ``options`` read with.

    A named stream that does not exist fails here, at ``load()``, rather than
    when the query starts.
    """
    with options.connection.connect() as client:
        schemas = lookup_value_schemas(client, options)
        missing = [name for name in options.streams if name not in schemas]
        if missing:
            raise missing_streams_error(missing, client.address)
    return build_read_schema(schemas, options.include_headers, options.value_columns)


# ---------------------------------------------------------------- task side


def _fit(column: pa.Array, target: pa.DataType, stream: str, name: str) -> pa.Array:
    """``column`` as ``target``: as is when equal, else a safe cast (nested nullability,
    a type widened since the query started)."""
    if column.type == target:
        return column
    try:
        return column.cast(target, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise ReadSchemaError(
            f"Stream '{stream}': value field '{name}' is now {column.type}, which does not fit "
            f"the query's column type {target} ({exc}). The stream's schema changed after "
            "the query was loaded; load() again (restart a streaming query) to read it."
        ) from None


def _value_children(batch: pa.RecordBatch, stream: str,
                    fields: list[pa.Field]) -> list[pa.Array]:
    """The stored value struct's children named by ``fields``, in their order and types."""
    value = batch.column("value")
    if not isinstance(value, pa.StructArray):
        raise ReadSchemaError(
            f"Stream '{stream}' is untyped (binary value), but this query reads typed streams; "
            "streams read together must all be typed with compatible schemas, or all untyped."
        )
    children = dict(zip((value.type.field(i).name for i in range(value.type.num_fields)),
                        value.flatten(), strict=True))
    columns = []
    for field in fields:
        column = children.get(field.name)
        if column is None:
            raise ReadSchemaError(
                f"Stream '{stream}' has no value field '{field.name}' that this query reads "
                f"(its fields: {', '.join(children) or 'none'}); streams read together must "
                "have the same fields. Read it in a separate query."
            )
        columns.append(_fit(column, field.type, stream, field.name))
    return columns


def to_spark_batch(batch: pa.RecordBatch, stream: str, schema: ReadSchema) -> pa.RecordBatch:
    """A fetched batch in the read schema, built column by column (no per-row work).

    Adds the constant ``stream`` column, converts timestamps from ms to us and,
    for typed reads, projects the stored ``value`` struct to the declared
    columns (flatten) or to the declared struct (struct).
    """
    target = schema.arrow_schema
    columns = [
        pa.repeat(pa.scalar(stream, pa.string()), batch.num_rows),
        batch.column("offset"),
        batch.column("id"),
        batch.column("key"),
    ]
    if not schema.typed:
        value = batch.column("value")
        if not pa.types.is_binary(value.type):
            raise ReadSchemaError(
                f"Stream '{stream}' is typed (its value is {value.type}), but this query reads "
                "untyped streams (binary value): it was loaded when no subscribed stream was "
                "typed. Streams read together must all be typed or all untyped; load() again "
                "(restart a streaming query) to read it typed."
            )
        columns.append(value)
    columns.append(batch.column("timestamp").cast(pa.timestamp("us", tz="UTC")))
    if schema.include_headers:
        columns.append(batch.column("headers"))
    if schema.typed:
        first = len(columns)
        if schema.flattened:
            columns.extend(_value_children(batch, stream, list(target)[first:]))
        else:
            struct_type = target.field(first).type
            fields = [struct_type.field(i) for i in range(struct_type.num_fields)]
            value = batch.column("value")
            if value.type == struct_type:
                columns.append(value)
            else:
                children = _value_children(batch, stream, fields)
                mask = value.is_null() if value.null_count else None
                columns.append(pa.StructArray.from_arrays(children, fields=fields, mask=mask))
    return pa.RecordBatch.from_arrays(columns, schema=target)
