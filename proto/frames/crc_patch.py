"""CRC32C of data whose few ranges change, computed without reading the rest of the data.

A staged file becomes a segment by having its offset and timestamp columns
overwritten (staged_segment.py); its frames' CRCs must then cover the new
bytes. Reading each payload back just to checksum it again made a commit read
every staged byte, and a staging written around the page cache (direct_write.py)
would have to come back from the disk for it. CRCs are linear over GF(2), so
the staging's CRC of the placeholder payload plus the CRCs of the old and new
bytes of each changed range give the CRC of the stamped payload:

    crc(P') = crc(P) ^ shift(crc(new) ^ crc(old), bytes after the range)

where shift(c, n) is c times x^(8n) modulo the CRC polynomial: what n zero
bytes appended do to a CRC register. The same operation combines the CRCs of
two pieces (zlib's crc32_combine; the ``crc32c`` package offers no combine).
"""

from __future__ import annotations

import functools

import crc32c

__all__ = ["combine", "patch", "shift"]

_POLY = 0x82F63B78  # Castagnoli, reflected
_TOP = 1 << 31  # x^0 in the reflected representation


def _multiply(a: int, b: int) -> int:
    """a * b modulo the polynomial (reflected bit order, as zlib's multmodp)."""
    product = 0
    bit = _TOP
    while True:
        if a & bit:
            product ^= b
            if not a & (bit - 1):
                return product
        bit >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1


def _powers() -> list[int]:
    """x^(2^k) modulo the polynomial for k = 0..63."""
    table = [_TOP >> 1]  # x^1
    for _ in range(63):
        table.append(_multiply(table[-1], table[-1]))
    return table


_X_2_POW = _powers()


def shift(crc: int, length: int) -> int:
    """``crc`` times x^(8 * length): the register after ``length`` zero bytes (no xor-out)."""
    return _multiply(_power(length), crc)


@functools.lru_cache(maxsize=4096)
def _power(length: int) -> int:
    """x^(8 * length) modulo the polynomial; stamped files of one micro-batch share lengths."""
    power = _TOP
    k = 3  # 8 * length = length << 3
    while length:
        if length & 1:
            power = _multiply(_X_2_POW[k], power)
        length >>= 1
        k += 1
    return power


def combine(crc1: int, crc2: int, length2: int) -> int:
    """CRC32C of A + B from crc(A), crc(B) and len(B)."""
    return shift(crc1, length2) ^ crc2


def patch(crc: int, length: int, position: int, old: object, new: object) -> int:
    """CRC32C of ``length`` bytes once ``old`` at ``position`` is replaced by ``new``.

    ``old`` and ``new`` are buffers of the same size; ``crc`` is the CRC before.
    """
    # Any buffer; callers pass numpy arrays, whose stubs declare the buffer protocol
    # (ndarray.__buffer__) only for Python >= 3.12.
    old_view = memoryview(old).cast("B")  # type: ignore[arg-type]
    new_view = memoryview(new).cast("B")  # type: ignore[arg-type]
    if len(old_view) != len(new_view) or position + len(new_view) > length:
        raise ValueError(f"cannot patch {len(old_view)} -> {len(new_view)} bytes at "
                         f"{position} of {length}")
    delta = crc32c.crc32c(new_view) ^ crc32c.crc32c(old_view)
    return crc ^ shift(delta, length - position - len(new_view))
