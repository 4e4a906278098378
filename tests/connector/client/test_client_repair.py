"""A stream corrupted mid-log: StreamNeedsRepair from the SDK, then `npstream streams repair`."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from npstream import Client, StreamNeedsRepair


def test_corrupted_stream_raises_needs_repair_until_cli_repair_cuts_it(broker_factory):
    broker = broker_factory()
    with Client(broker.address) as client:
        for i in range(3):  # three stored batches: the first one will be damaged
            client.publish_batch("s", [{"value": f"batch {i} row {j}"} for j in range(20)])
    broker.stop()
    (segment,) = sorted((broker.data_dir / "streams" / "s").glob("*.log"))
    data = bytearray(segment.read_bytes())
    data[100] ^= 0xFF  # inside the first frame, far from the tail
    segment.write_bytes(bytes(data))
    broker.start()

    with Client(broker.address) as client:
        info = client.stream_info("s")
        assert info.error.startswith(f"stream 's' cannot be opened: corrupt record in {segment}")
        with pytest.raises(StreamNeedsRepair) as err:
            client.fetch("s", 0)
        assert "run `npstream streams repair s`" in str(err.value)

        env = {**os.environ, "NPSTREAM_BROKER": broker.address}
        result = subprocess.run([sys.executable, "-m", "npstream.cli", "streams", "repair", "s"],
                                capture_output=True, text=True, env=env, timeout=60)
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith("repaired stream 's': cut ")
        assert result.stdout.endswith("offsets now [0, 0)\n")

        repaired = client.stream_info("s")
        assert (repaired.error, repaired.start_offset, repaired.end_offset) == ("", 0, 0)
        assert client.publish("s", "fresh").offset == 0
