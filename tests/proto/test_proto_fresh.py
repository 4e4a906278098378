"""The checked-in gRPC code and docs/client.md's error table must be what proto/generate.py
produces from the .proto files."""

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


def test_generate_reason_table_matches_the_checked_in_docs() -> None:
    generator = _load_generator()
    doc = (ROOT / "docs/client.md").read_text()
    fresh = generator.with_reason_table(doc, generator.reason_table(generator.reason_comments()))
    assert doc == fresh, "docs/client.md's error table is stale: run `make proto`"


def test_generate_reason_table_changes_with_the_declaration() -> None:
    """The table is made from the declaration: another comment gives another row."""
    generator = _load_generator()
    comments = generator.reason_comments()
    assert comments["ERROR_REASON_STREAM_NOT_FOUND"] == "The named stream does not exist."
    comments["ERROR_REASON_STREAM_NOT_FOUND"] = "Gone."
    table = generator.reason_table(comments)
    assert ("| `STREAM_NOT_FOUND` | NOT_FOUND | `StreamNotFound` | `LookupError` | | Gone. |"
            in table.splitlines())


def test_generated_code_imports_under_npstream_proto() -> None:
    from npstream.proto import pb, pb_grpc

    assert pb.FetchRequest(stream="s", offset=3).offset == 3
    assert hasattr(pb_grpc, "StreamServiceStub")
    assert hasattr(pb_grpc, "GroupServiceStub")
    assert hasattr(pb_grpc, "SinkServiceStub")
