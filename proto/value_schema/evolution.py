"""The evolution rules: whether a schema may follow another as a stream's next version.

The registry checks a change here once, when a stream's schema is updated;
the rules (no removal or rename, added fields nullable, NOT NULL only
dropped, types only widened) are what lets conform.conform_batch bring every
older batch to the latest version on read.
"""

from __future__ import annotations

import pyarrow as pa

from npstream.proto.value_schema.errors import IncompatibleSchemaError
from npstream.proto.value_schema.render import _type_ddl
from npstream.proto.value_schema.types import _FLOAT_WIDTH, _INT_WIDTH, _join

_RULE_REMOVED = "fields cannot be removed or renamed"
_RULE_ADDED = "added fields must be nullable"
_RULE_NOT_NULL = "NOT NULL can be dropped, never added"
_RULE_WIDEN = (
    "a type can only be widened: TINYINT -> SMALLINT -> INT -> BIGINT, FLOAT -> DOUBLE, "
    "DECIMAL(p,s) -> DECIMAL(p2,s) with p2 > p"
)


def _incompatible(path: str, what: str, rule: str) -> IncompatibleSchemaError:
    return IncompatibleSchemaError(f"field '{path}' {what} (rule: {rule})", field=path, rule=rule)


def _is_widening(old: pa.DataType, new: pa.DataType) -> bool:
    if old in _INT_WIDTH and new in _INT_WIDTH:
        return _INT_WIDTH[old] < _INT_WIDTH[new]
    if old in _FLOAT_WIDTH and new in _FLOAT_WIDTH:
        return _FLOAT_WIDTH[old] < _FLOAT_WIDTH[new]
    if pa.types.is_decimal(old) and pa.types.is_decimal(new):
        return bool(old.scale == new.scale and new.precision > old.precision)
    return False


def _check_nullability(old: bool, new: bool, path: str) -> None:
    if old and not new:
        raise _incompatible(path, "became NOT NULL", _RULE_NOT_NULL)


def _check_type(old: pa.DataType, new: pa.DataType, path: str) -> None:
    if pa.types.is_struct(old) and pa.types.is_struct(new):
        _check_fields([old.field(i) for i in range(old.num_fields)],
                      [new.field(i) for i in range(new.num_fields)], path)
    elif pa.types.is_list(old) and pa.types.is_list(new):
        element = _join(path, "element")
        _check_nullability(old.value_field.nullable, new.value_field.nullable, element)
        _check_type(old.value_type, new.value_type, element)
    elif pa.types.is_map(old) and pa.types.is_map(new):
        if old.key_type != new.key_type:
            raise _incompatible(
                _join(path, "key"),
                f"changed from {_type_ddl(old.key_type)} to {_type_ddl(new.key_type)}",
                "MAP keys cannot change")
        value = _join(path, "value")
        _check_nullability(old.item_field.nullable, new.item_field.nullable, value)
        _check_type(old.item_type, new.item_type, value)
    elif old != new and not _is_widening(old, new):
        raise _incompatible(path, f"changed from {_type_ddl(old)} to {_type_ddl(new)}",
                            _RULE_WIDEN)


def _check_fields(old: list[pa.Field], new: list[pa.Field], path: str) -> None:
    new_by_name = {f.name: f for f in new}
    old_names = {f.name for f in old}
    for field in old:
        full = _join(path, field.name)
        if field.name not in new_by_name:
            raise _incompatible(full, "was removed", _RULE_REMOVED)
        replacement = new_by_name[field.name]
        _check_nullability(field.nullable, replacement.nullable, full)
        _check_type(field.type, replacement.type, full)
    for field in new:
        if field.name not in old_names and not field.nullable:
            raise _incompatible(_join(path, field.name), "was added as NOT NULL", _RULE_ADDED)


def check_evolution(old: pa.Schema, new: pa.Schema) -> None:
    """Raise IncompatibleSchemaError unless ``new`` may follow ``old`` as the next version.

    Fields match by name at every level (order does not matter); see
    docs/typed-streams.md for the rules. Both schemas are canonical.
    """
    _check_fields(list(old), list(new), "")
