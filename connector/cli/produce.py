"""``npstream produce STREAM [FILE]``: JSON lines (or raw lines) into a stream, in batches.

Into a typed stream (docs/typed-streams.md) every batch is checked against the
stream's value schema before it is sent (``value_struct``, column-wise): a line
that does not fit stops the command naming the line, the field and the
expected type, and nothing of its batch is sent.
"""

from __future__ import annotations

import argparse
import enum
import json
import logging
import os
import queue
import stat
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any, Final

import pyarrow as pa

from npstream.cli.common import (
    EXIT_USAGE,
    CliError,
    add_client_options,
    client_from_args,
    positive_count_arg,
    seconds_arg,
    stream_arg,
)
from npstream.client.client import Client
from npstream.errors import NpstreamError, PermissionDenied, StreamNotFound
from npstream.proto.value_schema import ValueMismatchError, value_struct

__all__ = ["register"]

log = logging.getLogger(__name__)

# ---------------------------------------------------------------- tuning
# Lines per publish_batch call (each call is then split into ~4 MiB requests).
DEFAULT_BATCH_SIZE = 1000
# Also send once this many bytes are pending, whatever the line count.
BATCH_MAX_BYTES = 4 * 1024 * 1024
# When reading a pipe, send what has been read after this long without input,
# so `tail -f log | npstream produce s` does not hold lines back.
DEFAULT_LINGER_S = 0.2
# How often the progress line on a terminal is redrawn.
PROGRESS_INTERVAL_S = 0.25


class _Pause(enum.Enum):
    """The marker type of _FLUSH (an enum member, so ``item is _FLUSH`` narrows types)."""

    FLUSH = enum.auto()


_FLUSH: Final = _Pause.FLUSH  # marker from the pipe reader: input paused, send what is pending


def register(subparsers: Any) -> None:
    produce = subparsers.add_parser(
        "produce",
        help="publish JSON lines (or raw lines) from a file or stdin",
        description="Publish one message per input line. Each line must be a JSON document "
        "(sent as its bytes) unless --raw is given. Blank lines are skipped in JSON mode.",
    )
    produce.add_argument("stream", type=stream_arg)
    produce.add_argument("file", nargs="?", default="-",
                         help="input file; '-' or absent reads stdin")
    produce.add_argument("--raw", action="store_true",
                         help="send each line as is (UTF-8 bytes, newline removed), no JSON check")
    produce.add_argument("--id-field", metavar="FIELD",
                         help="take each message's id from this top-level JSON field "
                              "(required in every line; makes resends safe with a dedup window)")
    produce.add_argument("--key-field", metavar="FIELD",
                         help="take each message's key from this top-level JSON field "
                              "(absent or null: no key)")
    produce.add_argument("--ack", choices=["fsync", "write"], default="fsync",
                         help="wait for fsync (default) or only for the write")
    produce.add_argument("--batch-size", type=positive_count_arg, default=DEFAULT_BATCH_SIZE,
                         metavar="N", help=f"lines per batch (default: {DEFAULT_BATCH_SIZE})")
    produce.add_argument("--linger", type=seconds_arg, default=DEFAULT_LINGER_S, metavar="SECONDS",
                         help="when reading a pipe, send pending lines after this long without "
                              f"input (default: {DEFAULT_LINGER_S})")
    produce.add_argument("--json", action="store_true", help="print the summary as JSON")
    add_client_options(produce)
    produce.set_defaults(handler=run)


@dataclass
class _Totals:
    count: int = 0
    duplicates: int = 0
    first_offset: int = -1
    last_offset: int = -1

    def add(self, offsets: list[int], duplicates: int) -> None:
        if offsets:
            low, high = min(offsets), max(offsets)
            self.first_offset = low if self.first_offset < 0 else min(self.first_offset, low)
            self.last_offset = max(self.last_offset, high)
        self.count += len(offsets)
        self.duplicates += duplicates


@dataclass
class _Pending:
    values: list[bytes] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    keys: list[bytes | None] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)  # input line number of each value
    nbytes: int = 0
    first_line: int = 0

    def table(self, with_ids: bool, with_keys: bool) -> pa.Table:
        columns: dict[str, pa.Array] = {"value": pa.array(self.values, pa.binary())}
        if with_ids:
            columns["id"] = pa.array(self.ids, pa.string())
        if with_keys:
            columns["key"] = pa.array(self.keys, pa.binary())
        return pa.table(columns)


