"""Retention by age and size (injected clock), delete_before, delete_all, idle streams."""

from __future__ import annotations

import logging

import pytest

from npstream.broker.errors import OffsetOutOfRangeError
from npstream.broker.storage import StreamConfig

SEGMENT = dict(segment_bytes=1500)


def fill(log, table_of, clock, appends: int, *, step_ms: int = 1000) -> None:
    """Appends of 2 messages valued v<offset>, ``step_ms`` apart."""
    for _ in range(appends):
        offset = log.end_offset
        log.append(table_of([f"v{offset}".encode(), f"v{offset + 1}".encode()]))
        clock.advance(step_ms)


def bases(data_dir, name) -> list[int]:
    return sorted(int(path.stem) for path in (data_dir / "streams" / name).glob("*.log"))


def test_retention_max_age_deletes_expired_closed_segments_only(make_storage, table_of, clock,
                                                                 data_dir, caplog):
    config = StreamConfig(max_age_ms=60_000, max_bytes=0, dedup_window_ms=0,
                          max_message_bytes=1 << 20)
    storage = make_storage(**SEGMENT)
    log = storage.open_log("aged", config)
    fill(log, table_of, clock, 20)
    segments = bases(data_dir, "aged")
    assert len(segments) >= 4
    storage.enforce_retention()
    assert bases(data_dir, "aged") == segments  # nothing older than 60 s yet
    # Newest message of the first segment was written at START + t; make exactly it expire.
    first_segment_last = segments[1] - 1
    written_at = log.read_table(first_segment_last, first_segment_last + 1).column(
        "timestamp").cast("int64")[0].as_py()
    clock.now = written_at + 60_000
    storage.enforce_retention()
    assert bases(data_dir, "aged") == segments  # exactly max_age old: kept
    clock.now += 1
    caplog.set_level(logging.INFO, logger="npstream.broker.storage")
    storage.enforce_retention()
    assert bases(data_dir, "aged") == segments[1:]
    assert log.start_offset == segments[1]
    assert any("retention" in r.getMessage() and f"[0, {segments[1]})" in r.getMessage()
               for r in caplog.records)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(0)


def test_retention_max_age_all_expired_empties_log_offsets_continue(make_storage, table_of,
                                                                     clock, data_dir):
    config = StreamConfig(max_age_ms=10_000, max_bytes=0, dedup_window_ms=0,
                          max_message_bytes=1 << 20)
    storage = make_storage(**SEGMENT)
    log = storage.open_log("expire-all", config)
    fill(log, table_of, clock, 12)
    end = log.end_offset
    clock.advance(10_000)
    storage.enforce_retention()
    assert (log.start_offset, log.end_offset) == (end, end)
    assert bases(data_dir, "expire-all") == [end]
    assert log.append(table_of([b"later"])).first_offset == end


def test_retention_max_bytes_deletes_oldest_until_under_limit(make_storage, table_of, clock,
                                                              data_dir):
    storage = make_storage(**SEGMENT)
    config = StreamConfig(max_age_ms=0, max_bytes=0, dedup_window_ms=0, max_message_bytes=1 << 20)
    log = storage.open_log("sized", config)
    fill(log, table_of, clock, 30)
    directory = data_dir / "streams" / "sized"
    sizes = {int(p.stem): p.stat().st_size for p in directory.glob("*.log")}
    total = sum(sizes.values())
    limit = total - sizes[min(sizes)] - 1  # forces exactly the two oldest segments out
    log.update_config(StreamConfig(max_age_ms=0, max_bytes=limit, dedup_window_ms=0,
                                   max_message_bytes=1 << 20))
    storage.enforce_retention()
    remaining = bases(data_dir, "sized")
    ordered = sorted(sizes)
    assert remaining == ordered[2:]
    assert log.stats().bytes_on_disk <= limit
    assert log.start_offset == ordered[2]
    tiny = StreamConfig(max_age_ms=0, max_bytes=1, dedup_window_ms=0, max_message_bytes=1 << 20)
    log.update_config(tiny)
    storage.enforce_retention()
    assert bases(data_dir, "sized") == [ordered[-1]]  # the active segment always stays
    assert log.end_offset == 60


