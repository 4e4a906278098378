"""Recovery on open: torn tails are truncated, corruption refuses to open, repair cuts it off."""

from __future__ import annotations

import logging
import os
import random
import shutil

import pytest

from npstream.broker.errors import CorruptRecordError
from npstream.broker.storage import Storage, StorageSettings
from npstream.broker.storage.file_cache import FileCache
from npstream.broker.storage.loader import load_log


def warnings_of(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]


def test_open_torn_tail_at_every_byte_truncates_to_last_whole_frame(
        build_log, make_storage, config, table_of, segments_in, frames_of, caplog):
    directory = build_log("torn", 14, segment_bytes=2048)
    (directory / "clean-shutdown").unlink()  # a torn write happens in a crash only
    tail = segments_in(directory)[-1]
    pristine = tail.read_bytes()
    last_position, last_header = frames_of(tail)[-1]
    assert len(segments_in(directory)) >= 2 and last_header.count >= 1
    cache = FileCache(8)
    caplog.set_level(logging.WARNING, logger="npstream.broker.storage")
    for cut in range(last_position, len(pristine)):
        tail.write_bytes(pristine[:cut])
        caplog.clear()
        loaded = load_log(directory, cache, 4096, "torn")
        assert loaded.end_offset == last_header.base_offset, cut
        assert loaded.truncated_bytes == cut - last_position
        assert loaded.valid_bytes == last_position == tail.stat().st_size
        messages = warnings_of(caplog)
        if cut == last_position:
            assert messages == []
        else:
            assert len(messages) == 1
            assert str(tail) in messages[0] and f"at byte {last_position}" in messages[0]
    cache.close()
    storage = make_storage(segment_bytes=2048)
    log = storage.open_log("torn", config)
    end = last_header.base_offset
    assert log.read_table(0, end).column("value").to_pylist() == [
        f"v{o}".encode() for o in range(end)]
    assert log.append(table_of([b"next"])).first_offset == end


def test_open_garbage_before_tail_raises_corrupt_record_then_repair_truncates(
        build_log, make_storage, config, table_of, segments_in, frames_of, data_dir, tmp_path):
    directory = build_log("garbage", 30, segment_bytes=1500)
    pristine = tmp_path / "pristine"
    shutil.copytree(directory, pristine)
    files = segments_in(directory)
    assert len(files) >= 3
    frames = [(path, position, header) for path in files for position, header in frames_of(path)]
    candidates = frames[:-1]  # every frame before the tail's last one
    rng = random.Random(20240601)
    for _ in range(40):
        shutil.rmtree(directory)
        shutil.copytree(pristine, directory)
        path, position, header = rng.choice(candidates)
        byte = position + rng.randrange(header.frame_size)
        with open(path, "r+b") as handle:
            handle.seek(byte)
            original = handle.read(1)[0]
            handle.seek(byte)
            handle.write(bytes([original ^ rng.randrange(1, 256)]))
        storage = Storage(StorageSettings(data_dir=data_dir))
        try:
            with pytest.raises(CorruptRecordError) as error:
                storage.open_log("garbage", config)
            assert (error.value.path, error.value.position) == (path, position), byte
            assert f"corrupt record in {path} at byte {position}" in str(error.value)
            expected_removed = path.stat().st_size - position + sum(
                later.stat().st_size for later in files if later.name > path.name)
            removed, where = storage.repair_log("garbage", config)
            assert (removed, where) == (expected_removed, f"{path.name}@{position}")
            log = storage.open_log("garbage", config)
            assert log.end_offset == header.base_offset
            assert log.read_table(0, log.end_offset).column("value").to_pylist() == [
                f"v{o}".encode() for o in range(header.base_offset)]
            assert log.append(table_of([b"again"])).first_offset == header.base_offset
        finally:
            storage.close()


def test_open_bad_last_frame_after_clean_close_raises_but_after_crash_truncates(
        build_log, make_storage, config, table_of, segments_in, frames_of, data_dir):
    directory = build_log("last", 5)
    tail = segments_in(directory)[-1]
    position, header = frames_of(tail)[-1]
    with open(tail, "r+b") as handle:  # damage the payload of the last frame
        handle.seek(position + header.frame_size - 3)
        handle.write(b"\xff\xfe\xfd")
    assert (directory / "clean-shutdown").exists()
    storage = make_storage()
    with pytest.raises(CorruptRecordError) as error:
        storage.open_log("last", config)
    assert error.value.position == position and "CRC mismatch" in error.value.detail
    (directory / "clean-shutdown").unlink()  # as after a crash: no clean shutdown recorded
    log = storage.open_log("last", config)
    assert log.end_offset == header.base_offset


def test_open_zero_filled_tail_truncates_zeros(
        build_log, make_storage, config, table_of, segments_in):
    directory = build_log("zeros", 4)
    (directory / "clean-shutdown").unlink()
    tail = segments_in(directory)[-1]
    size = tail.stat().st_size
    with open(tail, "ab") as handle:
        handle.write(bytes(5000))
    loaded = load_log(directory, FileCache(4), 4096, "zeros")
    assert (loaded.end_offset, loaded.truncated_bytes, tail.stat().st_size) == (7, 5000, size)


def test_open_missing_or_damaged_index_rebuilds_it(
        build_log, make_storage, config, table_of, segments_in, caplog):
    directory = build_log("index", 20, segment_bytes=1500)
    files = segments_in(directory)
    first_index = files[0].with_suffix(".index")
    second_time_index = files[1].with_suffix(".timeindex")
    original = first_index.read_bytes()
    first_index.unlink()
    damaged = bytearray(second_time_index.read_bytes())
    damaged[-1] ^= 0xFF
    second_time_index.write_bytes(bytes(damaged))
    caplog.set_level(logging.INFO, logger="npstream.broker.storage")
    loaded = load_log(directory, FileCache(4), 4096, "index")
    assert loaded.rebuilt_indexes == [files[0].name, files[1].name]
    assert first_index.read_bytes()[48:] == original[48:]  # same entries rebuilt
    assert any("rebuilt indexes" in record.getMessage() for record in caplog.records)
    assert load_log(directory, FileCache(4), 4096, "index").rebuilt_indexes == []


