"""CRC32C combined and patched from pieces equals the CRC of the whole (what stamping relies on)."""

from __future__ import annotations

import random

import crc32c
import pytest

from npstream.proto.frames import crc_patch
from npstream.proto.frames.record_batch import (
    FrameHeader,
    encode_frame,
    encode_header_for_crc,
)


@pytest.mark.parametrize("first, second", [(0, 0), (1, 0), (0, 1), (7, 9), (4096, 100_003)])
def test_combine_equals_the_crc_of_the_concatenation(first: int, second: int):
    rng = random.Random(first * 31 + second)
    a, b = rng.randbytes(first), rng.randbytes(second)
    assert crc_patch.combine(crc32c.crc32c(a), crc32c.crc32c(b), len(b)) == crc32c.crc32c(a + b)


def test_patching_ranges_equals_the_crc_of_the_changed_data():
    rng = random.Random(5)
    data = bytearray(rng.randbytes(200_000))
    crc = crc32c.crc32c(data)
    for position, length in [(0, 8), (1000, 8 * 4000), (199_992, 8), (0, 200_000), (500, 0)]:
        new = rng.randbytes(length)
        crc = crc_patch.patch(crc, len(data), position, bytes(data[position:position + length]),
                              new)
        data[position:position + length] = new
        assert crc == crc32c.crc32c(data)


def test_patch_refuses_ranges_that_do_not_fit():
    with pytest.raises(ValueError, match="cannot patch 8 -> 4 bytes"):
        crc_patch.patch(0, 100, 0, bytes(8), bytes(4))
    with pytest.raises(ValueError, match="at 96 of 100"):
        crc_patch.patch(0, 100, 96, bytes(8), bytes(8))


def test_header_from_a_payload_crc_equals_the_header_of_the_payload():
    payload = random.Random(3).randbytes(4096)
    expected = encode_frame(payload, base_offset=1234, count=17, min_timestamp=5,
                            max_timestamp=9, flags=1)
    assert encode_header_for_crc(FrameHeader(1, len(payload), crc32c.crc32c(payload), 1234,
                                             17, 5, 9)) == expected
