"""Deciding which rows of an append are stored, and at which offsets.

Runs in two halves. ``prepare_append`` runs in the caller's thread with no
lock: it completes the columns, checks message sizes and finds ids repeated
within the append. ``plan_append`` runs in the group-commit leader under the
append lock, because it must see everything stored before: it drops rows
whose id is in the dedup window (or earlier in the same group) and reports
each dropped row with its original offset.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from npstream.broker.errors import ValueMismatchError
from npstream.broker.storage.batch_builder import (
    check_message_sizes,
    complete_publish_table,
    message_sizes,
    producer_id_mask,
    typed_publish_schema,
)
from npstream.broker.storage.dedup import DedupWindow, IntraDuplicates, find_intra_duplicates
from npstream.proto.value_schema import ValueMismatchError as SchemaValueMismatch
from npstream.proto.value_schema import value_sizes, value_struct

__all__ = ["PendingAppend", "PlannedRows", "TypedValues", "plan_append", "prepare_append",
           "typed_values"]


@dataclass(frozen=True)
class PendingAppend:
    """An append ready for the writer."""

    table: pa.Table  # PUBLISH_SCHEMA, every column present
    supplied: pa.BooleanArray | None  # rows with a producer id; None when there are none
    intra: IntraDuplicates | None  # ids repeated within this append
    # The value schema version ``table``'s value struct is in; 0: untyped (binary value).
    schema_version: int = 0


@dataclass(frozen=True)
class PlannedRows:
    """The rows of one append to store, and the duplicates dropped."""

    table: pa.Table
    supplied: pa.BooleanArray | None
    duplicates: list[tuple[int, int]]
    schema_version: int = 0


def prepare_append(
    data: pa.Table, stream: str, max_message_bytes: int, *, find_repeats: bool,
    typed: TypedValues | None = None,
) -> PendingAppend:
    """Check and complete ``data``; MessageTooLargeError before anything is queued.

    ``typed``: ``data``'s value is already the struct of a typed stream's
    schema version (typed_values), sized by ``value_sizes``.
    """
    if typed is None:
        table = complete_publish_table(data)
        check_message_sizes(message_sizes(table), stream, max_message_bytes)
    else:
        table = complete_publish_table(data, typed.schema)
        check_message_sizes(message_sizes(table, value_sizes=typed.sizes), stream,
                            max_message_bytes)
    ids = table.column("id").chunk(0) if table.num_rows else pa.array([], pa.string())
    supplied: pa.BooleanArray | None = None
    intra = None
    if table.num_rows and ids.null_count < len(ids):
        mask = producer_id_mask(ids)
        if pc.any(mask).as_py():
            supplied = mask
            if find_repeats:
                intra = find_intra_duplicates(ids, mask)
    return PendingAppend(table, supplied, intra, typed.version if typed is not None else 0)


@dataclass(frozen=True)
class TypedValues:
    """A typed append's value column as converted by typed_values."""

    version: int
    schema: pa.Schema  # typed_publish_schema of the version
    sizes: np.ndarray  # bytes of each value, for max_message_bytes (value_schema.value_sizes)


def typed_values(data: pa.Table, stream: str, version: int, value_schema: pa.Schema,
                 stored: pa.Schema) -> tuple[pa.Table, TypedValues]:
    """``data`` with its value as the struct of ``value_schema`` (version ``version``).

    The value may come as a struct (cast safely to the schema) or as JSON
    objects in bytes (parsed column-wise), both by value_schema.value_struct;
    a value that does not fit raises ValueMismatchError naming the message's
    index, the field and the expected type, before anything is queued.
    """
    index = data.column_names.index("value")
    try:
        values = value_struct(data.column(index), value_schema)
    except SchemaValueMismatch as exc:
        raise ValueMismatchError(f"publish to stream '{stream}' (value schema version "
                                 f"{version}): {exc}") from None
    value_type = stored.field("value").type
    if values.type != value_type:
        values = values.cast(value_type)
    schema = typed_publish_schema(value_type)
    table = data.set_column(index, schema.field("value"), values)
    return table, TypedValues(version, schema, value_sizes(values))


def plan_append(
    append: PendingAppend, first_offset: int, window: DedupWindow | None,
    pending: dict[str, int] | None,
) -> PlannedRows:
    """Rows of ``append`` to store from ``first_offset`` on, given the ids already stored.

    ``window`` is None when dedup is off. ``pending`` maps ids stored earlier in
    the same group to their offsets (None for a group of one); the producer
    ids kept here are added to it.
    """
    table, supplied = append.table, append.supplied
    if window is None or supplied is None:
        if window is not None and supplied is not None and pending is not None:
            _remember_pending(pending, table, supplied, first_offset)
        return PlannedRows(table, supplied, [], append.schema_version)
    rows = table.num_rows
    ids = table.column("id").chunk(0)
    supplied_np = np.asarray(supplied)
    drop = np.zeros(rows, dtype=bool)
    intra = append.intra
    if intra is not None:
        drop[intra.rows] = True
    candidates = np.flatnonzero(supplied_np & ~drop)
    candidate_ids = ids.take(pa.array(candidates)).to_pylist()
    hits = window.lookup(candidate_ids)
    if pending:
        hits.update({key: pending[key] for key in pending.keys() & candidate_ids})
    dup_rows: list[np.ndarray] = []
    dup_offsets: list[np.ndarray] = []
    hit_mask = np.zeros(rows, dtype=bool)
    if hits:
        hit_mask = np.asarray(pc.fill_null(pc.is_in(ids, value_set=pa.array(list(hits))), False))
        hit_mask &= supplied_np
        hit_rows = np.flatnonzero(hit_mask)
        drop[hit_rows] = True
        dup_rows.append(hit_rows)
        dup_offsets.append(np.fromiter(
            map(hits.__getitem__, ids.take(pa.array(hit_rows)).to_pylist()),
            dtype=np.int64, count=len(hit_rows),
        ))
    kept_rows = np.flatnonzero(~drop)
    if intra is not None:
        repeats = ~hit_mask[intra.rows]  # repeats of an id that was not in the window
        firsts = intra.first_rows[repeats]
        dup_rows.append(intra.rows[repeats])
        dup_offsets.append(first_offset + np.searchsorted(kept_rows, firsts))
    duplicates: list[tuple[int, int]] = []
    if dup_rows:
        all_rows = np.concatenate(dup_rows)
        all_offsets = np.concatenate(dup_offsets)
        order = np.argsort(all_rows, kind="stable")
        duplicates = list(zip(all_rows[order].tolist(), all_offsets[order].tolist(), strict=True))
    if len(kept_rows) != rows:
        selection = pa.array(kept_rows)
        table = table.take(selection)
        supplied = supplied.take(selection)
    if pending is not None:
        _remember_pending(pending, table, supplied, first_offset)
    return PlannedRows(table, supplied if pc.any(supplied).as_py() else None, duplicates,
                       append.schema_version)


def _remember_pending(
    pending: dict[str, int], table: pa.Table, supplied: pa.BooleanArray, first_offset: int
) -> None:
    rows = np.flatnonzero(np.asarray(supplied))
    if len(rows):
        ids = table.column("id").chunk(0).take(pa.array(rows)).to_pylist()
        pending.update(zip(ids, (first_offset + rows).tolist(), strict=True))