def test_open_segment_missing_in_the_middle_raises_corrupt_record(
        build_log, make_storage, config, table_of, segments_in):
    directory = build_log("gap", 20, segment_bytes=1500)
    files = segments_in(directory)
    for suffix in (".log", ".index", ".timeindex"):
        os.unlink(files[1].with_suffix(suffix))
    with pytest.raises(CorruptRecordError) as error:
        make_storage().open_log("gap", config)
    assert error.value.path == files[0]
    assert "next segment starts at offset" in error.value.detail


def test_open_after_crash_without_fsync_keeps_whole_frames(make_storage, config, table_of,
                                                           data_dir):
    storage = make_storage()
    log = storage.open_log("crash", config)
    for index in range(5):
        log.append(table_of([f"c{index}".encode()]))
    # no close(): as after kill -9 the clean-shutdown marker is missing
    reopened = Storage(StorageSettings(data_dir=data_dir))
    try:
        log2 = reopened.open_log("crash", config)
        assert log2.end_offset == 5
        assert log2.read_table(0, 5).column("value").to_pylist() == [
            f"c{i}".encode() for i in range(5)]
    finally:
        reopened.close()


def test_read_damaged_trusted_segment_raises_corrupt_record(
        build_log, make_storage, config, table_of, segments_in, frames_of):
    directory = build_log("rot", 20, segment_bytes=3000)
    first = segments_in(directory)[0]
    position, header = frames_of(first)[1]
    stat = first.stat()
    with open(first, "r+b") as handle:  # bit rot: content changes, size and mtime do not
        handle.seek(position + header.frame_size - 1)
        byte = handle.read(1)[0]
        handle.seek(position + header.frame_size - 1)
        handle.write(bytes([byte ^ 1]))
    os.utime(first, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    storage = make_storage()
    log = storage.open_log("rot", config)  # index seal matches: opened without a scan
    assert log.read(0, max_messages=header.base_offset).count == header.base_offset
    with pytest.raises(CorruptRecordError) as error:
        log.read(header.base_offset)
    assert (error.value.path, error.value.position) == (first, position)
    assert "CRC mismatch" in error.value.detail
    _removed, where = storage.repair_log("rot", config)
    assert where == f"{first.name}@{position}"
    assert storage.open_log("rot", config).end_offset == header.base_offset


@pytest.mark.parametrize("bit", range(32))
def test_open_length_bit_flip_mid_tail_after_crash_refuses_and_keeps_later_frames(
        build_log, make_storage, config, table_of, segments_in, frames_of, bit):
    """Issue 34 item 1: frame 100 of 200 damaged in place is corruption, never a torn tail."""
    directory = build_log("midflip", 200)
    (directory / "clean-shutdown").unlink()  # as after a crash
    tail = segments_in(directory)[-1]
    frames = frames_of(tail)
    assert len(frames) == 200
    position, header = frames[100]
    damaged = bytearray(tail.read_bytes())
    damaged[position + 8 + bit // 8] ^= 1 << (bit % 8)  # payload_len is bytes 8..12
    tail.write_bytes(bytes(damaged))
    storage = make_storage()
    with pytest.raises(CorruptRecordError) as error:
        storage.open_log("midflip", config)
    assert (error.value.path, error.value.position) == (tail, position)
    assert tail.read_bytes() == bytes(damaged)  # nothing cut
    removed, where = storage.repair_log("midflip", config)
    assert (removed, where) == (len(damaged) - position, f"{tail.name}@{position}")
    assert storage.open_log("midflip", config).end_offset == header.base_offset


def test_open_torn_write_after_intact_frame_copy_refuses(
        build_log, make_storage, config, table_of, segments_in, frames_of):
    """A frame that runs past the end with a whole frame inside what follows is not torn."""
    directory = build_log("copied", 20)
    (directory / "clean-shutdown").unlink()
    tail = segments_in(directory)[-1]
    data = tail.read_bytes()
    position, _header = frames_of(tail)[5]
    garbage = bytearray(data[position:position + 48])
    garbage[8:12] = (1 << 30).to_bytes(4, "little")  # a header claiming 1 GiB
    tail.write_bytes(data + bytes(garbage) + data[position:])
    with pytest.raises(CorruptRecordError) as error:
        make_storage().open_log("copied", config)
    assert error.value.position == len(data)
    assert f"an intact frame follows at byte {len(data) + 48}" in error.value.detail


def test_read_trusted_segment_with_damaged_base_offset_raises_instead_of_ending_early(
        build_log, make_storage, config, table_of, segments_in, frames_of):
    """A header's base offset changed by bit rot in a trusted segment used to end a read
    there, silently: the frame looked as if it began past the range asked for."""
    directory = build_log("early", 20, segment_bytes=3000)
    first = segments_in(directory)[0]
    position, _header = frames_of(first)[0]
    stat = first.stat()
    with open(first, "r+b") as handle:
        handle.seek(position + 16)  # base_offset, low byte: 0 becomes 255
        handle.write(b"\xff")
    os.utime(first, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    log = make_storage().open_log("early", config)  # the seal matches: not scanned
    with pytest.raises(CorruptRecordError) as error:
        log.read_table(0, log.end_offset)
    assert (error.value.path, error.value.position) == (first, position)
    assert "CRC mismatch" in error.value.detail
