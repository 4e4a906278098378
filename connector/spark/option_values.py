"""How the text of one read option becomes its value: the value parsers.

Each parser takes the raw string Spark hands over (one option, no context)
and returns the parsed value or raises ``ValueError`` with a short reason;
``options.parse_option_value`` adds the option name, the value and the
accepted values to make the user-facing message. The rules for a single
value live here, apart from the option table (names, defaults, where an
option applies: ``options.py``) and the checks that span several options
(``options.py`` too), so each can be read on its own.

``Position`` is here because two parsers (startingOffsets, endingOffsets)
produce it; it travels to executors inside ``ReadOptions``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from npstream.client.connection import resolve_address
from npstream.errors import InvalidArgument
from npstream.proto.defaults import GRPC_MAX_MESSAGE_BYTES
from npstream.proto.names import validate_stream_name
from npstream.proto.units import parse_duration_ms, parse_size, parse_timestamp_ms

__all__ = [
    "EARLIEST_SENTINEL",
    "LATEST_SENTINEL",
    "MAX_FETCH_MAX_BYTES",
    "OFFSETS_EXAMPLE",
    "TIMESTAMP_ACCEPTED",
    "Position",
    "parse_bool",
    "parse_broker",
    "parse_certificates",
    "parse_duration",
    "parse_ending_offsets",
    "parse_fetch_bytes",
    "parse_glob",
    "parse_non_empty",
    "parse_positive_int",
    "parse_private_key",
    "parse_starting_offsets",
    "parse_stream_list",
    "parse_timestamp",
    "parse_value_columns",
]

# Kafka's offset sentinels inside a JSON offsets option.
EARLIEST_SENTINEL = -2
LATEST_SENTINEL = -1

# Upper bound for fetchMaxBytes: the gRPC message limit the client configures
# must stay above one response.
MAX_FETCH_MAX_BYTES = GRPC_MAX_MESSAGE_BYTES


def parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    raise ValueError("not a boolean")


def parse_positive_int(text: str) -> int:
    stripped = text.strip()
    if not re.fullmatch(r"\+?\d+", stripped):
        raise ValueError("not an integer")
    number = int(stripped)
    if number <= 0:
        raise ValueError("must be greater than 0")
    return number


def parse_non_empty(text: str) -> str:
    if not text.strip():
        raise ValueError("must not be empty")
    return text.strip()


def parse_broker(text: str) -> str:
    """The address by the SDK's one rule (``resolve_address``): host:port or a gRPC target."""
    if not text.strip():
        raise ValueError("must not be empty")  # resolve_address would fall back to the default
    try:
        return resolve_address(text)
    except InvalidArgument as exc:
        raise ValueError(str(exc)) from None


def parse_stream_list(text: str) -> tuple[str, ...]:
    names = [part.strip() for part in text.split(",")]
    if any(not name for name in names):
        raise ValueError("contains an empty stream name")
    for name in names:
        validate_stream_name(name)
    return tuple(dict.fromkeys(names))


_GLOB = re.compile(r"[A-Za-z0-9._\-*?\[\]!]+")


def parse_glob(text: str) -> str:
    pattern = text.strip()
    if not _GLOB.fullmatch(pattern):
        raise ValueError("a glob may only use stream-name characters and * ? [ ] !")
    return pattern


def parse_value_columns(text: str) -> str:
    mode = text.strip().lower()
    if mode not in ("flatten", "struct"):
        raise ValueError("not a value layout")
    return mode


def parse_timestamp(text: str) -> int:
    millis = parse_timestamp_ms(text)
    if millis < 0:
        raise ValueError("must not be before 1970-01-01T00:00:00Z")
    return millis


def parse_duration(text: str) -> int:
    return parse_duration_ms(text)


def parse_fetch_bytes(text: str) -> int:
    size = parse_size(text)
    if not 0 < size <= MAX_FETCH_MAX_BYTES:
        raise ValueError(f"must be between 1 and {MAX_FETCH_MAX_BYTES} bytes (64MiB)")
    return size


def _read_pem(text: str) -> bytes:
    path = Path(text.strip()).expanduser()
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read the file: {exc.strerror or exc}") from None


def parse_certificates(text: str) -> bytes:
    data = _read_pem(text)
    if b"-----BEGIN CERTIFICATE-----" not in data:
        raise ValueError("the file holds no PEM certificate")
    return data


def parse_private_key(text: str) -> bytes:
    data = _read_pem(text)
    if b"-----BEGIN" not in data or b"PRIVATE KEY-----" not in data:
        raise ValueError("the file holds no PEM private key")
    return data


@dataclass(frozen=True)
class Position:
    """Where reading starts or ends: a keyword, per-stream offsets or a time.

    ``kind`` is earliest | latest | group | offsets | timestamp. ``offsets``
    maps stream names to offsets where -2 means earliest and -1 latest (Kafka's
    sentinels); streams not listed fall back to ``default_kind``.
    """

    kind: str
    offsets: Mapping[str, int] = field(default_factory=dict)
    timestamp_ms: int | None = None

    def for_stream(self, stream: str, default_kind: str) -> tuple[str, int | None]:
        """The (kind, offset) that applies to one stream."""
        if self.kind != "offsets":
            return self.kind, None
        if stream not in self.offsets:
            return default_kind, None
        value = self.offsets[stream]
        if value == EARLIEST_SENTINEL:
            return "earliest", None
        if value == LATEST_SENTINEL:
            return "latest", None
        return "offsets", value


OFFSETS_EXAMPLE = '{"orders": 42, "clicks": -2} (-2 = earliest, -1 = latest)'
TIMESTAMP_ACCEPTED = "ISO-8601 (2025-01-01T00:00:00Z) or epoch milliseconds"


def _parse_offsets_json(text: str) -> dict[str, int]:
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc})") from None
    if not isinstance(parsed, dict) or not parsed:
        raise ValueError("the JSON must be a non-empty object of stream name to offset")
    offsets: dict[str, int] = {}
    for stream, offset in parsed.items():
        validate_stream_name(stream)
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < EARLIEST_SENTINEL:
            raise ValueError(
                f"offset for stream '{stream}' is {json.dumps(offset)}; "
                "use an offset >= 0, -2 (earliest) or -1 (latest)"
            )
        offsets[stream] = offset
    return offsets


def parse_starting_offsets(text: str) -> Position:
    keyword = text.strip().lower()
    if keyword in ("earliest", "latest", "group"):
        return Position(keyword)
    if text.strip().startswith(("{", "[")):
        return Position("offsets", _parse_offsets_json(text))
    raise ValueError("not a keyword or a JSON object")


def parse_ending_offsets(text: str) -> Position:
    keyword = text.strip().lower()
    if keyword == "latest":
        return Position("latest")
    if text.strip().startswith(("{", "[")):
        offsets = _parse_offsets_json(text)
        for stream, offset in offsets.items():
            if offset == EARLIEST_SENTINEL:
                raise ValueError(f"ending offset -2 (earliest) for stream '{stream}' reads nothing")
        return Position("offsets", offsets)
    raise ValueError("not 'latest' or a JSON object")

