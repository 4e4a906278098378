"""Framed appends with staged files adopted as segments: stamped in place, renamed, not copied."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from npstream.broker import faults
from npstream.broker.errors import DiskIOError, MessageTooLargeError
from npstream.broker.sink.staging import StageTarget, prepare_stage
from npstream.broker.sink.staging_format import StagedFrames, build_staging
from npstream.broker.storage import StreamConfig
from npstream.broker.storage.direct_write import DirectFileWriter
from npstream.broker.storage.files import list_segment_bases, offset_index_path
from npstream.broker.storage.framed_append import FramedAppend
from npstream.broker.storage.staged_segment import StagedSegment

STREAM = "adopt"
WRITER = DirectFileWriter()  # as the broker writes staging: O_DIRECT where the disk allows


def stage(directory: Path, name: str, values: list[str], *, ids: list[str | None] | None = None,
          max_frame_bytes: int = 1 << 20) -> StagedFrames:
    """A staging file in the sink's format (frames with placeholder headers) and its index."""
    columns: dict[str, object] = {"value": values}
    if ids is not None:
        columns["id"] = pa.array(ids, pa.string())
    table = prepare_stage(pa.table(columns), STREAM, lambda stream: StageTarget(1 << 20))
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.arrow"
    pieces, index = build_staging(table, max_frame_bytes)
    WRITER.create(path, pieces)
    return StagedFrames(name, path, index, direct=WRITER.direct)


def segment(frames: StagedFrames) -> StagedSegment:
    staged = frames.segment_for(STREAM)
    assert staged is not None
    return staged


def values_of(log, start: int, end: int) -> list[bytes]:
    return log.read_table(start, end).column("value").to_pylist()


def test_staged_file_becomes_a_segment_after_the_sealed_tail_and_survives_reopen(
        make_storage, config, table_of, clock, data_dir, tmp_path):
    storage = make_storage()
    log = storage.open_log(STREAM, config)
    log.append(table_of([b"before-0", b"before-1"]))
    clock.advance(7)
    staged = stage(data_dir.parent / "sink", "a", [f"v{i}" for i in range(300)],
                   max_frame_bytes=2048)
    assert len(segment(staged).slots) > 1
    seen: list[tuple[int, int]] = []
    result = log.append(FramedAppend([segment(staged)],
                                 before_write=lambda first, ts: seen.append((first, ts))))
    assert seen == [(2, clock.now)]
    assert (result.first_offset, result.stored_count) == (2, 300)
    assert not staged.path.exists()  # moved, not copied
    stream_dir = data_dir / "streams" / STREAM
    assert list_segment_bases(stream_dir) == [0, 2]
    assert offset_index_path(stream_dir, 0).exists()  # the old tail was sealed
    table = log.read_table(0, 302)
    assert table.column("offset").to_pylist() == list(range(302))
    assert table.column("value").to_pylist()[2:] == [f"v{i}".encode() for i in range(300)]
    assert {t.value for t in table.column("timestamp")[2:]} == {clock.now}
    log.append(table_of([b"after"]))  # the adopted segment is the active one now
    assert values_of(log, 302, 303) == [b"after"]
    assert list_segment_bases(stream_dir) == [0, 2]
    storage.close()

    reopened = make_storage().open_log(STREAM, config)  # the loader checks every CRC
    assert reopened.end_offset == 303
    values = reopened.read_table(0, 303).column("value").to_pylist()
    assert values == [b"before-0", b"before-1", *[f"v{i}".encode() for i in range(300)],
                      b"after"]


def test_an_empty_active_segment_is_replaced_by_the_adopted_file(
        make_storage, config, tmp_path, data_dir):
    log = make_storage().open_log(STREAM, config)
    log.delete_all()
    first = stage(data_dir.parent / "sink", "a", ["x", "y"])
    log.append(FramedAppend([segment(first)]))
    second = stage(data_dir.parent / "sink", "b", ["z"])
    log.append(FramedAppend([segment(second)]))
    assert list_segment_bases(data_dir / "streams" / STREAM) == [0, 2]
    assert values_of(log, 0, 3) == [b"x", b"y", b"z"]


