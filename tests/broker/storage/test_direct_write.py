"""Files created with O_DIRECT: exact bytes, durable, not in the page cache; tmpfs falls back."""

from __future__ import annotations

import ctypes
import errno
import logging
import mmap
import os
from pathlib import Path

import pytest

from npstream.broker.storage.direct_write import (
    ALIGNMENT,
    CreatedFile,
    DirectFileWriter,
    WrittenBlocks,
    edge_blocks,
)

_LIBC = ctypes.CDLL(None, use_errno=True)


def resident_pages(path: Path) -> int:
    """Pages of ``path`` in the page cache (mincore over a shared map of the file)."""
    size = path.stat().st_size
    with open(path, "r+b") as handle, mmap.mmap(handle.fileno(), size) as mapped:
        pages = -(-size // mmap.PAGESIZE)
        vector = (ctypes.c_ubyte * pages)()
        address = ctypes.addressof(ctypes.c_char.from_buffer(mapped))
        try:
            if _LIBC.mincore(ctypes.c_void_p(address), ctypes.c_size_t(size), vector) != 0:
                raise OSError(ctypes.get_errno(), "mincore failed")
            return sum(byte & 1 for byte in vector)
        finally:
            del address


def supports_o_direct(directory: Path) -> bool:
    try:
        fd = os.open(directory / ".probe", os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644)
    except OSError:
        return False
    os.close(fd)
    (directory / ".probe").unlink()
    return True


@pytest.mark.parametrize("direct", [True, False])
def test_pieces_are_written_back_to_back_with_the_exact_size(tmp_path: Path, direct: bool):
    pieces = [b"h" * 48, bytearray(b"p" * 10_000), memoryview(b"q" * 5)]
    writer = DirectFileWriter(direct)
    assert writer.create(tmp_path / "f", pieces) == 10_053
    assert (tmp_path / "f").read_bytes() == b"h" * 48 + b"p" * 10_000 + b"q" * 5


def test_a_reused_buffer_leaves_no_bytes_of_an_earlier_file(tmp_path: Path):
    writer = DirectFileWriter()
    writer.create(tmp_path / "big", [b"x" * (3 * ALIGNMENT + 100)])
    writer.create(tmp_path / "small", [b"y" * 10])
    assert (tmp_path / "small").read_bytes() == b"y" * 10
    assert (tmp_path / "big").read_bytes() == b"x" * (3 * ALIGNMENT + 100)


def test_an_existing_file_is_refused_and_kept(tmp_path: Path):
    (tmp_path / "f").write_bytes(b"old")
    with pytest.raises(FileExistsError):
        DirectFileWriter().create(tmp_path / "f", [b"new"])
    assert (tmp_path / "f").read_bytes() == b"old"


def test_a_direct_write_leaves_the_file_out_of_the_page_cache(tmp_path: Path):
    if not supports_o_direct(tmp_path):
        pytest.skip(f"{tmp_path} refuses O_DIRECT (the fallback test covers it)")
    writer = DirectFileWriter()
    writer.create(tmp_path / "direct", [os.urandom(64 * ALIGNMENT + 8)])
    DirectFileWriter(direct=False).create(tmp_path / "cached", [os.urandom(64 * ALIGNMENT + 8)])
    assert writer.direct
    assert resident_pages(tmp_path / "direct") <= 1  # at most the truncated tail page
    assert resident_pages(tmp_path / "cached") == 65


def test_a_filesystem_refusing_o_direct_gets_page_cache_writes_from_then_on(
        tmp_path: Path, monkeypatch, caplog):
    """tmpfs on older kernels and some network filesystems answer O_DIRECT with EINVAL."""
    real_open = os.open
    refused: list[str] = []

    def open_without_direct(path, flags, *args):
        if flags & os.O_DIRECT:
            refused.append(os.path.basename(path))
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", open_without_direct)
    caplog.set_level(logging.INFO, logger="npstream.broker.storage.direct_write")
    writer = DirectFileWriter()
    assert writer.create(tmp_path / "a", [b"abc", b"def"]) == 6
    assert writer.create(tmp_path / "b", [b"xyz"]) == 3
    assert (tmp_path / "a").read_bytes() == b"abcdef" and (tmp_path / "b").read_bytes() == b"xyz"
    assert refused == ["a"] and not writer.direct
    assert caplog.text.count("refuses O_DIRECT") == 1


@pytest.mark.parametrize("direct", [True, False])
def test_patches_overwrite_ranges_and_keep_the_size(tmp_path: Path, direct: bool):
    size = 5 * ALIGNMENT + 123
    original = bytearray(os.urandom(size))
    path = tmp_path / "f"
    DirectFileWriter(direct).create(path, [original])
    patches = [(10, b"A" * 48),                          # inside the first block
               (ALIGNMENT - 4, b"B" * 8),                # across a block boundary
               (ALIGNMENT + 100, b"C" * 10),             # shares a block with the one above
               (3 * ALIGNMENT, b"D" * ALIGNMENT),        # exactly one block
               (size - 7, b"E" * 7)]                     # the file's partial last block
    synced: list[int] = []
    writer = DirectFileWriter(direct)
    writer.patch(path, patches, before_sync=lambda: synced.append(path.stat().st_size))
    for position, data in patches:
        original[position:position + len(data)] = data
    assert path.read_bytes() == bytes(original) and synced == [size]


def test_a_direct_patch_leaves_the_file_out_of_the_page_cache(tmp_path: Path):
    if not supports_o_direct(tmp_path):
        pytest.skip(f"{tmp_path} refuses O_DIRECT (the fallback test covers it)")
    path = tmp_path / "f"
    writer = DirectFileWriter()
    writer.create(path, [bytes(64 * ALIGNMENT)])
    writer.patch(path, [(100, b"x" * 10 * ALIGNMENT), (40 * ALIGNMENT, b"y" * 8)])
    assert writer.direct and resident_pages(path) == 0


def test_a_patch_outside_the_file_is_refused_and_nothing_written(tmp_path: Path):
    path = tmp_path / "f"
    DirectFileWriter().create(path, [b"0123456789"])
    with pytest.raises(ValueError, match=r"patch of 4 bytes at 8 is outside .* \(10 bytes\)"):
        DirectFileWriter().patch(path, [(0, b"ab"), (8, b"wxyz")])
    assert path.read_bytes() == b"0123456789"


def test_edge_blocks_are_the_first_and_last_block_of_each_range():
    assert edge_blocks([(10, 48), (ALIGNMENT - 4, 8), (3 * ALIGNMENT, ALIGNMENT), (99, 0)]) == {
        0, 1, 3}


def test_kept_blocks_spare_a_direct_patch_its_reads_and_give_the_same_bytes(tmp_path, preadv_calls):
    if not supports_o_direct(tmp_path):
        pytest.skip(f"{tmp_path} refuses O_DIRECT (nothing is kept without it)")
    size = 5 * ALIGNMENT + 123
    original = bytearray(os.urandom(size))
    patches = [(ALIGNMENT - 4, b"B" * 8), (2 * ALIGNMENT + 5, b"C" * (2 * ALIGNMENT)),
               (size - 7, b"E" * 7)]
    wanted = edge_blocks([(position, len(data)) for position, data in patches])
    writer = DirectFileWriter()
    kept = writer.create_keeping(tmp_path / "kept", [original], wanted | {99})  # 99: past EOF
    writer.create(tmp_path / "read", [original])
    info = (tmp_path / "kept").stat()
    assert (kept.size, kept.inode, kept.mtime_ns) == (size, info.st_ino, info.st_mtime_ns)
    assert sorted(kept.blocks) == sorted(wanted) == [0, 1, 2, 4, 5]
    padded = bytes(original) + bytes(6 * ALIGNMENT - size)  # the last block is zero-padded
    for block, data in kept.blocks.items():
        assert data == padded[block * ALIGNMENT:(block + 1) * ALIGNMENT]

    preadv_calls.clear()
    writer.patch(tmp_path / "kept", patches, known_blocks=kept.blocks)
    assert preadv_calls == []
    writer.patch(tmp_path / "read", patches)
    assert len(preadv_calls) == 5
    for position, data in patches:
        original[position:position + len(data)] = data
    assert (tmp_path / "kept").read_bytes() == (tmp_path / "read").read_bytes() == original


def test_buffered_create_keeps_no_blocks(tmp_path):
    created = DirectFileWriter(direct=False).create_keeping(tmp_path / "f", [b"x" * 100], {0})
    assert (created.size, created.blocks) == (100, {})


def test_written_blocks_are_handed_out_only_while_the_file_is_unchanged(tmp_path):
    writer, blocks = DirectFileWriter(), WrittenBlocks()
    if not writer.direct or not supports_o_direct(tmp_path):
        pytest.skip(f"{tmp_path} refuses O_DIRECT")
    path = tmp_path / "f"
    blocks.remember(path, writer.create_keeping(path, [b"a" * ALIGNMENT * 2], {0, 1}))
    assert sorted(blocks.blocks(path)) == [0, 1]

    writer.patch(path, [(5, b"zz")], known_blocks=blocks.blocks(path))  # changes its mtime
    assert blocks.blocks(path) == {}

    replaced = tmp_path / "g"
    blocks.remember(replaced, writer.create_keeping(replaced, [b"b" * 10], {0}))
    replaced.unlink()
    writer.create(replaced, [b"c" * 10])  # another file under the same name
    assert blocks.blocks(replaced) == {}
    assert blocks.blocks(tmp_path / "unknown") == {}


def test_written_blocks_forget_the_oldest_files_beyond_their_budget():
    blocks = WrittenBlocks(max_bytes=3 * ALIGNMENT)
    for name in ("a", "b"):
        blocks.remember(Path(name), CreatedFile(1, 1, 1, {0: b"", 1: b""}))
    assert [key for key in blocks._files] == ["b"] and blocks._bytes == 2 * ALIGNMENT
