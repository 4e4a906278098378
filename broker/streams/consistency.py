"""At start, the registry (SQLite's ``streams`` rows) checked against the data dir, out loud.

The registry and the stream directories are two records of the same streams,
and either can be damaged or replaced on its own: a metadata database
deleted (a new empty one is made) or restored from an older copy, a WAL whose
damage makes SQLite drop the transactions in it, a stream directory copied in
by hand, a segment file removed. Each leaves streams that change their start
or end, or disappear, while their files stay on disk. Nothing here repairs
anything (the operator knows which side is right); every mismatch is one
ERROR line naming the stream and the paths, and the counts are the
``npstream_data_dir_mismatches`` gauge:

- ``metadata``: the database file was missing while stream directories
  exist, or its WAL is damaged (a bad header, or a damaged frame followed by
  valid ones among its first MAX_WAL_FRAMES_CHECKED: SQLite stops reading at
  the first bad frame); an unreadable database stops the start (process.py);
- ``orphaned_directory``: a stream directory with no ``streams`` row (such a
  stream is not served, its files stay);
- ``missing_directory``: a stream whose row records an end offset
  (streams/end_floors.py) and whose directory is gone; opening it refuses it
  (repair restarts it empty at that offset, never reusing one);
- ``short_log``: a stream whose segment files hold less than its records say
  (storage/extent_check.py: a first or last segment file missing, a last
  segment cut). Opening it refuses it (the stream needs repair, and describe
  and list say so), so no shorter log is ever served; this says so at start.

The walk reads one directory listing, then two small files and a stat per
stream directory, in a thread of its own so that the broker serves at once
however many streams there are.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge

from npstream.broker.errors import CorruptRecordError
from npstream.broker.metadata import METADATA_FILE
from npstream.broker.storage.extent_check import read_records, shortfall
from npstream.broker.storage.files import list_segment_bases, streams_root
from npstream.broker.storage.stream_files import read_start_offset
from npstream.broker.streams.tuning import MAX_LINES_PER_KIND, MAX_WAL_FRAMES_CHECKED
from npstream.proto.names import STREAM_NAME_RE

__all__ = ["DataDirReport", "MetadataFiles", "check_data_dir", "inspect_metadata_files",
           "start_data_dir_check"]

log = logging.getLogger(__name__)

# SQLite's WAL layout (https://www.sqlite.org/fileformat.html#the_write_ahead_log).
_WAL_MAGICS = (0x377F0682, 0x377F0683)  # bit 0: checksums over big-endian words
_WAL_HEADER = 32
_WAL_FRAME_HEADER = 24


@dataclass(frozen=True)
class MetadataFiles:
    """The metadata database's files as found before the broker opened (and so changed) them."""

    database_existed: bool
    wal_problem: str  # "" when the WAL is absent, empty or whole


@dataclass
class DataDirReport:
    """What did not match; every entry was also logged at ERROR."""

    metadata: list[str] = field(default_factory=list)
    orphaned_directories: list[str] = field(default_factory=list)
    short_logs: list[str] = field(default_factory=list)
    missing_directories: list[str] = field(default_factory=list)
    directories: int = 0

    def counts(self) -> dict[str, int]:
        return {"metadata": len(self.metadata),
                "orphaned_directory": len(self.orphaned_directories),
                "missing_directory": len(self.missing_directories),
                "short_log": len(self.short_logs)}


def _wal_checksum(data: bytes, big_endian: bool, s0: int = 0, s1: int = 0) -> tuple[int, int]:
    """SQLite's WAL checksum of ``data`` (a multiple of 8 bytes), continuing from (s0, s1)."""
    words = struct.unpack(f"{'>' if big_endian else '<'}{len(data) // 4}I", data)
    for index in range(0, len(words), 2):
        s0 = (s0 + words[index] + s1) & 0xFFFFFFFF
        s1 = (s1 + words[index + 1] + s0) & 0xFFFFFFFF
    return s0, s1


