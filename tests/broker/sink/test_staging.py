"""Unit tests of what a Stage stores: routing, checks, deterministic ids, durable files."""

from __future__ import annotations

import json
import logging
import os
import struct
import threading
from pathlib import Path

import crc32c
import numpy as np
import pyarrow as pa
import pytest

from npstream.broker.errors import InvalidArgumentError, StagingFormatError
from npstream.broker.sink import staging_format
from npstream.broker.sink.staging import (
    PreparedStage,
    StageTarget,
    StagingArea,
    check_sink_id,
    check_staging_id,
    message_sizes,
    prepare_stage,
)
from npstream.broker.storage.batch_builder import build_message_batch, complete_publish_table
from npstream.proto.frames.record_batch import frame_crc, parse_header
from npstream.proto.schema import HEADERS_TYPE, MESSAGE_SCHEMA


def limits(limit: int = 1 << 20):
    return lambda stream: StageTarget(limit)


def test_prepare_stage_with_stream_column_routes_rows_and_falls_back_to_default():
    data = pa.table({"value": ["a", "b", "c"], "stream": ["x", None, "y"]})
    staged = prepare_stage(data, "d", limits())
    assert staged.streams == ["d", "x", "y"]
    assert {s: staged.rows_for(s).column("value").to_pylist() for s in staged.streams} == {
        "d": [b"b"], "x": [b"a"], "y": [b"c"]}
    assert staged.num_rows == 3


def test_prepare_stage_without_stream_column_sends_all_rows_to_default():
    staged = prepare_stage(pa.table({"value": [b"1", b"2"]}), "orders", limits())
    assert staged.streams == ["orders"]
    assert staged.rows_for("orders").column("value").to_pylist() == [b"1", b"2"]


def test_prepare_stage_null_stream_without_default_names_the_row():
    data = pa.table({"value": ["a", "b"], "stream": ["x", None]})
    with pytest.raises(InvalidArgumentError, match=r"row 1 has no target stream"):
        prepare_stage(data, "", limits())


def test_prepare_stage_no_stream_anywhere_is_rejected():
    with pytest.raises(InvalidArgumentError, match=r"no 'stream' column .* no default stream"):
        prepare_stage(pa.table({"value": ["a"]}), "", limits())


def test_prepare_stage_invalid_stream_name_names_row_and_stream():
    data = pa.table({"value": ["a", "b", "c"], "stream": ["ok", "ok", "../etc"]})
    with pytest.raises(InvalidArgumentError, match=r"row 2: invalid stream name '\.\./etc'"):
        prepare_stage(data, "", limits())


def test_prepare_stage_invalid_default_stream_is_rejected():
    with pytest.raises(InvalidArgumentError, match=r"default stream: invalid stream name '\.x'"):
        prepare_stage(pa.table({"value": ["a"]}), ".x", limits())


def test_prepare_stage_oversized_row_names_row_stream_and_limit():
    data = pa.table({
        "value": ["aa", "bbbbbb", "cc"],
        "key": ["k", None, "kk"],
        "stream": ["small", "big", "small"],
    })
    per_stream = {"small": 3, "big": 100}
    with pytest.raises(InvalidArgumentError,
                       match=r"row 2 for stream 'small' is 4 bytes, over the stream's "
                             r"max_message_bytes=3; nothing was staged"):
        prepare_stage(data, "", lambda stream: StageTarget(per_stream[stream]))


def test_prepare_stage_missing_value_column_is_rejected():
    with pytest.raises(InvalidArgumentError, match="no 'value' column"):
        prepare_stage(pa.table({"key": ["a"]}), "s", limits())


def test_prepare_stage_null_value_is_rejected():
    with pytest.raises(InvalidArgumentError, match="'value' has 1 null"):
        prepare_stage(pa.table({"value": ["a", None]}), "s", limits())


def test_prepare_stage_unknown_column_is_rejected():
    with pytest.raises(InvalidArgumentError, match=r"unknown publish column\(s\) \['offset'\]"):
        prepare_stage(pa.table({"value": ["a"], "offset": [1]}), "s", limits())


def test_prepare_stage_keeps_ids_and_leaves_missing_ones_to_the_broker():
    data = pa.table({"value": ["a", "b"], "id": ["keep", None]})
    staged = prepare_stage(data, "s", limits())
    assert staged.rows_for("s").column("id").to_pylist() == ["keep", None]
    assert "id" not in prepare_stage(pa.table({"value": ["a"]}), "s",
                                     limits()).rows_for("s").column_names


