"""Concurrent appends (group commit), wait_for_data, append listeners."""

from __future__ import annotations

import threading
import time

from npstream.broker.storage import AckMode


def run_threads(count: int, target) -> None:
    threads = [threading.Thread(target=target, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
        assert not thread.is_alive()


def test_append_many_threads_offsets_dense_nothing_lost(make_storage, config, table_of,
                                                        frames_of, segments_in, data_dir):
    storage = make_storage(segment_bytes=64 * 1024)
    log = storage.open_log("busy", config)
    results: dict[tuple[int, int], tuple[int, int]] = {}
    errors: list[BaseException] = []

    def publish(thread: int) -> None:
        try:
            for round_ in range(25):
                rows = round_ % 4 + 1
                ack = AckMode.FSYNC if round_ % 2 else AckMode.WRITE
                result = log.append(
                    table_of([f"t{thread}-r{round_}-{i}".encode() for i in range(rows)]), ack=ack)
                assert result.stored_count == rows
                results[(thread, round_)] = (result.first_offset, rows)
        except BaseException as exc:  # reported below
            errors.append(exc)

    run_threads(12, publish)
    assert errors == []
    total = sum(rows for _, rows in results.values())
    assert log.end_offset == total == 12 * sum(r % 4 + 1 for r in range(25))
    table = log.read_table(0, total)
    assert table.column("offset").to_pylist() == list(range(total))
    values = table.column("value").to_pylist()
    for (thread, round_), (first, rows) in results.items():
        assert values[first : first + rows] == [
            f"t{thread}-r{round_}-{i}".encode() for i in range(rows)]
    ids = table.column("id").to_pylist()
    assert len(set(ids)) == total and all(len(i) == 32 for i in ids)
    frames = sum(len(frames_of(path)) for path in segments_in(data_dir / "streams" / "busy"))
    assert frames <= len(results)  # concurrent appends share frames (group commit)


def test_append_concurrent_small_appends_coalesce_into_fewer_frames(
        make_storage, config, table_of, frames_of, segments_in, data_dir):
    fsyncs: list[int] = []
    first_fsync_started = threading.Event()
    log = None

    def slow_first_fsync(operation, path, position):
        if operation == "fsync":
            fsyncs.append(position)
            if len(fsyncs) == 1:  # hold the first fsync until all 20 appends queued behind it
                first_fsync_started.set()
                deadline = time.monotonic() + 30
                while log._appender._queue.pending() < 21 and time.monotonic() < deadline:
                    time.sleep(0.005)

    log = make_storage(fault_hook=slow_first_fsync).open_log("coalesce", config)
    first = threading.Thread(target=log.append, args=(table_of([b"first"]),))
    first.start()
    assert first_fsync_started.wait(10)
    run_threads(20, lambda index: log.append(table_of([f"c{index}".encode()])))
    first.join(10)
    frames = frames_of(segments_in(data_dir / "streams" / "coalesce")[0])
    assert log.end_offset == 21
    # the first append, then the 20 that arrived during its fsync: one batch, one fsync
    assert [header.count for _, header in frames] == [1, 20]
    assert len(fsyncs) == 2
    assert sorted(log.read_table(1, 21).column("value").to_pylist()) == sorted(
        f"c{i}".encode() for i in range(20))


def test_wait_for_data_wakes_on_append(make_storage, config, table_of):
    log = make_storage().open_log("wait", config)
    log.append(table_of(2))
    assert log.wait_for_data(1, 0.0) is True
    assert log.wait_for_data(2, 0.05) is False
    waiting = threading.Event()
    outcome: list[tuple[bool, float]] = []

    def waiter(_index: int) -> None:
        waiting.set()
        woke = log.wait_for_data(2, 30.0)
        outcome.append((woke, time.monotonic()))

    thread = threading.Thread(target=waiter, args=(0,))
    thread.start()
    assert waiting.wait(10)
    time.sleep(0.1)
    appended_at = time.monotonic()
    log.append(table_of(1), ack=AckMode.WRITE)
    thread.join(10)
    assert len(outcome) == 1
    woke, woke_at = outcome[0]
    assert woke is True
    assert 0 <= woke_at - appended_at < 2.0  # woken by the append, long before the 30 s timeout


def test_append_listener_runs_once_data_is_visible_until_removed(make_storage, config, table_of):
    log = make_storage().open_log("listen", config)
    seen: list[int] = []

    def listener() -> None:
        seen.append(log.end_offset)  # the new data is already readable here

    def broken() -> None:
        raise RuntimeError("listener bug")

    log.add_append_listener(broken)  # logged; never fails the write
    log.add_append_listener(listener)
    log.append(table_of(2))
    log.append(table_of(3))
    assert seen == [2, 5]
    log.delete_before(4)
    assert seen == [2, 5, 5]  # deletions change the view too
    log.remove_append_listener(listener)
    log.append(table_of(1))
    assert seen == [2, 5, 5]
    assert log.end_offset == 6


def test_lone_messages_alone_and_grouped_with_others_store_every_row(make_storage, config,
                                                                     table_of, clock):
    """Client.publish's one-value appends: written from a template when alone in a commit
    group, as rows when grouped with other appends; the stored rows are the same."""
    from npstream.broker.storage.small_append import MessageRows

    log = make_storage().open_log("lone", config)
    expected: dict[int, bytes] = {}
    lock = threading.Lock()
    errors: list[BaseException] = []

    def publish(thread: int) -> None:
        try:
            for round_ in range(30):
                value = f"t{thread}-r{round_}".encode() * (round_ % 3 + 1)
                if round_ % 5 == 4:  # a table append in between
                    result = log.append(table_of([value]), AckMode.WRITE)
                else:
                    result = log.append(MessageRows([value], [""], [None], [None]),
                                        AckMode.FSYNC if round_ % 2 else AckMode.WRITE)
                assert result.stored_count == 1
                with lock:
                    expected[result.first_offset] = value
        except BaseException as exc:  # reported below
            errors.append(exc)

    run_threads(8, publish)
    assert errors == []
    assert sorted(expected) == list(range(240))
    table = log.read_table(0, 240)
    assert table.column("offset").to_pylist() == list(range(240))
    assert table.column("value").to_pylist() == [expected[o] for o in range(240)]
    ids = table.column("id").to_pylist()
    assert [int(i[16:], 16) for i in ids] == list(range(240))  # generated: prefix + offset
    assert len({i[:16] for i in ids}) == 1
    assert set(table.column("key").to_pylist()) == {None}
    assert set(table.column("headers").to_pylist()) == {None}
    assert {t.timestamp() * 1000 for t in table.column("timestamp").to_pylist()} == {clock.now}