class _Progress:
    """A one-line counter on stderr, drawn only when stderr is a terminal."""

    def __init__(self) -> None:
        self.enabled = sys.stderr.isatty()
        self.started = time.monotonic()
        self.drawn = 0.0

    def update(self, count: int) -> None:
        now = time.monotonic()
        if not self.enabled or now - self.drawn < PROGRESS_INTERVAL_S:
            return
        self.drawn = now
        rate = count / max(now - self.started, 1e-9)
        sys.stderr.write(f"\r{count} messages sent ({rate:,.0f}/s)")
        sys.stderr.flush()

    def clear(self) -> None:
        if self.enabled and self.drawn:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


def _is_regular_file(handle: IO[bytes]) -> bool:
    try:
        return stat.S_ISREG(os.fstat(handle.fileno()).st_mode)
    except (OSError, ValueError):
        return True  # no descriptor (e.g. in-memory): nothing to wait for


def _lines_with_pauses(handle: IO[bytes], linger: float) -> Iterator[bytes | _Pause]:
    """Lines of a pipe, with _FLUSH whenever no line came for ``linger`` seconds."""
    lines: queue.Queue[bytes | None] = queue.Queue(maxsize=10_000)

    def pump() -> None:
        for line in handle:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, name="npstream-produce-reader", daemon=True).start()
    while True:
        try:
            line = lines.get(timeout=linger) if linger > 0 else lines.get()
        except queue.Empty:
            yield _FLUSH
            line = lines.get()
        if line is None:
            return
        yield line


def _field(document: object, name: str, line_no: int, source: str) -> object:
    if not isinstance(document, dict):
        raise CliError(f"line {line_no} of {source}: field '{name}' requested but the line is "
                       f"a JSON {type(document).__name__}, not an object")
    return document.get(name)


