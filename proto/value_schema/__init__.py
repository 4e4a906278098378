"""Typed streams' value schemas (docs/typed-streams.md), defined once for the broker and the client.

A typed stream's value is a record of an Arrow schema restricted to the types
Spark has (the table in docs/typed-streams.md), so the same schema can be
written as Spark DDL, as Spark's StructType JSON or as a pyarrow schema, and
always comes out as the same canonical Arrow schema: the broker compares
versions with ``equals``, the Spark connector maps it to a StructType and the
client checks values before sending, all from this one package.

The package also holds the column-wise operations both sides need on values:
turning published values (a struct column, or JSON objects one per message)
into the schema's struct (``value_struct``), bringing a batch stored under an
older version to the latest one (``conform_batch``), the evolution rules
(``check_evolution``), per-message sizes for ``max_message_bytes``
(``value_sizes``) and, for writers that know only their columns' types yet,
which of them can never be written (``writable_problems``). None of them
loops over rows in Python on the success path; only locating the first bad
message of a refused request does.

Modules: ``errors`` (the three errors), ``types`` (the supported types'
DDL/Arrow/Spark names), ``parse`` (DDL and Spark JSON in), ``normalize``
(pyarrow schemas to the canonical form), ``render`` (DDL, Spark JSON and IPC
out), ``evolution`` (``check_evolution``), ``conform`` (column conversion,
``stored_schema``, ``conform_batch``), ``values`` (``value_struct`` and the
JSON reader), ``sizes`` (``value_sizes``). Import from the package: the names
below are its API.
"""

from npstream.proto.value_schema.conform import conform_batch, stored_schema, writable_problems
from npstream.proto.value_schema.errors import (
    IncompatibleSchemaError,
    SchemaError,
    ValueMismatchError,
)
from npstream.proto.value_schema.evolution import check_evolution
from npstream.proto.value_schema.normalize import normalize_schema
from npstream.proto.value_schema.parse import parse_schema
from npstream.proto.value_schema.render import (
    deserialize_schema,
    serialize_schema,
    to_ddl,
    to_spark_json,
)
from npstream.proto.value_schema.sizes import value_sizes
from npstream.proto.value_schema.values import value_struct

__all__ = [
    "IncompatibleSchemaError",
    "SchemaError",
    "ValueMismatchError",
    "check_evolution",
    "conform_batch",
    "deserialize_schema",
    "normalize_schema",
    "parse_schema",
    "serialize_schema",
    "stored_schema",
    "to_ddl",
    "to_spark_json",
    "value_sizes",
    "value_struct",
    "writable_problems",
]