def test_prepare_stage_casts_string_key_and_string_headers():
    headers = pa.array([[("h", "vv")], None], pa.map_(pa.string(), pa.string()))
    data = pa.table({"value": ["a", "b"], "key": ["k", None], "headers": headers})
    staged = prepare_stage(data, "s", limits()).rows_for("s")
    assert staged.schema.field("key").type == pa.binary()
    assert staged.schema.field("headers").type == HEADERS_TYPE
    assert staged.column("headers").to_pylist() == [[("h", b"vv")], None]


def test_message_sizes_counts_value_key_and_headers_of_sliced_maps():
    headers = pa.array([[("ab", b"xyz")], None, [("c", b""), ("dd", None)]], HEADERS_TYPE)
    table = pa.table({"value": [b"1", b"22", b"333"], "key": [b"k", None, b"kk"],
                      "headers": headers})
    assert message_sizes(table).tolist() == [1 + 1 + 5, 2, 3 + 2 + 1 + 2]
    assert message_sizes(table.slice(1)).tolist() == [2, 3 + 2 + 1 + 2]


@pytest.mark.parametrize("bad", ["", ".hidden", "a/b", "..", "x" * 256])
def test_check_ids_path_like_value_is_rejected(bad):
    with pytest.raises(InvalidArgumentError, match="invalid sink_id"):
        check_sink_id(bad)
    with pytest.raises(InvalidArgumentError, match="invalid staging_id"):
        check_staging_id(bad)


def staged(values: list[str], stream: str = "s") -> PreparedStage:
    return prepare_stage(pa.table({"value": values}), stream, limits())


def test_staging_area_write_then_read_round_trips_rows_and_targets(tmp_path: Path):
    area = StagingArea(tmp_path / "sink")
    size = area.write("sink1", 3, "3-0-0", staged(["a", "b"]))
    path = tmp_path / "sink" / "sink1" / "3" / "3-0-0.arrow"
    assert size == path.stat().st_size > 0
    assert area.targets("sink1", 3, "3-0-0") == ["s"]
    back = area.read("sink1", 3, "3-0-0")
    assert back.rows_for("s").column("value").to_pylist() == [b"a", b"b"]
    assert "stream" not in back.rows_for("s").column_names


def test_staging_area_rewrite_of_same_id_replaces_the_file(tmp_path: Path):
    area = StagingArea(tmp_path)
    area.write("k", 0, "st", staged(["old", "old"]))
    area.write("k", 0, "st", staged(["new"]))
    assert area.read("k", 0, "st").rows_for("s").column("value").to_pylist() == [b"new"]
    assert sorted(p.name for p in (tmp_path / "k" / "0").iterdir()) == ["st.arrow", "st.index"]


def test_staged_table_rows_for_filters_one_stream_in_order(tmp_path: Path):
    area = StagingArea(tmp_path)
    data = pa.table({"value": ["1", "2", "3", "4"], "stream": ["a", "b", "a", "b"]})
    area.write("k", 0, "st", prepare_stage(data, "", limits()))
    back = area.read("k", 0, "st")
    assert back.streams == ["a", "b"]
    assert back.rows_for("a").column("value").to_pylist() == [b"1", b"3"]
    assert back.rows_for("b").column("value").to_pylist() == [b"2", b"4"]


def test_staging_area_drop_listed_or_all_counts_files(tmp_path: Path):
    area = StagingArea(tmp_path)
    for staging_id in ("a", "b", "c"):
        area.write("k", 5, staging_id, staged(["x"]))
    assert area.drop("k", 5, ["a", "missing"]) == 1
    assert sorted(f.staging_id for f in area.files()) == ["b", "c"]
    assert area.drop("k", 5) == 2
    assert list(area.files()) == []
    assert not (tmp_path / "k").exists()


def test_staging_area_drop_up_to_keeps_later_batches(tmp_path: Path):
    area = StagingArea(tmp_path)
    for batch in (1, 2, 3, 10):
        area.write("k", batch, f"{batch}-0", staged(["x"]))
    assert area.drop_up_to("k", 3) == 3
    assert [(f.batch_id, f.staging_id) for f in area.files()] == [(10, "10-0")]


def test_staging_area_failed_write_leaves_no_file(tmp_path: Path, monkeypatch):
    area = StagingArea(tmp_path)
    area.write("k", 0, "other", staged(["x"]))

    def broken_fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="Input/output error"):
        area.write("k", 0, "st", staged(["x"]))
    assert sorted(p.name for p in (tmp_path / "k" / "0").iterdir()) == ["other.arrow",
                                                                         "other.index"]