def _as_text(value: object, name: str, line_no: int, source: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise CliError(f"line {line_no} of {source}: field '{name}' must be a string or an integer, "
                   f"got {json.dumps(value)}")


def _typed_value(document: object, value: bytes, args: argparse.Namespace,
                 schema: pa.Schema) -> bytes:
    """A typed stream's value: the line, less the --id-field/--key-field fields the
    schema does not have (they are the message's id and key, not value fields)."""
    taken = [name for name in (args.id_field, args.key_field)
             if name and name not in schema.names]
    if not isinstance(document, dict) or not any(name in document for name in taken):
        return value
    kept = {name: item for name, item in document.items() if name not in taken}
    return json.dumps(kept, ensure_ascii=False, separators=(",", ":")).encode()


def _value_schema(client: Client, stream: str) -> pa.Schema | None:
    """The stream's value schema; None when it is untyped, does not exist yet, or is unknown.

    Describing a stream needs the read right, publishing only write: a
    write-only token (docs/security.md's producer) produces without the
    local schema check, and the broker checks every value instead.
    """
    try:
        return client.stream_info(stream).value_schema
    except StreamNotFound:
        return None  # created untyped on first publish (when the broker allows it)
    except PermissionDenied:
        log.info("no read right on stream '%s': lines go unchecked to the broker, which "
                 "checks them against the stream's schema if it is typed", stream)
        return None


class _Producer:
    def __init__(self, client: Client, args: argparse.Namespace, source: str,
                 value_schema: pa.Schema | None = None) -> None:
        self.client = client
        self.args = args
        self.source = source
        self.value_schema = value_schema
        self.totals = _Totals()
        self.pending = _Pending()
        self.progress = _Progress()

    def add(self, line: bytes, line_no: int) -> None:
        args = self.args
        if args.raw:
            value = line.rstrip(b"\r\n") if line.endswith(b"\n") else line
            message_id, key = None, None
        else:
            value = line.strip()
            if not value:
                return
            try:
                document = json.loads(value)
            except ValueError as exc:
                raise CliError(f"line {line_no} of {self.source}: invalid JSON ({exc})") from None
            message_id = key = None
            if args.id_field:
                raw_id = _field(document, args.id_field, line_no, self.source)
                if raw_id is None:
                    raise CliError(f"line {line_no} of {self.source}: no field "
                                   f"'{args.id_field}' for the message id")
                message_id = _as_text(raw_id, args.id_field, line_no, self.source)
            if args.key_field:
                raw_key = _field(document, args.key_field, line_no, self.source)
                if raw_key is not None:
                    key = _as_text(raw_key, args.key_field, line_no, self.source).encode()
            if self.value_schema is not None:
                value = _typed_value(document, value, args, self.value_schema)
        pending = self.pending
        if not pending.values:
            pending.first_line = line_no
        pending.values.append(value)
        pending.lines.append(line_no)
        if message_id is not None:
            pending.ids.append(message_id)
        pending.keys.append(key)
        pending.nbytes += len(value)
        if len(pending.values) >= args.batch_size or pending.nbytes >= BATCH_MAX_BYTES:
            self.flush(line_no)

    def flush(self, last_line: int) -> None:
        pending = self.pending
        if not pending.values:
            return
        if self.value_schema is not None:
            self._check_values(pending)
        table = pending.table(bool(self.args.id_field), bool(self.args.key_field))
        try:
            result = self.client.publish_batch(self.args.stream, table, ack=self.args.ack)
        except NpstreamError as exc:
            exc.add_note(f"lines {pending.first_line}..{last_line} of {self.source} were not "
                         f"all produced; {self.totals.count} message(s) before them were")
            raise
        self.totals.add(result.offsets, len(result.duplicates))
        self.pending = _Pending()
        self.progress.update(self.totals.count)

    def _check_values(self, pending: _Pending) -> None:
        """CliError naming the first line of the batch that does not fit the schema.

        The batch is dropped first: nothing of it is sent, not even by the
        flush that follows a bad line.
        """
        assert self.value_schema is not None
        try:
            value_struct(pa.array(pending.values, pa.binary()), self.value_schema)
        except ValueMismatchError as exc:
            self.pending = _Pending()
            where = f"field '{exc.field}'" if exc.field else "the value"
            raise CliError(
                f"line {pending.lines[exc.index]} of {self.source}: {where} {exc.problem}; "
                f"expected {exc.expected} (stream '{self.args.stream}' is typed); nothing of "
                f"lines {pending.first_line}..{pending.lines[-1]} was produced; "
                f"{self.totals.count} message(s) before them were"
            ) from None

    def summary(self) -> str:
        t = self.totals
        if self.args.json:
            return json.dumps({
                "stream": self.args.stream, "count": t.count, "stored": t.count - t.duplicates,
                "duplicates": t.duplicates, "first_offset": t.first_offset,
                "last_offset": t.last_offset,
            })
        if not t.count:
            return f"produced 0 message(s) to '{self.args.stream}'"
        return (f"produced {t.count} message(s) to '{self.args.stream}': first offset "
                f"{t.first_offset}, last offset {t.last_offset}, {t.duplicates} duplicate(s)")


def _open(path: str) -> tuple[IO[bytes], str]:
    if path == "-":
        return sys.stdin.buffer, "stdin"
    try:
        return open(path, "rb"), path
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}", EXIT_USAGE) from None


def run(args: argparse.Namespace) -> int:
    if args.raw and (args.id_field or args.key_field):
        raise CliError("--id-field and --key-field need JSON input; drop --raw", EXIT_USAGE)
    handle, source = _open(args.file)
    lines: Iterator[bytes | _Pause] = (
        iter(handle) if _is_regular_file(handle) else _lines_with_pauses(handle, args.linger)
    )
    line_no = 0
    with client_from_args(args) as client:
        value_schema = _value_schema(client, args.stream)
        if value_schema is not None and args.raw:
            raise CliError(f"stream '{args.stream}' is typed: its values are records of its "
                           "schema, given as JSON lines; drop --raw", EXIT_USAGE)
        producer = _Producer(client, args, source, value_schema)
        try:
            for item in lines:
                if item is _FLUSH:
                    producer.flush(line_no)
                    continue
                line_no += 1
                try:
                    producer.add(item, line_no)
                except CliError:
                    producer.flush(line_no - 1)  # every line before the bad one goes in
                    raise
            producer.flush(line_no)
        finally:
            producer.progress.clear()
            print(producer.summary(), flush=True)
            if handle is not sys.stdin.buffer:
                handle.close()
    return 0
