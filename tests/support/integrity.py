"""Checks that a broker's streams are whole: shared by the fuzz, disk-full, overload and soak tests.

Two independent looks, because either alone can miss damage:

* ``check_files(data_dir)`` walks every frame of every segment file of a
  stopped (or idle) broker with the same frame reader the broker trusts
  (structure and CRC32C of each frame), and checks that offsets are
  contiguous within and across segments.
* ``read_back(client, stream)`` reads a stream from its start to its end
  through the broker and checks that the offsets are exactly
  ``range(start, end)``; ``check_streams(client)`` does that for every
  stream and fails on any stream the broker reports as broken.
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa

from npstream.proto.frames.reader import BadFrame, FrameReader

__all__ = ["check_files", "check_streams", "read_back"]

_READ_SIZE = 4 << 20


def check_files(data_dir: Path) -> dict[str, tuple[int, int]]:
    """{stream: (first offset on disk, end offset)} of every stream directory; AssertionError
    naming the file and byte position on a bad frame or an offset gap."""
    found: dict[str, tuple[int, int]] = {}
    streams = Path(data_dir) / "streams"
    if not streams.is_dir():
        return found
    for directory in sorted(p for p in streams.iterdir() if p.is_dir()):
        segments = sorted(directory.glob("*.log"))
        first = end = -1
        for path in segments:
            base = int(path.stem)
            assert end < 0 or base == end, (
                f"{path}: segment starts at offset {base}, the previous one ended at {end}")
            expected = base
            with open(path, "rb") as handle:
                reader = FrameReader(handle.fileno(), 0, os.fstat(handle.fileno()).st_size,
                                     read_size=_READ_SIZE)
                while True:
                    try:
                        frame = reader.next_frame()
                    except BadFrame as exc:
                        raise AssertionError(f"{path}: bad frame: {exc}") from None
                    if frame is None:
                        break
                    _position, header, _payload = frame
                    assert header.base_offset == expected, (
                        f"{path}: frame at byte {_position} starts at offset "
                        f"{header.base_offset}, expected {expected}")
                    expected = header.next_offset
            first = base if first < 0 else first
            end = expected
        found[directory.name] = (first, end)
    return found


def read_back(client: object, stream: str) -> pa.Table:
    """Every retained message of ``stream`` (offsets checked to be start..end-1, no gap)."""
    info = client.stream_info(stream)  # type: ignore[attr-defined]
    assert not info.error, f"stream '{stream}' is broken: {info.error}"
    batches = list(client.read_range(  # type: ignore[attr-defined]
        stream, info.start_offset, info.end_offset))
    offsets = [o for batch in batches for o in batch.column("offset").to_pylist()]
    assert offsets == list(range(info.start_offset, info.end_offset)), (
        f"stream '{stream}': offsets read back are not {info.start_offset}.."
        f"{info.end_offset - 1} (got {len(offsets)} rows)")
    if not batches:
        return pa.table({"offset": pa.array([], pa.int64())})
    return pa.Table.from_batches(batches)


def check_streams(client: object) -> dict[str, int]:
    """read_back every stream the broker lists; {stream: messages read}."""
    counts = {}
    for info in client.list_streams():  # type: ignore[attr-defined]
        counts[info.name] = read_back(client, info.name).num_rows
    return counts
