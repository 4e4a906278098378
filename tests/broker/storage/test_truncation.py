"""Truncation: truncate_to a frame boundary (what a replica cutting back to its leader needs)."""

from __future__ import annotations

import pytest

from npstream.broker.errors import OffsetOutOfRangeError
from npstream.broker.storage import StreamConfig
from npstream.broker.storage.errors import FrameBoundaryError
from npstream.broker.storage.stream_files import CleanShutdown, read_clean_shutdown

DEDUP = StreamConfig(max_age_ms=0, max_bytes=0, dedup_window_ms=60_000,
                     max_message_bytes=1 << 20)


def fill(log, table_of, appends: int = 10) -> None:
    """``appends`` appends of 4 messages each: one frame each, values v<append>-<i>."""
    for index in range(appends):
        log.append(table_of([f"v{index}-{i}".encode() for i in range(4)]))


def values(log, start: int, end: int) -> list[bytes]:
    return log.read_table(start, end).column("value").to_pylist()


def expected(start: int, end: int) -> list[bytes]:
    return [f"v{o // 4}-{o % 4}".encode() for o in range(start, end)]


def test_truncate_to_frame_boundary_cuts_its_segment_and_deletes_later_ones(
        make_storage, config, table_of, segments_in, frames_of):
    log = make_storage(segment_bytes=3000).open_log("cut", config)  # 3 frames a segment
    fill(log, table_of)
    before = segments_in(log.directory)
    assert len(before) >= 3
    bases = [int(path.stem) for path in before]
    cut = bases[1] + 8  # after the second frame of the second segment
    assert bases[2] > cut
    log.truncate_to(cut)
    assert (log.start_offset, log.end_offset) == (0, cut)
    after = segments_in(log.directory)
    assert [int(path.stem) for path in after] == bases[:2]
    assert [(h.base_offset, h.next_offset) for _, h in frames_of(after[-1])] == [
        (bases[1], bases[1] + 4), (bases[1] + 4, cut)]
    assert values(log, 0, cut) == expected(0, cut)
    assert log.stats().segment_count == len(after)
    assert log.offset_for_timestamp(0) == 0


def test_truncate_to_then_append_gets_the_cut_offset_also_after_reopen(
        make_storage, config, table_of, data_dir):
    storage = make_storage(segment_bytes=1500)
    log = storage.open_log("reopen", config)
    fill(log, table_of)
    log.truncate_to(20)
    result = log.append(table_of([b"after"]))
    assert (result.first_offset, result.stored_count) == (20, 1)
    directory = log.directory
    storage.close()
    marker = read_clean_shutdown(directory)
    assert marker is not None and marker.next_offset == 21
    assert isinstance(marker, CleanShutdown)
    reopened = make_storage(segment_bytes=1500).open_log("reopen", config)
    assert (reopened.start_offset, reopened.end_offset) == (0, 21)
    assert values(reopened, 0, 21) == [*expected(0, 20), b"after"]
    assert reopened.read(8, max_messages=4).next_offset == 12  # the indexes find offset 8
    assert reopened.append(table_of([b"next"])).first_offset == 21


def test_truncate_to_inside_a_frame_raises_and_changes_nothing(make_storage, config, table_of,
                                                              segments_in):
    log = make_storage(segment_bytes=1500).open_log("inside", config)
    fill(log, table_of)
    files = {path.name: path.stat().st_size for path in segments_in(log.directory)}
    with pytest.raises(FrameBoundaryError) as error:
        log.truncate_to(26)
    assert (error.value.stream, error.value.offset, error.value.frame_start,
            error.value.frame_end) == ("inside", 26, 24, 28)
    assert str(error.value) == (
        "stream 'inside': cannot truncate to offset 26, inside the frame holding offsets "
        "[24, 28); truncate to 24 or 28 (the log was not changed)")
    assert log.end_offset == 40
    assert {path.name: path.stat().st_size for path in segments_in(log.directory)} == files
    assert values(log, 0, 40) == expected(0, 40)


@pytest.mark.parametrize("offset", [3, 41])
def test_truncate_to_outside_start_and_end_raises_offset_out_of_range(make_storage, config,
                                                                     table_of, offset):
    log = make_storage().open_log("outside", config)
    fill(log, table_of)
    log.delete_before(4)
    with pytest.raises(OffsetOutOfRangeError) as error:
        log.truncate_to(offset)
    assert (error.value.offset, error.value.start_offset, error.value.end_offset) == (
        offset, 4, 40)
    assert (log.start_offset, log.end_offset) == (4, 40)


def test_truncate_to_end_offset_changes_nothing(make_storage, config, table_of):
    log = make_storage().open_log("noop", config)
    fill(log, table_of, appends=2)
    log.truncate_to(8)
    assert log.end_offset == 8
    assert log.recent_rows(4) is not None  # the view was not replaced


def test_truncate_to_a_segment_base_leaves_an_empty_tail_appends_continue_there(
        make_storage, config, table_of, segments_in):
    storage = make_storage(segment_bytes=1500)
    log = storage.open_log("base", config)
    fill(log, table_of)
    base = int(segments_in(log.directory)[1].stem)
    log.truncate_to(base)
    assert log.end_offset == base
    assert int(segments_in(log.directory)[-1].stem) == base
    assert log.append(table_of([b"x"])).first_offset == base
    storage.close()
    reopened = make_storage(segment_bytes=1500).open_log("base", config)
    assert reopened.end_offset == base + 1


def test_truncate_to_start_empties_the_log_and_keeps_offsets(make_storage, config, table_of):
    log = make_storage().open_log("empty", config)
    fill(log, table_of, appends=3)
    log.delete_before(4)
    log.truncate_to(4)
    assert (log.start_offset, log.end_offset) == (4, 4)
    assert log.append(table_of([b"x"])).first_offset == 4


def test_truncate_to_forgets_the_dedup_ids_it_removes_only(make_storage, table_of):
    log = make_storage().open_log("dedup", DEDUP)
    log.append(table_of([b"a", b"b"], ids=["a", "b"]))
    log.append(table_of([b"c", b"d"], ids=["c", "d"]))
    log.truncate_to(2)
    result = log.append(table_of([b"a", b"c", b"d"], ids=["a", "c", "d"]))
    assert (result.first_offset, result.stored_count, result.duplicates) == (2, 2, [(0, 0)])
