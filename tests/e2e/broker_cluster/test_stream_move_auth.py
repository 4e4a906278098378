"""Moving a stream with auth on (issue 19): who may move, and the cluster's own token.

Without ``[cluster] cluster_token`` a move's steps carry the admin's token; with
it, members send them as the cluster (a token with no right on any stream), so
a move cut off by a restart of the old member finishes by itself, and the
dead-letter holder check is asked as the cluster too.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import grpc
import pyarrow as pa
import pytest

from cluster_members import held, move_raw, names_on, read_ids, start_members, wait_until
from harness import BrokerProcess, write_tokens_file
from npstream import Client, NpstreamError
from npstream.broker.cluster.placement import rendezvous_owner
from npstream.broker.faults import FAULT_EXIT_CODE, MOVE_FAULT_ENV

pytestmark = pytest.mark.slow

MESSAGES = 40


def name_on(members: list[BrokerProcess], broker: BrokerProcess, prefix: str) -> str:
    return names_on(broker.address, [b.address for b in members], prefix)[0]


ADMIN_TOKEN, READ_TOKEN = "move-admin-51c2", "move-reader-88e0"


def test_with_auth_a_move_needs_the_admin_right_and_forwards_the_token(tmp_path):
    tokens = write_tokens_file(tmp_path / "tokens.toml", ADMIN_TOKEN, READ_TOKEN, "*",
                               writable="*")
    brokers = start_members(tmp_path, ["a", "b"], args=tokens)
    try:
        source, target = brokers
        stream = name_on(brokers, source, "auth")
        with Client(target.address, READ_TOKEN) as reader:
            reader.publish_batch(stream, [{"value": b"x", "id": f"a{i}"} for i in range(3)])
            with pytest.raises(NpstreamError, match="lacks the 'admin' right"):
                reader.move_stream(stream, target.address)
        assert stream in held(source, ADMIN_TOKEN)
        with Client(target.address, ADMIN_TOKEN) as admin:
            assert admin.move_stream(stream, target.address).end_offset == 3
            assert read_ids(admin, stream) == ["a0", "a1", "a2"]
        assert stream in held(target, ADMIN_TOKEN)
        assert stream not in held(source, ADMIN_TOKEN)
    finally:
        for broker in brokers:
            broker.stop()


CLUSTER_TOKEN = "members-only-7d3a"


def receiving_some(receiving: Path) -> bool:
    """Whether the target has received bytes of a move (the source is copying)."""
    try:
        return any(f.stat().st_size > 0 for f in receiving.rglob("*") if f.is_file())
    except OSError:
        return False
# How the source dies mid-move: at a fault point (os._exit, what kill -9 leaves),
# or SIGKILL from outside while the target receives the files of a 20 MB stream.
AUTH_KILLS = ["copied", "switching", "sigkill-while-copying"]


@pytest.mark.parametrize("how", AUTH_KILLS)
def test_with_auth_and_a_cluster_token_an_interrupted_move_finishes_by_itself(tmp_path, how):
    """The source restarts knowing nobody's token and finishes the move as the cluster."""
    tokens = write_tokens_file(tmp_path / "tokens.toml", ADMIN_TOKEN, READ_TOKEN, "*",
                               writable="*")
    brokers = start_members(tmp_path, ["a", "b"], args=tokens,
                            env={"NPSTREAM_CLUSTER_TOKEN": CLUSTER_TOKEN})
    try:
        source, target = brokers
        stream = name_on(brokers, source, f"mva{uuid.uuid4().hex[:6]}")
        sink_id = f"sink-{stream}"
        count = 20_000 if how.startswith("sigkill") else MESSAGES - 5
        ids = [f"m{i}" for i in range(count)]
        with Client(source.address, ADMIN_TOKEN) as admin:
            admin.create_stream(stream, dedup_window="1h")
            for start in range(0, count, 5000):
                admin.publish_batch(stream, pa.table({
                    "value": [b"v" * (1000 if count > 1000 else 1)] * len(ids[start:start + 5000]),
                    "id": ids[start:start + 5000]}))
            cursor = admin.consumer(stream, "cursor")
            assert len(cursor.pull(15)) == 15
            cursor.commit()
            sink = admin.sink()
            staged = sink.stage(sink_id, 0, "s0", stream, pa.table({"value": [b"s"], "id": ["s0"]}))
            sink.commit_all(sink_id, 0, {b: ["s0"] for b in staged.brokers})
        ids.append("s0")
        # The cluster's token has no right on any stream, and cannot move one.
        with Client(source.address, CLUSTER_TOKEN, retry_deadline=5) as member:
            with pytest.raises(NpstreamError, match="lacks the 'read' right"):
                member.fetch(stream, 0)
            with pytest.raises(NpstreamError, match="lacks the 'admin' right"):
                member.move_stream(stream, target.address)
        if how.startswith("sigkill"):
            receiving = target.data_dir / "moves-in"
            mover = threading.Thread(target=move_raw, args=(
                source, stream, target.address, ADMIN_TOKEN))
            mover.start()
            deadline = time.monotonic() + 30
            while not receiving_some(receiving) and time.monotonic() < deadline:
                time.sleep(0.002)
            source.kill()  # the log's "resuming the move" below shows it was mid-move
            mover.join(60)
        else:
            source.extra_env[MOVE_FAULT_ENV] = how
            source.restart()
            assert move_raw(source, stream, target.address, ADMIN_TOKEN) != grpc.StatusCode.OK
            assert source.proc is not None and source.proc.wait(30) == FAULT_EXIT_CODE
            source.extra_env.pop(MOVE_FAULT_ENV)
        source.start()
        # Nobody runs the move again: the source resumes it with the cluster's token.
        wait_until(lambda: stream in held(target, ADMIN_TOKEN)
                   and stream not in held(source, ADMIN_TOKEN), 90)
        assert not (source.data_dir / "streams" / stream).exists()
        with Client(source.address, ADMIN_TOKEN) as admin:
            assert read_ids(admin, stream) == ids  # nothing lost, nothing twice, in order
            assert admin.describe_group(stream, "cursor").committed_offset == 15
            assert admin.publish(stream, b"again", id="m7").duplicate
        assert "resuming the move" in source.log_text()
        assert CLUSTER_TOKEN not in source.log_text() + target.log_text()
    finally:
        for broker in brokers:
            broker.stop()