def test_copied_frames_and_adopted_files_interleave_contiguously(
        make_storage, config, tmp_path, data_dir):
    storage = make_storage()
    log = storage.open_log(STREAM, config)
    small = stage(data_dir.parent / "sink", "small", ["s0", "s1"])
    big = stage(data_dir.parent / "sink", "big", [f"b{i}" for i in range(50)])
    tail = stage(data_dir.parent / "sink", "tail", ["t0"])
    result = log.append(FramedAppend([*small.frames_for(STREAM), segment(big),
                                  *tail.frames_for(STREAM)]))
    assert (result.first_offset, result.stored_count) == (0, 53)
    assert small.path.exists() and tail.path.exists() and not big.path.exists()
    expected = [b"s0", b"s1", *[f"b{i}".encode() for i in range(50)], b"t0"]
    assert values_of(log, 0, 53) == expected
    assert list_segment_bases(data_dir / "streams" / STREAM) == [0, 2]
    storage.close()
    assert values_of(make_storage().open_log(STREAM, config), 0, 53) == expected


def test_producer_ids_of_an_adopted_file_enter_the_dedup_window(
        make_storage, table_of, tmp_path, data_dir):
    config = StreamConfig(max_age_ms=0, max_bytes=0, dedup_window_ms=60_000,
                          max_message_bytes=1 << 20)
    log = make_storage().open_log(STREAM, config)
    staged = stage(data_dir.parent / "sink", "a", ["x", "y"], ids=["id-x", None])
    log.append(FramedAppend([segment(staged)]))
    result = log.append(table_of([b"again", b"new"], ids=["id-x", "id-new"]))
    assert result.duplicates == [(0, 0)]  # (row of the append, offset it was stored at)
    assert result.stored_count == 1


def test_a_file_that_does_not_match_its_index_is_refused_and_the_log_is_unchanged(
        make_storage, config, table_of, tmp_path, data_dir):
    log = make_storage().open_log(STREAM, config)
    log.append(table_of([b"keep"]))
    staged = stage(data_dir.parent / "sink", "a", ["x", "y"])
    broken = segment(staged)
    with open(staged.path, "r+b") as handle:
        handle.truncate(broken.size - 8)
    with pytest.raises(ValueError, match=r"has \d+ bytes, its index says"):
        log.append(FramedAppend([broken]))
    assert not log.failed and log.end_offset == 1
    assert list_segment_bases(data_dir / "streams" / STREAM) == [0]
    assert log.append(table_of([b"next"])).first_offset == 1


def test_a_disk_error_while_stamping_leaves_the_log_unchanged_and_a_retry_stamps_again(
        make_storage, config, tmp_path, data_dir):
    failing = {"on": True}

    def hook(operation: str, path: Path, position: int) -> None:
        if failing["on"] and operation == "fsync" and path.name == "a.arrow":
            raise OSError(5, "Input/output error")

    log = make_storage(fault_hook=hook).open_log(STREAM, config)
    staged = stage(data_dir.parent / "sink", "a", ["x", "y"])
    with pytest.raises(DiskIOError, match="Input/output error"):
        log.append(FramedAppend([segment(staged)]))
    assert not log.failed and log.end_offset == 0 and staged.path.exists()
    failing["on"] = False
    assert log.append(FramedAppend([segment(staged)])).stored_count == 2
    assert values_of(log, 0, 2) == [b"x", b"y"]


def test_a_failure_after_part_of_the_append_leaves_the_log_refusing_writes(
        make_storage, config, tmp_path, data_dir, table_of):
    storage = make_storage()
    log = storage.open_log(STREAM, config)
    first = stage(data_dir.parent / "sink", "a", ["x", "y"])
    second = stage(data_dir.parent / "sink", "b", ["z"])

    def lose_second(path: Path) -> None:  # both were stamped; the second goes once the first moved
        if path == first.path:
            second.path.unlink()

    faults.arm("storage.adopted", lose_second)
    with pytest.raises(FileNotFoundError):
        log.append(FramedAppend([segment(first), segment(second)]))
    assert log.failed
    with pytest.raises(DiskIOError, match="an earlier write or fsync failed"):
        log.append(table_of([b"no"]))
    storage.close()
    reopened = make_storage().open_log(STREAM, config)
    assert values_of(reopened, 0, 2) == [b"x", b"y"]  # the adopted part is durable


