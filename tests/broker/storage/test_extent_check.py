"""Files that hold less than recorded are refused on open, never served shorter (issue 34)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from npstream.broker.errors import CorruptRecordError
from npstream.broker.storage import Storage, StorageSettings
from npstream.broker.storage.peek import peek_stats


def values(end: int) -> list[bytes]:
    return [f"v{o}".encode() for o in range(end)]


def cut(path: Path, size: int) -> bytes:
    data = path.read_bytes()
    path.write_bytes(data[:size])
    return data[:size]


def test_open_tail_cut_at_frame_boundary_after_clean_stop_refuses_then_repair_accepts(
        build_log, make_storage, config, table_of, segments_in, frames_of, caplog):
    directory = build_log("cut", 200)
    tail = segments_in(directory)[-1]
    frames = frames_of(tail)
    end = frames[-1][1].next_offset
    position, header = frames[150]
    kept = cut(tail, position)
    storage = make_storage()
    with pytest.raises(CorruptRecordError) as error:
        storage.open_log("cut", config)
    assert (error.value.path, error.value.position) == (tail, position)
    size = frames[-1][0] + frames[-1][1].frame_size
    assert (f"the segment file has {position} bytes, {size} were "
            f"recorded; the clean-shutdown marker records offsets up to {end}"
            in error.value.detail)
    assert "opening the log would reuse their offsets" in error.value.detail
    assert tail.read_bytes() == kept
    caplog.set_level(logging.WARNING, logger="npstream.broker.storage")
    assert storage.repair_log("cut", config) == (0, "")
    assert any("repair accepts files that hold less than recorded" in record.getMessage()
               for record in caplog.records)
    log = storage.open_log("cut", config)
    assert log.end_offset == header.base_offset
    assert log.read_table(0, log.end_offset).column("value").to_pylist() == values(
        header.base_offset)


def test_open_tail_cut_mid_frame_after_clean_stop_refuses_instead_of_torn_tail(
        build_log, make_storage, config, table_of, segments_in, frames_of):
    directory = build_log("mid", 200)
    tail = segments_in(directory)[-1]
    position, _header = frames_of(tail)[150]
    kept = cut(tail, position + 30)
    with pytest.raises(CorruptRecordError) as error:
        make_storage().open_log("mid", config)
    assert error.value.path == tail and "the clean-shutdown marker records" in error.value.detail
    assert tail.read_bytes() == kept  # not truncated as a torn tail


def test_open_tail_cut_after_crash_below_end_recorded_at_open_refuses(
        build_log, make_storage, config, table_of, segments_in, frames_of, data_dir, clock):
    directory = build_log("crashed", 60)
    running = Storage(StorageSettings(data_dir=data_dir), clock)  # never closed: as kill -9
    log = running.open_log("crashed", config)
    end = log.end_offset
    log.append(table_of([b"after-open"]))
    assert not (directory / "clean-shutdown").exists()
    tail = segments_in(directory)[-1]
    position, _header = frames_of(tail)[40]
    cut(tail, position)
    with pytest.raises(CorruptRecordError) as error:
        make_storage().open_log("crashed", config)
    assert error.value.position == position
    assert f"log-extent (written at the last open, roll, deletion or truncation) records " \
           f"offsets up to {end}" in error.value.detail


@pytest.mark.parametrize("which", ["first", "tail", "all"])
def test_open_segment_file_removed_refuses(
        build_log, make_storage, config, table_of, segments_in, which):
    directory = build_log("gone", 40, segment_bytes=1500)
    files = segments_in(directory)
    assert len(files) >= 3
    doomed = {"first": files[:1], "tail": files[-1:], "all": files}[which]
    for path in doomed:
        for suffix in (".log", ".index", ".timeindex"):
            with_suffix = path.with_suffix(suffix)
            if with_suffix.exists():
                os.unlink(with_suffix)
    with pytest.raises(CorruptRecordError) as error:
        make_storage(segment_bytes=1500).open_log("gone", config)
    expected = {"first": f"offsets [0, {int(files[1].stem)}) are gone",
                "tail": "acknowledged messages are missing",
                "all": "every segment file is missing"}[which]
    assert expected in error.value.detail


def test_open_after_deletions_and_truncation_then_crash_keeps_working(
        build_log, make_storage, config, table_of, data_dir, clock):
    """The broker's own deletions lower the records first: no false refusal after a crash."""
    build_log("own", 40, segment_bytes=1500)
    running = Storage(StorageSettings(data_dir=data_dir, segment_bytes=1500), clock)
    log = running.open_log("own", config)
    log.delete_before(30)
    log.truncate_to(69)  # a frame boundary: frames hold 1, 2, 3, 1, ... messages
    log.append(table_of([b"x"]))
    reopened = make_storage(segment_bytes=1500).open_log("own", config)  # no close: a crash
    assert (reopened.start_offset, reopened.end_offset) == (30, 70)
    assert reopened.read_table(30, 70).column("value").to_pylist() == [
        f"v{o}".encode() for o in range(30, 69)] + [b"x"]
    reopened.delete_all()
    again = Storage(StorageSettings(data_dir=data_dir, segment_bytes=1500), clock)
    try:
        assert (again.open_log("own", config).start_offset,
                again.open_log("own", config).end_offset) == (70, 70)
    finally:
        again.close()


def test_open_garbled_marker_warns_and_reads_every_message(
        build_log, make_storage, config, table_of, caplog):
    directory = build_log("garbled", 20)
    marker = directory / "clean-shutdown"
    marker.write_bytes(marker.read_bytes()[:-3])
    caplog.set_level(logging.WARNING, logger="npstream.broker.storage")
    log = make_storage().open_log("garbled", config)
    assert log.read_table(0, log.end_offset).column("value").to_pylist() == values(
        log.end_offset)
    assert log.end_offset == 39
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "ignored an unreadable clean-shutdown marker" in warnings[0]


def test_peek_stats_of_cut_tail_answers_none(build_log, make_storage, config, table_of, segments_in,
                                             frames_of):
    directory = build_log("peeked", 10)
    assert peek_stats(directory) is not None
    tail = segments_in(directory)[-1]
    cut(tail, frames_of(tail)[5][0])
    assert peek_stats(directory) is None  # only opening can tell: it refuses