def test_with_a_cluster_token_a_dead_letter_stream_another_member_holds_is_not_created_twice(
        tmp_path):
    """The upkeep thread has no caller: it asks the other members as the cluster."""
    tokens = write_tokens_file(tmp_path / "tokens.toml", ADMIN_TOKEN, READ_TOKEN, "*",
                               writable="*")
    brokers = start_members(tmp_path, ["a", "b"], args=tokens,
                            env={"NPSTREAM_CLUSTER_TOKEN": CLUSTER_TOKEN})
    try:
        source, target = brokers
        addresses = [b.address for b in brokers]
        tag = uuid.uuid4().hex[:6]
        stream = next(name for name in (f"mva{tag}-{i}" for i in range(1000))
                      if rendezvous_owner(name, addresses) == source.address
                      and rendezvous_owner(f"{name}.dlq", addresses) == target.address)
        dlq = f"{stream}.dlq"
        with Client(source.address, ADMIN_TOKEN) as client:
            client.create_stream(dlq)  # placed on the target
            client.publish(stream, b"x", id="e0")
            (lease,) = client.receive(stream, "g", 1, max_deliver=1, ack_wait=30)
            lease.nack()
            wait_until(lambda: "is held by cluster member" in source.log_text(), 10)
            assert dlq not in held(source, ADMIN_TOKEN) and dlq in held(target, ADMIN_TOKEN)
    finally:
        for broker in brokers:
            broker.stop()
