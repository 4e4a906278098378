"""Kafka's message encoding, driven by Kafka's own JSON message schemas.

One schema describes every version of a message: which fields exist in which
versions, which are nullable, and from which version the message is
"flexible" (KIP-482: compact lengths as unsigned varints, tagged fields after
every struct). ``MessageSchema.decode``/``encode`` walk that description, so
the flexible and the older versions both come from the one file Kafka ships
(``schemas/``, Apache-2.0) instead of a hand-written class per version.

Messages are plain dicts keyed by the schema's field names (``"TopicId"``); a
field absent from the version being encoded is ignored, and one missing from
the dict is written with the schema's default.
"""

from __future__ import annotations

import json
import re
import struct
import uuid
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from npstream.broker.kafka.errors import CodecError

__all__ = [
    "CodecError",
    "MessageSchema",
    "Reader",
    "Writer",
    "load_schema",
]

Message = dict[str, Any]

_INT = {
    "int8": struct.Struct(">b"),
    "int16": struct.Struct(">h"),
    "uint16": struct.Struct(">H"),
    "int32": struct.Struct(">i"),
    "uint32": struct.Struct(">I"),
    "int64": struct.Struct(">q"),
    "float64": struct.Struct(">d"),
}
_NULL_UUID = uuid.UUID(int=0)


