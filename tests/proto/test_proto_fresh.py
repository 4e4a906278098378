"""The checked-in gRPC code must be what proto/generate.py produces from the .proto files."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from harness import REPO_ROOT

ROOT = REPO_ROOT


def _load_generator():
    spec = importlib.util.spec_from_file_location("proto_generate", ROOT / "proto/generate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_code_matches_proto_sources(tmp_path: Path) -> None:
    generator = _load_generator()
    generated = generator.generate(tmp_path)
    assert {p.name for p in generated} == {
        "npstream_pb2.py", "npstream_pb2.pyi", "npstream_pb2_grpc.py",
    }
    for path in generated:
        checked_in = ROOT / "proto/npstream/v1" / path.name
        assert checked_in.read_text() == path.read_text(), (
            f"{checked_in} is stale: run `make proto` (python proto/generate.py)"
        )


def test_generated_code_imports_under_npstream_proto() -> None:
    from npstream.proto import pb, pb_grpc

    assert pb.FetchRequest(stream="s", offset=3).offset == 3
    assert hasattr(pb_grpc, "StreamServiceStub")
    assert hasattr(pb_grpc, "GroupServiceStub")
    assert hasattr(pb_grpc, "SinkServiceStub")