def test_staging_file_holds_frames_per_stream_with_final_ids_and_an_index(tmp_path: Path):
    area = StagingArea(tmp_path, max_frame_bytes=1024)
    data = pa.table({"value": [f"v{i}" for i in range(60)],
                     "id": [f"id-{i}" if i % 2 else None for i in range(60)],
                     "stream": ["a" if i % 3 else "b" for i in range(60)]})
    area.write("k", 0, "st", prepare_stage(data, "", limits()))
    assert area.targets("k", 0, "st") == ["a", "b"]
    frames = area.open_frames("k", 0, "st")
    assert frames is not None and frames.streams == ["a", "b"] and frames.rows == 60
    a_frames = frames.frames_for("a")
    assert len(a_frames) > 1 and sum(f.count for f in a_frames) == 40
    rows = frames.rows_for("a")
    assert rows.column("value").to_pylist() == [f"v{i}".encode() for i in range(60) if i % 3]
    ids = rows.column("id").to_pylist()
    given = [i for i in range(60) if i % 3]
    assert [ids[n] for n, i in enumerate(given) if i % 2] == [f"id-{i}" for i in given if i % 2]
    generated = [ids[n] for n, i in enumerate(given) if not i % 2]
    assert all(len(g) == 32 for g in generated) and len(set(generated)) == len(generated)
    # The same staging read again is the same rows, ids included (a rewritten commit keeps them).
    assert area.open_frames("k", 0, "st").rows_for("a").equals(rows)


def test_staging_file_is_in_segment_layout_with_placeholder_headers(tmp_path: Path):
    """Frames from byte 0, each header with its length and count but no offsets and no CRC."""
    area = StagingArea(tmp_path, max_frame_bytes=1024)
    area.write("k", 0, "st", staged([f"v{i}" for i in range(100)]))
    frames = area.open_frames("k", 0, "st")
    assert frames is not None and frames.format == 3
    data = area.path("k", 0, "st").read_bytes()
    position, counts = 0, []
    while position < len(data):
        header = parse_header(data, position)
        assert (header.base_offset, header.min_timestamp, header.crc) == (0, 0, 0)
        assert frame_crc(data, position, header) != header.crc  # invalid until stamped
        counts.append(header.count)
        position += header.frame_size
    assert position == len(data) and len(counts) > 1 and sum(counts) == 100
    slots = frames.segment_for("s").slots  # type: ignore[union-attr]
    assert [slot.count for slot in slots] == counts
    # What the commit stamps without reading the payloads: where the placeholder offsets
    # and zero timestamps are, and the placeholder payload's CRC.
    placeholder_base = 0
    for slot in slots:
        payload = data[slot.payload_position:slot.payload_position + slot.payload_length]
        stamp = slot.stamp
        assert stamp is not None and stamp.payload_crc == crc32c.crc32c(payload)
        assert stamp.placeholder_base == placeholder_base
        offsets = np.frombuffer(payload, "<i8", slot.count, stamp.offsets_position)
        assert offsets.tolist() == list(range(placeholder_base, placeholder_base + slot.count))
        timestamps = np.frombuffer(payload, "<i8", slot.count, stamp.timestamps_position)
        assert not timestamps.any()
        placeholder_base += slot.count
    assert frames.segment_for("other") is None


def test_staging_of_several_streams_is_not_a_segment_but_its_frames_are_copied(tmp_path: Path):
    area = StagingArea(tmp_path)
    data = pa.table({"value": ["1", "2"], "stream": ["a", "b"]})
    area.write("k", 0, "st", prepare_stage(data, "", limits()))
    frames = area.open_frames("k", 0, "st")
    assert frames is not None
    assert frames.segment_for("a") is None and frames.segment_for("b") is None
    assert [f.count for f in frames.frames_for("b")] == [1]


def test_index_outlives_an_adopted_data_file_and_is_an_orphan_then(tmp_path: Path):
    area = StagingArea(tmp_path)
    area.write("k", 2, "st", staged(["a", "b", "c"]))
    area.path("k", 2, "st").rename(tmp_path / "elsewhere.log")  # what an adoption does
    assert not area.exists("k", 2, "st")
    frames = area.open_frames("k", 2, "st")
    assert frames is not None and frames.count_for("s") == 3
    assert [(o.batch_id, o.staging_id) for o in area.orphan_indexes()] == [(2, "st")]
    assert area.drop("k", 2, ["st"]) == 0
    assert not (tmp_path / "k").exists()


