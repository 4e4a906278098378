"""SharedGroup against a model, in-process: random receives, acks, nacks and expiries.

What a member relies on, checked after every step: each delivered row is the
message stored at its offset (redeliveries are cut out of kept reads and
gathered from several stored batches, so a wrong index would hand out another
message), the attempt number counts its deliveries, and with ordering="key"
a message is leased only when every earlier message of its key is finished.
At the end every message is acked once and the committed offset is the end.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from unittest import mock

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from npstream.broker.groups import log_rows
from npstream.broker.groups.shared import SharedGroup
from npstream.broker.groups.shared_config import SharedConfig
from npstream.broker.groups.store import GroupStore, PositionWriter
from npstream.broker.metadata import Metadata
from npstream.broker.storage import AckMode, Storage, StorageSettings, StreamConfig
from npstream.proto.schema import normalize_publish_table

ACK_WAIT_MS = 1_000
MEMBERS = ("m1", "m2", "m3")


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


def _publish(stream_log, keys: list[bytes | None], sizes: list[int]) -> None:
    """Messages whose value names their offset, in stored batches of the given sizes."""
    offset = 0
    for size in sizes:
        part = keys[offset:offset + size]
        if not part:
            break
        stream_log.append(normalize_publish_table(pa.table({
            "key": pa.array(part, pa.binary()),
            "value": [b"v%d" % o for o in range(offset, offset + len(part))]})), AckMode.WRITE)
        offset += len(part)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_shared_group_hands_out_the_stored_rows_in_key_order(data):
    ordered = data.draw(st.booleans(), label="ordering=key")
    keys = data.draw(st.lists(st.one_of(st.none(), st.sampled_from([b"a", b"b", b"c", b"d"])),
                              min_size=1, max_size=60), label="keys")
    sizes = data.draw(st.lists(st.integers(1, 25), min_size=1, max_size=8), label="batches")
    sizes.append(len(keys))  # whatever is left, as one more stored batch
    chunk = data.draw(st.sampled_from([3, 7, 65_536]), label="rows per read")
    with tempfile.TemporaryDirectory() as tmp, \
            mock.patch.object(log_rows, "FRESH_READ_CHUNK", chunk):
        path = Path(tmp)
        storage = Storage(StorageSettings(data_dir=path))
        metadata = Metadata(path)
        writer = PositionWriter(GroupStore(metadata))
        stream_log = storage.open_log("s", StreamConfig(0, 0, 0, 1 << 20))
        clock = Clock()
        config = SharedConfig(ack_wait_ms=ACK_WAIT_MS, dead_letter_stream="s.dlq",
                              ordering="key" if ordered else "none")
        GroupStore(metadata).create("s", "g", "shared", 0, config)
        group = SharedGroup("s", "g", committed=0, dead_lettered=0, config=config,
                            log_source=lambda: stream_log, writer=writer, dead_letters=None,
                            clock=clock)
        try:
            _publish(stream_log, keys, sizes)
            _drive(data, group, clock, keys, ordered)
        finally:
            group.close(RuntimeError("test over"))  # type: ignore[arg-type]
            writer.close()
            metadata.close()
            storage.close()


def _drive(data, group: SharedGroup, clock: Clock, keys: list[bytes | None],
           ordered: bool) -> None:
    held: dict[str, set[int]] = {m: set() for m in MEMBERS}  # leased to each member, unsettled
    deliveries = [0] * len(keys)
    acked: set[int] = set()

    def receive(member: str, limit: int) -> None:
        if data.draw(st.booleans(), label="as one batch"):
            table = group.receive_batch(member, limit, 0, ACK_WAIT_MS)
            got = list(zip(table.column("offset").to_pylist(), table.column("key").to_pylist(),
                           table.column("value").to_pylist(),
                           table.column("attempt").to_pylist(), strict=True))
        else:
            got = [(g.row.offset, g.row.key, g.row.value, g.attempt)
                   for g in group.receive(member, limit, 0, ACK_WAIT_MS)]
        assert len(got) <= limit
        for offset, key, value, attempt in got:
            assert (key, value) == (keys[offset], b"v%d" % offset)  # the stored message
            assert offset not in acked and all(offset not in h for h in held.values())
            deliveries[offset] += 1
            assert attempt == deliveries[offset]
            if ordered and key is not None:  # every earlier message of its key is finished
                assert all(o in acked for o in range(offset) if keys[o] == key), (offset, key)
            held[member].add(offset)

    for _step in range(data.draw(st.integers(1, 25), label="steps")):
        member = data.draw(st.sampled_from(MEMBERS), label="member")
        action = data.draw(st.sampled_from(["receive", "receive", "ack", "nack", "expire"]))
        mine = sorted(held[member])
        if action == "receive":
            receive(member, data.draw(st.integers(1, 12), label="max"))
        elif action in ("ack", "nack") and mine:
            chosen = data.draw(st.lists(st.sampled_from(mine), unique=True, min_size=1),
                               label=action)
            if action == "ack":
                count = group.ack(chosen, member)[0]
                acked.update(chosen)
            else:
                count = group.nack(chosen, member, 0)
            assert count == len(chosen)
            held[member].difference_update(chosen)
        elif action == "expire":
            clock.now += ACK_WAIT_MS
            for leases in held.values():
                leases.clear()  # expired: redelivered to whoever receives next
    # Drain: whatever is left is delivered (again) and acked; nothing is lost.
    clock.now += ACK_WAIT_MS
    for leases in held.values():
        leases.clear()
    for _round in range(4 * len(keys) + 4):
        if len(acked) == len(keys):
            break
        clock.now += 60_000  # past any nack's backoff
        receive("m1", 10)
        group.ack(sorted(held["m1"]), "m1")
        acked.update(held["m1"])
        held["m1"].clear()
    assert len(acked) == len(keys)
    snap = group.snapshot()
    assert (snap.committed_offset, snap.pending, snap.in_flight) == (len(keys), 0, 0)