def wal_problem(path: Path) -> str:
    """Why SQLite would drop committed transactions of the WAL at ``path`` ("" if none)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return ""
    if not data:
        return ""
    if len(data) < _WAL_HEADER:
        return f"{len(data)} bytes, less than a WAL header"
    magic, _version, page_size, _seq, salt1, salt2, c0, c1 = struct.unpack(">8I", data[:32])
    big = bool(magic & 1)
    if magic not in _WAL_MAGICS or _wal_checksum(data[:24], big) != (c0, c1):
        return "damaged header: SQLite ignores every transaction in it"
    frame_size = _WAL_FRAME_HEADER + page_size
    previous = (c0, c1)
    bad_at = -1
    last = min(len(data) - frame_size, _WAL_HEADER + (MAX_WAL_FRAMES_CHECKED - 1) * frame_size)
    for position in range(_WAL_HEADER, last + 1, frame_size):
        header = data[position:position + _WAL_FRAME_HEADER]
        _page, _commit, f_salt1, f_salt2, f0, f1 = struct.unpack(">6I", header)
        if (f_salt1, f_salt2) != (salt1, salt2):
            break  # frames of an earlier generation: not part of this WAL's history
        page = data[position + _WAL_FRAME_HEADER:position + frame_size]
        valid = _wal_checksum(header[:8] + page, big, *previous) == (f0, f1)
        if not valid and bad_at < 0:
            bad_at = position
        elif valid and bad_at >= 0:
            return (f"damaged frame at byte {bad_at} followed by a valid frame at byte "
                    f"{position}: SQLite drops every transaction from the damaged one on")
        previous = (f0, f1)
    return ""


def inspect_metadata_files(data_dir: Path) -> MetadataFiles:
    """Look at the database and its WAL before Metadata opens them (opening changes both)."""
    database = data_dir / METADATA_FILE
    return MetadataFiles(database.exists(), wal_problem(Path(f"{database}-wal")))


def _short_log(directory: Path) -> str:
    """What the stream's files fall short of its records by ("" if nothing shows)."""
    try:
        pointer = read_start_offset(directory) or 0
    except CorruptRecordError as exc:
        return str(exc)
    return shortfall(directory, list_segment_bases(directory), pointer,
                     read_records(directory, directory.name, warn=False)[2])


def _report(kind: str, entries: list[str], line: str, *args: object) -> None:
    """One ERROR line per mismatch, up to MAX_LINES_PER_KIND of a kind."""
    entries.append(str(args[0]))
    if len(entries) <= MAX_LINES_PER_KIND:
        log.error(line, *args)
    elif len(entries) == MAX_LINES_PER_KIND + 1:
        log.error("data dir check: more %s mismatches than %d; the rest are only counted",
                  kind, MAX_LINES_PER_KIND)


def check_data_dir(data_dir: Path, before: MetadataFiles, has_row: Callable[[str], bool],
                   stopping: threading.Event | None = None,
                   end_floors: Callable[[], Iterable[tuple[str, int]]] = tuple,
                   ) -> DataDirReport:
    """Cross-check the registry's rows against the stream directories (module docstring).

    ``end_floors``: (name, recorded end offset) of the streams that have one.
    """
    report = DataDirReport()
    root = streams_root(data_dir)
    database = data_dir / METADATA_FILE
    if before.wal_problem:
        _report("metadata", report.metadata,
                "metadata WAL %s: %s; streams created, deleted or changed since its last "
                "checkpoint may be missing from the registry", Path(f"{database}-wal"),
                before.wal_problem)
    try:
        entries = sorted((entry.name, entry.is_dir()) for entry in os.scandir(root))
    except FileNotFoundError:
        entries = []
    names = [name for name, is_dir in entries if is_dir and STREAM_NAME_RE.fullmatch(name)]
    report.directories = len(names)
    if not before.database_existed and names:
        _report("metadata", report.metadata,
                "metadata database %s was missing (an empty one was made) while %d stream "
                "directories exist under %s: those streams are not served until it is "
                "restored", database, len(names), root)
    for name in names:
        if stopping is not None and stopping.is_set():
            break
        directory = root / name
        if not has_row(name):
            _report("orphaned_directory", report.orphaned_directories,
                    "stream '%s': directory %s has no row in the metadata database %s; the "
                    "stream is not served and its files are kept", name, directory, database)
            continue
        problem = _short_log(directory)
        if problem:
            _report("short_log", report.short_logs,
                    "stream '%s': its files in %s hold less than recorded, it is refused until "
                    "repaired: %s", name, directory, problem)
    present = set(names)
    for name, floor in end_floors():
        if stopping is not None and stopping.is_set():
            break
        if name not in present:
            _report("missing_directory", report.missing_directories,
                    "stream '%s': its directory %s is missing while the metadata database %s "
                    "records offsets up to %d; it is refused until repaired (repair restarts "
                    "it empty at offset %d)", name, root / name, database, floor, floor)
    return report


def start_data_dir_check(data_dir: Path, before: MetadataFiles, has_row: Callable[[str], bool],
                         registry: CollectorRegistry, stopping: threading.Event,
                         end_floors: Callable[[], Iterable[tuple[str, int]]] = tuple,
                         ) -> threading.Thread:
    """Run check_data_dir in a thread; its counts become the mismatches gauge."""
    gauge = Gauge("npstream_data_dir_mismatches",
                  "Mismatches between the metadata and the data dir found at start, by kind",
                  ["kind"], registry=registry)

    def run() -> None:
        try:
            report = check_data_dir(data_dir, before, has_row, stopping, end_floors)
        except Exception:
            log.exception("data dir check failed")
            return
        for kind, count in report.counts().items():
            gauge.labels(kind).set(count)
        level = logging.ERROR if any(report.counts().values()) else logging.INFO
        log.log(level, "data dir check: %d stream directories; mismatches: %s", report.directories,
                ", ".join(f"{kind} {count}" for kind, count in report.counts().items()))

    thread = threading.Thread(target=run, name="data-dir-check", daemon=True)
    thread.start()
    return thread