class Reader:
    """Reads Kafka primitives from a buffer; every overrun is a CodecError, never an IndexError."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes | memoryview, pos: int = 0) -> None:
        self.buf = memoryview(buf)
        self.pos = pos

    def take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.buf):
            raise CodecError(f"truncated: needs {n} bytes at {self.pos}, "
                             f"{len(self.buf) - self.pos} left")
        view = self.buf[self.pos:self.pos + n]
        self.pos += n
        return view

    def fixed(self, kind: str) -> Any:
        codec = _INT[kind]
        return codec.unpack(self.take(codec.size))[0]

    def uvarint(self) -> int:
        value = shift = 0
        while True:
            byte = self.take(1)[0]
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
            if shift > 63:
                raise CodecError("varint longer than 10 bytes")

    def varint(self) -> int:
        raw = self.uvarint()
        return (raw >> 1) ^ -(raw & 1)

    def length(self, flexible: bool, wide: bool) -> int:
        """A length or count: -1 for null (compact forms store length + 1)."""
        if flexible:
            return self.uvarint() - 1
        return int(self.fixed("int32" if wide else "int16"))

    def string(self, flexible: bool) -> str | None:
        n = self.length(flexible, wide=False)
        if n < 0:
            return None
        try:
            return bytes(self.take(n)).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CodecError(f"string is not UTF-8: {exc}") from None

    def blob(self, flexible: bool) -> bytes | None:
        n = self.length(flexible, wide=True)
        return None if n < 0 else bytes(self.take(n))

    def remaining(self) -> int:
        return len(self.buf) - self.pos


class Writer:
    """Accumulates Kafka primitives; ``bytes()`` joins them once at the end."""

    __slots__ = ("parts",)

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def fixed(self, kind: str, value: Any) -> None:
        try:
            self.parts.append(_INT[kind].pack(value))
        except struct.error as exc:
            raise CodecError(f"{kind} value {value!r}: {exc}") from None

    def uvarint(self, value: int) -> None:
        out = bytearray()
        while value > 0x7F:
            out.append((value & 0x7F) | 0x80)
            value >>= 7
        out.append(value)
        self.parts.append(bytes(out))

    def varint(self, value: int) -> None:
        self.uvarint((value << 1) ^ (value >> 63))

    def length(self, n: int, flexible: bool, wide: bool) -> None:
        if flexible:
            self.uvarint(n + 1)
        else:
            self.fixed("int32" if wide else "int16", n)

    def string(self, value: str | None, flexible: bool) -> None:
        if value is None:
            self.length(-1, flexible, wide=False)
            return
        data = value.encode("utf-8")
        self.length(len(data), flexible, wide=False)
        self.parts.append(data)

    def blob(self, value: bytes | memoryview | None, flexible: bool) -> None:
        if value is None:
            self.length(-1, flexible, wide=True)
            return
        self.length(len(value), flexible, wide=True)
        self.parts.append(bytes(value))

    def __bytes__(self) -> bytes:
        return b"".join(self.parts)


@dataclass(frozen=True)
class Versions:
    """A schema version range: "0+", "3-5", "7", "none"."""

    low: int
    high: int  # inclusive; -1 with low 0 for "none"

    @classmethod
    def parse(cls, text: str | None) -> Versions:
        if text is None or text == "none":
            return cls(0, -1)
        if text.endswith("+"):
            return cls(int(text[:-1]), 0x7FFF)
        low, _, high = text.partition("-")
        return cls(int(low), int(high or low))

    def __contains__(self, version: int) -> bool:
        return self.low <= version <= self.high


@dataclass(frozen=True)
class Field:
    name: str
    type: str  # "int32", "string", "[]int32", "[]Struct", "Struct", "records", ...
    versions: Versions
    nullable: Versions
    tagged: Versions
    tag: int | None
    flexible_override: Versions | None  # a field's own "flexibleVersions" (the header's client id)
    default: Any
    fields: tuple[Field, ...]  # of a struct or struct array

    @property
    def is_array(self) -> bool:
        return self.type.startswith("[]")

    @property
    def element(self) -> str:
        return self.type[2:] if self.is_array else self.type


def _default(kind: str, text: str | None, nullable: bool) -> Any:
    if text == "null" or (text is None and nullable and kind not in _INT and kind != "bool"):
        return None
    if kind in ("int8", "int16", "uint16", "int32", "uint32", "int64"):
        return int(text, 0) if text else 0
    if kind == "float64":
        return float(text) if text else 0.0
    if kind == "bool":
        return text == "true"
    if kind == "string":
        return text or ""
    if kind == "uuid":
        return _NULL_UUID
    if kind in ("bytes", "records"):
        return b""
    return None


def _field(spec: dict[str, Any], common: dict[str, list[dict[str, Any]]]) -> Field:
    kind = spec["type"]
    element = kind[2:] if kind.startswith("[]") else kind
    children = spec.get("fields") or common.get(element) or []
    nullable = Versions.parse(spec.get("nullableVersions"))
    is_struct = bool(children)
    default: Any
    if kind.startswith("[]"):
        default = None if spec.get("nullableVersions") and spec.get("default") == "null" else []
    elif is_struct:
        default = None
    else:
        default = _default(kind, spec.get("default"), bool(spec.get("nullableVersions")))
    return Field(
        name=spec["name"], type=kind, versions=Versions.parse(spec.get("versions")),
        nullable=nullable, tagged=Versions.parse(spec.get("taggedVersions")),
        tag=spec.get("tag"),
        flexible_override=(Versions.parse(spec["flexibleVersions"])
                           if "flexibleVersions" in spec else None),
        default=default, fields=tuple(_field(c, common) for c in children),
    )


def _strip_comments(text: str) -> str:
    return re.sub(r"^\s*//.*$", "", text, flags=re.MULTILINE)


class MessageSchema:
    """One Kafka message (a request, a response or a header) in every version it has."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.name: str = spec["name"]
        self.api_key: int | None = spec.get("apiKey")
        self.valid = Versions.parse(spec["validVersions"])
        self.flexible = Versions.parse(spec.get("flexibleVersions"))
        common = {c["name"]: c["fields"] for c in spec.get("commonStructs", [])}
        self.fields = tuple(_field(f, common) for f in spec["fields"])

    # ---------------------------------------------------------------- decode

    def decode(self, reader: Reader, version: int) -> Message:
        return self._read_struct(reader, self.fields, version, version in self.flexible)

    def _read_struct(self, r: Reader, fields: tuple[Field, ...], v: int,
                     flexible: bool) -> Message:
        out: Message = {}
        for f in fields:
            if v not in f.versions or (flexible and v in f.tagged):
                out[f.name] = _copy_default(f)
                continue
            out[f.name] = self._read_value(r, f, v, flexible)
        if flexible:
            by_tag = {f.tag: f for f in fields if v in f.tagged and v in f.versions}
            for _ in range(r.uvarint()):
                tag, size = r.uvarint(), r.uvarint()
                body = Reader(r.take(size))
                known = by_tag.get(tag)
                if known is not None:  # unknown tags are skipped, as Kafka does
                    out[known.name] = self._read_value(body, known, v, flexible)
        return out

    def _read_value(self, r: Reader, f: Field, v: int, flexible: bool) -> Any:
        flex = flexible if f.flexible_override is None else v in f.flexible_override
        if f.is_array:
            n = r.length(flex, wide=True)
            if n < 0:
                if v not in f.nullable:
                    raise CodecError(f"{f.name}: null array in version {v}")
                return None
            if n > r.remaining():  # every element takes at least one byte
                raise CodecError(f"{f.name}: {n} elements but {r.remaining()} bytes left")
            if f.fields:
                return [self._read_struct(r, f.fields, v, flexible) for _ in range(n)]
            return [self._read_scalar(r, f.element, f, v, flex) for _ in range(n)]
        if f.fields:
            return self._read_struct(r, f.fields, v, flexible)
        return self._read_scalar(r, f.type, f, v, flex)

    @staticmethod
    def _read_scalar(r: Reader, kind: str, f: Field, v: int, flex: bool) -> Any:
        if kind in _INT:
            return r.fixed(kind)
        if kind == "bool":
            return r.take(1)[0] != 0
        if kind == "uuid":
            return uuid.UUID(bytes=bytes(r.take(16)))
        value: str | bytes | None
        if kind == "string":
            value = r.string(flex)
        elif kind in ("bytes", "records"):
            value = r.blob(flex)
        else:
            raise CodecError(f"{f.name}: unsupported type {kind}")
        if value is None and v not in f.nullable:
            raise CodecError(f"{f.name}: null in version {v}, which does not allow it")
        return value

    # ---------------------------------------------------------------- encode

    def encode(self, message: Message, version: int) -> bytes:
        w = Writer()
        self.write(w, message, version)
        return bytes(w)

    def write(self, w: Writer, message: Message, version: int) -> None:
        self._write_struct(w, self.fields, message, version, version in self.flexible)

    def _write_struct(self, w: Writer, fields: tuple[Field, ...], msg: Message, v: int,
                      flexible: bool) -> None:
        tagged: list[tuple[int, bytes]] = []
        for f in fields:
            if v not in f.versions:
                continue
            value = msg.get(f.name, f.default)
            if flexible and v in f.tagged:
                if value is None or value == f.default:
                    continue
                body = Writer()
                self._write_value(body, f, value, v, flexible)
                tagged.append((f.tag or 0, bytes(body)))
                continue
            self._write_value(w, f, value, v, flexible)
        if flexible:
            w.uvarint(len(tagged))
            for tag, body_bytes in sorted(tagged):
                w.uvarint(tag)
                w.uvarint(len(body_bytes))
                w.parts.append(body_bytes)

    def _write_value(self, w: Writer, f: Field, value: Any, v: int, flexible: bool) -> None:
        flex = flexible if f.flexible_override is None else v in f.flexible_override
        if f.is_array:
            if value is None:
                w.length(-1, flex, wide=True)
                return
            w.length(len(value), flex, wide=True)
            for item in value:
                if f.fields:
                    self._write_struct(w, f.fields, item, v, flexible)
                else:
                    self._write_scalar(w, f.element, item, flex)
            return
        if f.fields:
            self._write_struct(w, f.fields, value or {}, v, flexible)
            return
        self._write_scalar(w, f.type, value, flex)

    @staticmethod
    def _write_scalar(w: Writer, kind: str, value: Any, flex: bool) -> None:
        if kind in _INT:
            w.fixed(kind, value)
        elif kind == "bool":
            w.parts.append(b"\x01" if value else b"\x00")
        elif kind == "uuid":
            w.parts.append((value or _NULL_UUID).bytes)
        elif kind == "string":
            w.string(value, flex)
        else:
            w.blob(value, flex)


def _copy_default(f: Field) -> Any:
    return list(f.default) if isinstance(f.default, list) else f.default


@cache
def load_schema(name: str) -> MessageSchema:
    """A schema of ``schemas/`` by message name (``"FetchRequest"``)."""
    text = resources.files(f"{__package__}.schemas").joinpath(f"{name}.json").read_text()
    return MessageSchema(json.loads(_strip_comments(text)))
