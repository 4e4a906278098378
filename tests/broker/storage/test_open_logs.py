"""The LRU of open logs (open_logs.py) and stats read without opening (peek.py)."""

from __future__ import annotations

import gc
import weakref

from npstream.broker.storage import AckMode
from npstream.broker.storage.files import segment_path, stream_dir
from npstream.broker.storage.peek import peek_stats


def test_an_evicted_log_is_freed_at_once_and_reopened_from_its_files(make_storage, config,
                                                                      table_of):
    storage = make_storage(max_open_logs=2)
    first = storage.open_log("a", config)
    first.append(table_of([b"a0", b"a1"]))
    gone = weakref.ref(first)
    del first
    storage.open_log("b", config)
    storage.open_log("c", config)  # "a" leaves the LRU: nothing holds it any more
    gc.disable()  # freed by reference counting, not by a later collection
    try:
        assert gone() is None
    finally:
        gc.enable()
    assert storage.open_streams() == ["b", "c"]
    again = storage.open_log("a", config)
    assert (again.start_offset, again.end_offset) == (0, 2)
    assert again.read_table(0, 2).column("value").to_pylist() == [b"a0", b"a1"]
    assert again.append(table_of([b"a2"])).first_offset == 2


def test_a_log_in_use_stays_the_one_log_of_its_stream(make_storage, config, table_of):
    storage = make_storage(max_open_logs=1)
    held = storage.open_log("held", config)
    storage.open_log("other", config)  # evicts "held" from the LRU; the test still uses it
    assert "held" in storage.open_streams()
    assert storage.open_log("held", config) is held  # never a second log of one stream
    held.append(table_of([b"x"]), AckMode.WRITE)
    assert storage.open_log("held", config).end_offset == 1


def test_peek_gives_the_stats_of_an_opened_log_or_none(make_storage, config, table_of,
                                                       data_dir):
    storage = make_storage()
    log = storage.open_log("p", config)
    directory = stream_dir(data_dir, "p")
    assert peek_stats(directory) == log.stats()  # never written
    for size in (1, 3, 2):
        log.append(table_of([b"v" * size] * size))
    log.delete_before(2)
    assert peek_stats(directory) == log.stats()
    log.delete_all()
    assert peek_stats(directory) == log.stats()
    log.append(table_of([b"w"]))
    assert peek_stats(directory) == log.stats()
    with open(segment_path(directory, log.stats().start_offset), "ab") as segment:
        segment.write(b"torn")  # only recovery may judge this tail
    assert peek_stats(directory) is None
