"""The target stream of a write, checked (or created) on the driver when the query starts.

A write whose value is a typed stream's record (the data's columns, or a
struct ``value``) can only land in a typed stream whose schema takes those
fields; finding out in the first task, or at the broker half way through a
micro-batch, would fail the query late and name a row instead of a column.
So the driver describes the ``stream`` option's stream once and fails the
query at start with every column that cannot be written (missing NOT NULL
fields, fields the schema lacks, types that never convert), using the same
rules the broker converts values by (``writable_problems``).

``createStream=true`` creates a missing stream: typed with the data's schema
(version 1) for a typed write, untyped for a binary/string ``value``.
Rows routed by a ``stream`` column are checked by the broker at Stage time
(per target, naming the row and field), since their targets are only known
then. An untyped write (binary/string ``value``) needs no broker call at
planning: into a typed stream its values are JSON objects the broker
converts, and a missing stream is auto-created at commit when the broker
allows it, as before.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import pyarrow as pa

from npstream.errors import StreamNotFound
from npstream.proto.value_schema import to_ddl, writable_problems
from npstream.spark.options import InvalidOptionError
from npstream.spark.writer_options import WriteOptions

if TYPE_CHECKING:
    from npstream.client.client import Client

__all__ = ["check_write_target"]

log = logging.getLogger(__name__)


def check_write_target(options: WriteOptions) -> None:
    """Fail the query at start if its typed rows cannot go to the target; create it if asked."""
    stream = options.stream
    if stream is None or (options.value_schema is None and not options.create_stream):
        return
    with options.connection.connect() as client:
        try:
            info = client.stream_info(stream)
        except StreamNotFound:
            _missing(options, stream, client)
            return
    value_schema = options.value_schema
    if value_schema is None:
        return  # bytes: JSON objects for a typed stream (converted by the broker), or bytes
    ddl = to_ddl(value_schema)
    if info.value_schema is None:
        raise InvalidOptionError(
            f"Stream '{stream}' is untyped (binary values), but the data is written as a typed "
            f"stream's record ({_what(options)}: {ddl}). Write a binary or string 'value' "
            "column instead (e.g. to_json(struct(...))), or give the stream a value schema "
            f"while it is empty (npstream streams update {stream} --schema '{ddl}').")
    problems = writable_problems(value_schema, info.value_schema)
    if problems:
        prefix = "field 'value." if options.value_fields == () else "column '"
        listed = "; ".join(f"{prefix}{path}' {problem}" for path, problem in problems)
        version = info.schema_versions[-1].version if info.schema_versions else 1
        raise InvalidOptionError(
            f"The data cannot be written to typed stream '{stream}' (value schema version "
            f"{version}: {to_ddl(info.value_schema)}): {listed}. Select, cast or rename the "
            "columns to match the stream's schema (fields the data lacks are written as null "
            "unless NOT NULL).")


def _missing(options: WriteOptions, stream: str, client: Client) -> None:
    """A missing target: created with createStream=true; refused for a typed write."""
    value_schema: pa.Schema | None = options.value_schema
    if options.create_stream:
        created = client.create_stream(stream, schema=value_schema, exist_ok=True)
        log.info("npstream sink: created stream '%s' (%s) for the write", stream,
                 f"typed, value schema version 1: {created.value_schema_ddl}"
                 if value_schema is not None else "untyped")
        return
    if value_schema is None:
        return  # untyped: auto-created at commit where the broker allows it
    ddl = to_ddl(value_schema)
    raise InvalidOptionError(
        f"Stream '{stream}' does not exist, and the data is written as a typed stream's "
        f"record ({_what(options)}: {ddl}). Set .option('createStream', 'true') to create it "
        f"with that schema, or create it first: npstream streams create {stream} "
        f"--schema '{ddl}'.")


def _what(options: WriteOptions) -> str:
    return "the struct column 'value'" if not options.value_fields else "columns"
