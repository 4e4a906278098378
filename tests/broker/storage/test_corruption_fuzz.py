"""Corruption fuzzer: every frame header byte and every record byte flipped, every frame
boundary cut; the log reads every acknowledged message or is refused, never fewer (issue 34).

A log of a few segments is written and stopped. Then, one damage at a time
on a fresh copy of its files: each byte of each frame header (all segments)
is inverted, each byte of the clean-shutdown marker and of log-extent (its
JSON, not all of its padding) is inverted, and each segment is cut at each
of its frame boundaries. The storage is then opened in-process (what a
broker restart does) and the whole log read. Allowed outcomes:
CorruptRecordError naming a file of the stream (on open or on the read), or
every message back with the same offsets and values. Modification times are
kept, so a closed segment's seal still matches (bit rot): such damage shows
on the read, not on the open.

Two starting states: ``stopped`` (a clean stop: the marker is there) and
``crashed`` (the broker opened the log again and was killed: log-extent is
there, no marker).

Size: ``NPSTREAM_CORRUPTION_FRAMES`` frames (default 6: ~450 damages per
state, 1.5-6 s each on a loaded 2-core machine); e.g. 200 for a long run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from npstream.broker.errors import CorruptRecordError
from npstream.broker.storage import Storage, StorageSettings
from npstream.proto.frames.record_batch import HEADER_SIZE

FRAMES = int(os.environ.get("NPSTREAM_CORRUPTION_FRAMES", "6"))
SEGMENT_BYTES = 1500  # ~3 frames a segment: closed segments, sealed indexes and a tail
NAME = "fuzzed"


def build(data_dir: Path, config, table_of, clock, state: str) -> list[bytes]:
    """Write FRAMES appends and stop; returns the values of offsets 0, 1, ..."""
    storage = Storage(StorageSettings(data_dir=data_dir, segment_bytes=SEGMENT_BYTES), clock)
    log = storage.open_log(NAME, config)
    values: list[bytes] = []
    for index in range(FRAMES):
        batch = [f"value-{len(values) + i}".encode() * 4 for i in range(index % 3 + 1)]
        log.append(table_of(batch))
        values += batch
    storage.close()
    if state == "crashed":
        reopened = Storage(StorageSettings(data_dir=data_dir, segment_bytes=SEGMENT_BYTES), clock)
        reopened.open_log(NAME, config)  # records log-extent, removes the marker
        assert not (data_dir / "streams" / NAME / "clean-shutdown").exists()
        # never closed: as after kill -9
    return values


class Snapshot:
    """The stream directory's files (bytes and times), put back before each damage."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.files = {path.name: (path.read_bytes(), path.stat().st_atime_ns,
                                  path.stat().st_mtime_ns) for path in directory.iterdir()}
        self.damaged = ""

    def restore(self) -> None:
        """Rewrite the damaged file and those that changed (size or time), remove new ones."""
        present = {entry.name: entry.stat() for entry in os.scandir(self.directory)}
        for name in present.keys() - self.files.keys():
            os.unlink(self.directory / name)
        for name, (data, atime, mtime) in self.files.items():
            stat = present.get(name)
            if (name == self.damaged or stat is None
                    or (stat.st_size, stat.st_mtime_ns) != (len(data), mtime)):
                path = self.directory / name
                path.write_bytes(data)
                os.utime(path, ns=(atime, mtime))

    def damage(self, name: str, data: bytes) -> None:
        """Replace one file's content, keeping its times (what bit rot does)."""
        self.damaged = name
        _old, atime, mtime = self.files[name]
        path = self.directory / name
        path.write_bytes(data)
        os.utime(path, ns=(atime, mtime))


def frame_starts(data: bytes) -> list[int]:
    """Byte positions of the frames of an intact segment file."""
    starts, position = [], 0
    while position < len(data):
        starts.append(position)
        length = int.from_bytes(data[position + 8:position + 12], "little")
        position += HEADER_SIZE + length
    return starts


def damages(snapshot: Snapshot) -> Iterator[tuple[str, str, bytes]]:
    """(description, file name, damaged content) of every damage the module docstring lists."""
    for name, (data, _atime, _mtime) in sorted(snapshot.files.items()):
        if name.endswith(".log"):
            starts = frame_starts(data)
            for start in starts:
                for byte in range(start, start + HEADER_SIZE):
                    flipped = bytearray(data)
                    flipped[byte] ^= 0xFF
                    yield f"{name}: byte {byte} inverted", name, bytes(flipped)
            for start in starts:
                yield f"{name}: cut at byte {start}", name, data[:start]
        elif name in ("clean-shutdown", "log-extent"):
            # log-extent is padded with spaces: its JSON and the first byte after it
            for byte in range(min(len(data), len(data.rstrip()) + 1)):
                flipped = bytearray(data)
                flipped[byte] ^= 0xFF
                yield f"{name}: byte {byte} inverted", name, bytes(flipped)


@pytest.mark.parametrize("state", ["stopped", "crashed"])
def test_open_after_any_one_damage_reads_every_message_or_refuses(
        data_dir, config, table_of, clock, state):
    values = build(data_dir, config, table_of, clock, state)
    directory = data_dir / "streams" / NAME
    snapshot = Snapshot(directory)
    assert sum(name.endswith(".log") for name in snapshot.files) >= 3
    outcomes = {"read": 0, "refused": 0}
    for description, name, content in damages(snapshot):
        snapshot.restore()
        snapshot.damage(name, content)
        storage = Storage(StorageSettings(data_dir=data_dir, segment_bytes=SEGMENT_BYTES), clock)
        try:
            log = storage.open_log(NAME, config)
            table = log.read_table(0, log.end_offset)
            assert (log.start_offset, log.end_offset) == (0, len(values)), description
            assert table.column("offset").to_pylist() == list(range(len(values))), description
            assert table.column("value").to_pylist() == values, description
            outcomes["read"] += 1
        except CorruptRecordError as error:
            assert str(error.path).startswith(str(directory)), (description, error)
            assert f"corrupt record in {error.path} at byte {error.position}" in str(error)
            outcomes["refused"] += 1
        finally:
            storage.close()
    frames_headers = FRAMES * HEADER_SIZE
    assert sum(outcomes.values()) > frames_headers
    assert outcomes["refused"] > 0 and outcomes["read"] > 0, outcomes
