"""The frame format: the documented header layout matches the code, and the CRC covers it all."""

from __future__ import annotations

import os
import re
import struct
from pathlib import Path

import pyarrow as pa
import pytest

from harness import REPO_ROOT
from npstream.broker.storage.batch_builder import (
    build_message_batch,
    complete_publish_table,
    generated_ids,
)
from npstream.proto.frames.payload import decode_payload
from npstream.proto.frames.reader import BadFrame, FrameReader
from npstream.proto.frames.record_batch import (
    FLAG_PRODUCER_IDS,
    FORMAT_VERSION,
    HEADER_SIZE,
    MAGIC,
    encode_frame,
    parse_header,
)

DOC = REPO_ROOT / "docs" / "format.md"
ROW = re.compile(r"^\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\w+)\s*\|", re.MULTILINE)


def documented_frame_header() -> list[tuple[int, int, str]]:
    section = DOC.read_text().split("## Segment files", 1)[1].split("## ", 1)[0]
    return [(int(o), int(s), name) for o, s, name in ROW.findall(section)]


def make_frame(values: list[bytes]) -> tuple[bytes, bytes]:
    table = complete_publish_table(pa.table({"value": pa.array(values, pa.binary())}))
    payload = build_message_batch(table, 1000, 1_700_000_000_123, b"0123456789abcdef").serialize()
    header, _ = encode_frame(payload, base_offset=1000, count=len(values),
                             min_timestamp=1_700_000_000_123, max_timestamp=1_700_000_000_456,
                             flags=FLAG_PRODUCER_IDS)
    return header, payload.to_pybytes()


def test_header_documented_layout_matches_code():
    fields = documented_frame_header()
    assert [name for _, _, name in fields] == [
        "magic", "version", "flags", "reserved", "payload_length", "crc32c", "base_offset",
        "count", "schema_version", "min_timestamp", "max_timestamp",
    ]
    position = 0
    for offset, size, name in fields:
        assert offset == position, f"{name} documented at {offset}, expected {position}"
        position += size
    assert position == HEADER_SIZE == 48
    assert MAGIC == b"NPSB" and "`NPSB`" in DOC.read_text()

    header, payload = make_frame([b"a", b"bb", b"ccc"])
    assert len(header) == HEADER_SIZE
    layout = {name: (offset, size) for offset, size, name in fields}
    formats = {1: "<B", 2: "<H", 4: "<I", 8: "<q"}

    def field(name: str) -> int | bytes:
        offset, size = layout[name]
        if name == "magic":
            return header[offset : offset + size]
        return struct.unpack_from(formats[size], header, offset)[0]

    assert field("magic") == MAGIC
    assert field("version") == FORMAT_VERSION == 1
    assert field("flags") == FLAG_PRODUCER_IDS
    assert field("reserved") == 0 and field("schema_version") == 0  # an untyped frame
    assert field("payload_length") == len(payload) and len(payload) % 8 == 0
    assert field("base_offset") == 1000
    assert field("count") == 3
    assert field("min_timestamp") == 1_700_000_000_123
    assert field("max_timestamp") == 1_700_000_000_456
    parsed = parse_header(header)
    assert (parsed.base_offset, parsed.count, parsed.payload_length) == (1000, 3, len(payload))


def read_one(frame: bytes, tmp_path: Path) -> None:
    path = tmp_path / "frame.log"
    path.write_bytes(frame)
    fd = os.open(path, os.O_RDONLY)
    try:
        FrameReader(fd, 0, len(frame), read_size=1 << 16).next_frame()
    finally:
        os.close(fd)


def test_read_frame_any_byte_flipped_fails_check(tmp_path: Path):
    header, payload = make_frame([b"x" * 10])
    frame = header + payload
    read_one(frame, tmp_path)  # intact: passes
    for position in range(len(frame)):
        damaged = bytearray(frame)
        damaged[position] ^= 0x5A
        with pytest.raises(BadFrame) as failure:
            read_one(bytes(damaged), tmp_path)
        assert failure.value.position == 0
        if 12 <= position < 16 or position >= HEADER_SIZE:  # CRC field, payload
            assert failure.value.crc_mismatch, (position, failure.value.detail)


def test_payload_decodes_with_message_schema():
    _, payload = make_frame([b"a", b"bb"])
    batch = decode_payload(payload)
    assert batch.column("offset").to_pylist() == [1000, 1001]
    assert batch.column("value").to_pylist() == [b"a", b"bb"]
    assert batch.column("id").to_pylist() == [
        "0123456789abcdef00000000000003e8", "0123456789abcdef00000000000003e9"]


@pytest.mark.parametrize(("first", "count"), [
    (0, 5), (65_530, 20), (3 * 65_536 - 1, 2), (2**40 - 7, 140_000), (2**63 - 4, 4), (9, 0)])
def test_generated_ids_are_the_prefix_and_the_offset_in_16_hex_digits(first, count):
    # Runs of the upper 48 bits end at multiples of 65,536: every boundary case above.
    prefix = b"0123456789abcdef"
    ids = generated_ids(prefix, first, count)
    expected = [(prefix + b"%016x" % offset).decode() for offset in range(first, first + count)]
    assert ids.to_pylist() == expected
    with pytest.raises(ValueError, match="id prefix must be 16 characters"):
        generated_ids(b"short", first, count)