def test_retention_covers_streams_not_open(make_storage, table_of, clock, data_dir):
    config = StreamConfig(max_age_ms=30_000, max_bytes=0, dedup_window_ms=0,
                          max_message_bytes=1 << 20)
    storage = make_storage(**SEGMENT)
    for name in ("idle-a", "idle-b"):
        fill(storage.open_log(name, config), table_of, clock, 12)
    assert len(bases(data_dir, "idle-a")) > 2
    storage.close()
    later = make_storage(**SEGMENT)  # a broker restart: nothing is open
    clock.advance(30_000)
    later.enforce_retention()
    assert later.open_streams() == []
    for name in ("idle-a", "idle-b"):
        assert bases(data_dir, name) == [24]  # all expired: only an empty segment at the end
    log = later.open_log("idle-a", config)
    assert log.start_offset == log.end_offset == 24


def test_retention_idle_stream_checked_again_only_when_due(make_storage, table_of, clock,
                                                           data_dir, monkeypatch):
    import npstream.broker.storage.storage as storage_module

    config = StreamConfig(max_age_ms=60_000, max_bytes=0, dedup_window_ms=0,
                          max_message_bytes=1 << 20)
    storage = make_storage(**SEGMENT)
    fill(storage.open_log("due", config), table_of, clock, 12)
    storage.close()
    calls = []
    real_check = storage_module.idle_stream_check
    monkeypatch.setattr(storage_module, "idle_stream_check",
                        lambda *args: calls.append(args[0].name) or real_check(*args))
    later = make_storage(**SEGMENT)
    later.enforce_retention()
    later.enforce_retention()
    assert calls == ["due"]  # second pass skipped: nothing can expire yet
    clock.advance(60_000)
    later.enforce_retention()
    assert calls[1:] and calls[1] == "due"
    assert len(bases(data_dir, "due")) < 12


def test_delete_before_moves_start_exactly_and_persists(make_storage, config, table_of, clock,
                                                        data_dir):
    storage = make_storage(**SEGMENT)
    log = storage.open_log("del", config)
    fill(log, table_of, clock, 20)
    segments = bases(data_dir, "del")
    target = segments[2] + 1  # inside the third segment
    log.delete_before(target)
    assert log.start_offset == target
    assert bases(data_dir, "del") == segments[2:]
    assert log.read_table(target, target + 2).column("value").to_pylist() == [
        f"v{target}".encode(), f"v{target + 1}".encode()]
    with pytest.raises(OffsetOutOfRangeError) as error:
        log.read(target - 1)
    assert (error.value.start_offset, error.value.end_offset) == (target, 40)
    log.delete_before(3)  # below start: no change
    assert log.start_offset == target
    with pytest.raises(OffsetOutOfRangeError):
        log.delete_before(41)
    storage.close()
    reopened = make_storage(**SEGMENT).open_log("del", config)
    assert (reopened.start_offset, reopened.end_offset) == (target, 40)


def test_delete_all_offsets_keep_growing_also_after_reopen(make_storage, config, table_of,
                                                           clock, data_dir):
    storage = make_storage(**SEGMENT)
    log = storage.open_log("all", config)
    fill(log, table_of, clock, 10)
    log.delete_all()
    assert (log.start_offset, log.end_offset) == (20, 20)
    assert log.stats().bytes_on_disk == 0
    assert log.read(20).count == 0
    storage.close()
    storage = make_storage(**SEGMENT)
    log = storage.open_log("all", config)
    assert (log.start_offset, log.end_offset) == (20, 20)  # empty log keeps its end offset
    assert log.append(table_of([b"x", b"y"])).first_offset == 20
    log.delete_all()
    log.delete_all()  # idempotent
    storage.close()
    log = make_storage(**SEGMENT).open_log("all", config)
    assert (log.start_offset, log.end_offset) == (22, 22)
    assert log.append(table_of([b"z"])).first_offset == 22
    assert log.read_table(22, 23).column("value").to_pylist() == [b"z"]


def test_delete_before_end_offset_equals_delete_all(make_storage, config, table_of, clock,
                                                    data_dir):
    log = make_storage(**SEGMENT).open_log("to-end", config)
    fill(log, table_of, clock, 3)
    log.delete_before(6)
    assert (log.start_offset, log.end_offset) == (6, 6)
    assert bases(data_dir, "to-end") == [6]
