"""A sink commit whose fsync fails is finished at the next start, never appended twice.

In-process broker (the fault is injected into one stream's segment files, which a
broker subprocess cannot offer); the client still talks to it over gRPC.
"""

from __future__ import annotations

import errno
from pathlib import Path

import pyarrow as pa
import pytest

from npstream import Client
from npstream.broker.server.config import default_config
from npstream.broker.server.process import BrokerServer
from npstream.errors import NpstreamError

SINK, STREAM = "disk-error-sink", "orders"


def start(data_dir: Path) -> BrokerServer:
    config = default_config().with_values(data_dir=data_dir, host="127.0.0.1", port=0,
                                          metrics_port=None)
    server = BrokerServer(config)
    server.start()
    return server


def ids(client: Client) -> list[str]:
    info = client.stream_info(STREAM)
    return client.fetch(STREAM, info.start_offset,
                        max_messages=10_000).column("id").to_pylist()


def test_commit_with_failed_fsync_is_finished_once_at_restart(tmp_path: Path) -> None:
    server = start(tmp_path / "data")
    try:
        with Client(server.address, retry_deadline=1.0) as client:
            client.publish_batch(STREAM, [{"value": b"pre", "id": "pre-0"}])
            sink = client.sink()
            sink.stage(SINK, 3, "3-0", STREAM,
                       pa.table({"value": [f"v{i}" for i in range(50)],
                                 "id": [f"id-{i}" for i in range(50)]}))
            stream_log = server.ctx.registry.get(STREAM)  # type: ignore[union-attr]
            segments = stream_log._store.files

            def failing_sync() -> None:
                raise OSError(errno.EIO, "injected fsync failure")

            segments.sync_tail = failing_sync  # the data is written, its fsync fails
            with pytest.raises(NpstreamError, match="injected fsync failure"):
                sink.commit(SINK, 3, ["3-0"])
            assert stream_log.failed
            # The rows are in the log (written, not known durable) and the marker stays.
            markers = server.ctx.metadata.execute(  # type: ignore[union-attr]
                "SELECT stream, first_offset, row_count, state FROM sink_markers")
            assert [tuple(row) for row in markers] == [(STREAM, 1, 50, "committing")]
            # A retried commit before the restart cannot know whether the rows are durable.
            with pytest.raises(NpstreamError, match="restart the broker"):
                sink.commit(SINK, 3, ["3-0"])
            del segments.sync_tail
    finally:
        server.stop()

    server = start(tmp_path / "data")
    try:
        with Client(server.address) as client:
            assert ids(client) == ["pre-0"] + [f"id-{i}" for i in range(50)]
            assert client.sink().commit(SINK, 3, ["3-0"]).already_committed
            assert client.sink().last_batch_id(SINK) == 3
            client.publish(STREAM, b"after", id="after-0")
            assert ids(client)[-1] == "after-0"
            assert len(ids(client)) == 52
    finally:
        server.stop()