FORMAT_1_MAGIC = b"NPSTG\x00\x00\x01"  # the trailer that ended a format-1 data file


def refusal(found: int) -> str:
    return (rf"is in staging format {found}, written by an older broker; this broker reads "
            r"staging format 3 only")


def test_staging_file_in_format_2_is_refused_naming_its_format(tmp_path: Path):
    """Format 2 had the segment layout but no stamping data in its index: refused."""
    area = StagingArea(tmp_path)
    area.write("k", 3, "v2", staged(["a", "b", "c"]))
    index_file = area.path("k", 3, "v2").with_suffix(".index")
    index = json.loads(index_file.read_bytes())
    index["format"] = 2
    index["frames"] = [frame[:6] for frame in index["frames"]]
    index_file.write_bytes(json.dumps(index).encode())
    with pytest.raises(StagingFormatError, match=refusal(2)) as refused:
        area.open_frames("k", 3, "v2")
    assert (refused.value.found, refused.value.supported) == (2, 3)
    with pytest.raises(StagingFormatError, match=refusal(2)):
        area.targets("k", 3, "v2")


def test_staging_file_in_format_1_is_refused_naming_its_format(tmp_path: Path):
    """Before the segment layout, the payloads formed an Arrow IPC stream, index in a trailer."""
    area = StagingArea(tmp_path)
    table = prepare_stage(pa.table({"value": ["1", "2", "3"], "stream": ["a", "b", "a"]}), "",
                          limits())
    path = area.path("k", 1, "v1")
    path.parent.mkdir(parents=True)
    frames = []
    with pa.OSFile(str(path), "wb") as sink:
        with pa.ipc.new_stream(sink, MESSAGE_SCHEMA) as writer:
            writer.write_batch(pa.RecordBatch.from_pylist([], MESSAGE_SCHEMA))
            for stream in ("a", "b"):
                batch = build_message_batch(
                    complete_publish_table(table.rows_for(stream)), 0, 0, b"f" * 16)
                position = sink.tell()
                writer.write_batch(batch)
                frames.append([stream, batch.num_rows, 0, position, sink.tell() - position, 1])
        index_position = sink.tell()
        text = json.dumps({"rows": 3, "streams": ["a", "b"], "frames": frames}).encode()
        sink.write(text + b" " * (-len(text) % 8))
        sink.write(struct.pack("<Q8s", index_position, FORMAT_1_MAGIC))
    with pytest.raises(StagingFormatError, match=refusal(1)):
        area.open_frames("k", 1, "v1")
    with pytest.raises(StagingFormatError, match=refusal(1)):
        area.targets("k", 1, "v1")


def test_staging_file_of_an_older_broker_is_refused_naming_its_format(tmp_path: Path):
    """Before staged frames, a staging file was an Arrow IPC stream with a stream column."""
    area = StagingArea(tmp_path)
    old = pa.table({"stream": ["a", "b"], "value": [b"1", b"2"]})
    path = area.path("k", 4, "old")
    path.parent.mkdir(parents=True)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, old.schema) as writer:
        writer.write_table(old)
    with pytest.raises(StagingFormatError, match=refusal(0)):
        area.open_frames("k", 4, "old")
    with pytest.raises(StagingFormatError, match=refusal(0)):
        area.targets("k", 4, "old")
    with pytest.raises(StagingFormatError, match=refusal(0)):
        area.read("k", 4, "old")


def test_the_first_refusal_of_an_older_staging_is_logged_once(tmp_path: Path, monkeypatch,
                                                               caplog):
    monkeypatch.setattr(staging_format, "_refusal_logged", threading.Event())
    area = StagingArea(tmp_path)
    for staging_id in ("old-0", "old-1"):
        area.write("k", 5, staging_id, staged(["x"]))
        index_file = area.path("k", 5, staging_id).with_suffix(".index")
        index = json.loads(index_file.read_bytes())
        index["format"] = 2
        index_file.write_bytes(json.dumps(index).encode())
    caplog.set_level(logging.ERROR, logger=staging_format.__name__)
    for staging_id in ("old-0", "old-1", "old-0"):
        with pytest.raises(StagingFormatError):
            area.open_frames("k", 5, staging_id)
    assert [r.getMessage() for r in caplog.records] == [
        f"staging directory {tmp_path / 'k' / '5'} holds staging of an older broker (old-0.arrow "
        "is in staging format 2, this broker reads format 3 only): commits listing it are "
        "refused, and it is deleted by the staging sweep after sink_staging_ttl; further "
        "refusals are not logged"]
