"""The errors of value schemas: a bad schema, a refused evolution, a value that does not fit.

Their own module so that every part of the package raises the same three
classes and a caller (the registry, the SDK, the CLI) can catch them without
reaching into the parser or the converters; each side maps them to its own
error and reason.
"""

from __future__ import annotations


class SchemaError(ValueError):
    """The schema text or object is invalid or unsupported.

    ``field`` is the path of the field to blame ("loc.lat"; list elements are
    "tags.element", map keys/values "attrs.key"/"attrs.value"), ``position``
    the 0-based character position in the DDL/JSON text when parsing failed,
    so a CLI or an error detail can point at the spot.
    """

    def __init__(self, message: str, *, field: str | None = None, position: int | None = None):
        super().__init__(message)
        self.field = field
        self.position = position


class IncompatibleSchemaError(SchemaError):
    """A schema change the evolution rules refuse; the message names the field path and the rule."""

    def __init__(self, message: str, *, field: str, rule: str):
        super().__init__(message, field=field)
        self.rule = rule


class ValueMismatchError(ValueError):
    """A published value does not fit the schema; nothing of the request may be stored.

    ``index`` is the message's 0-based index in the request, ``field`` the
    field path ("" when the value as a whole is wrong, e.g. not a JSON
    object), ``expected`` the expected type as DDL.
    """

    def __init__(self, index: int, field: str, expected: str, problem: str):
        where = f"field '{field}'" if field else "the value"
        super().__init__(f"message {index}: {where} {problem}; expected {expected}")
        self.index = index
        self.field = field
        self.expected = expected
        self.problem = problem