def test_every_file_is_stamped_before_any_is_adopted_so_a_bad_one_changes_nothing(
        make_storage, config, tmp_path, data_dir, table_of):
    log = make_storage().open_log(STREAM, config)
    first = stage(data_dir.parent / "sink", "a", ["x", "y"])
    second = stage(data_dir.parent / "sink", "b", ["z"])
    missing = segment(second)
    second.path.unlink()
    with pytest.raises(FileNotFoundError):
        log.append(FramedAppend([segment(first), missing]))
    assert not log.failed and log.end_offset == 0 and first.path.exists()
    assert list_segment_bases(data_dir / "streams" / STREAM) == []  # nothing was adopted
    # The first file was stamped for offset 0; stamping it again elsewhere is fine.
    log.append(table_of([b"w"]))
    assert log.append(FramedAppend([segment(first)])).first_offset == 1
    assert values_of(log, 0, 3) == [b"w", b"x", b"y"]


def test_resuming_at_an_expected_offset_with_the_original_timestamp(
        make_storage, config, tmp_path, data_dir, clock):
    log = make_storage().open_log(STREAM, config)
    staged = stage(data_dir.parent / "sink", "a", ["x"])
    with pytest.raises(ValueError, match="ends at offset 0, not 5"):
        log.append(FramedAppend([segment(staged)], expect_first=5))
    log.append(FramedAppend([segment(staged)], expect_first=0, timestamp=clock.now - 1000))
    # Timestamps never go back: an older resume timestamp counts as the log's last one.
    assert log.read_table(0, 1).column("timestamp")[0].value == clock.now - 1000


def test_a_lowered_size_limit_is_enforced_before_anything_is_adopted(
        make_storage, tmp_path, data_dir):
    config = StreamConfig(max_age_ms=0, max_bytes=0, dedup_window_ms=0, max_message_bytes=4)
    log = make_storage().open_log(STREAM, config)
    staged = stage(data_dir.parent / "sink", "a", ["abc", "abcdef", "x"])
    with pytest.raises(MessageTooLargeError) as caught:
        log.append(FramedAppend([segment(staged)]))
    assert (caught.value.index, caught.value.size, caught.value.limit) == (1, 6, 4)
    assert staged.path.exists() and log.end_offset == 0


def test_stamping_a_file_this_broker_staged_reads_nothing_back_and_after_a_restart_it_does(
        make_storage, config, data_dir, preadv_calls):
    from npstream.broker.sink.staging import StagingArea

    if not WRITER.direct:
        pytest.skip("the disk refuses O_DIRECT: nothing is read back either way")
    area = StagingArea(data_dir.parent / "sink", max_frame_bytes=2048)
    for name in ("a", "b"):
        table = prepare_stage(pa.table({"value": [f"{name}{i}" for i in range(300)]}), STREAM,
                              lambda stream: StageTarget(1 << 20))
        area.write("sink", 0, name, table)
    preadv_calls.clear()
    storage = make_storage()
    log = storage.open_log(STREAM, config)
    log.append(FramedAppend([segment(area.open_frames("sink", 0, "a"))]))
    assert preadv_calls == []  # every edge block stamping patches was kept when Stage wrote it

    restarted = StagingArea(data_dir.parent / "sink", max_frame_bytes=2048)
    log.append(FramedAppend([segment(restarted.open_frames("sink", 0, "b"))]))
    assert preadv_calls  # a broker that did not stage the file reads the blocks from the disk
    storage.close()

    reopened = make_storage().open_log(STREAM, config)  # the loader checks every CRC
    assert reopened.read_table(0, 600).column("value").to_pylist() == [
        f"{name}{i}".encode() for name in ("a", "b") for i in range(300)]
