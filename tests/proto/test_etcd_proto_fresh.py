"""The checked-in etcd stubs (broker/cluster/etcd/pb) must be what proto/generate_etcd.py
produces from the checked-in protos, and those must have nothing left to strip."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from harness import REPO_ROOT


def _load_generator():
    spec = importlib.util.spec_from_file_location("generate_etcd",
                                                  REPO_ROOT / "proto/generate_etcd.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_etcd_code_matches_the_checked_in_protos(tmp_path: Path) -> None:
    generator = _load_generator()
    generated = generator.generate(tmp_path)
    assert {str(p.relative_to(tmp_path)) for p in generated} == {
        f"{package}/{name}{suffix}"
        for package, name in (("etcdserverpb", "rpc"), ("mvccpb", "kv"), ("authpb", "auth"))
        for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")}
    for path in generated:
        checked_in = generator.PB_ROOT / path.relative_to(tmp_path)
        assert checked_in.read_text() == path.read_text(), (
            f"{checked_in} is stale: run `make proto` (python proto/generate_etcd.py)")


def test_checked_in_etcd_protos_are_stripped_and_name_their_origin() -> None:
    generator = _load_generator()
    for source, target in generator.SOURCES.items():
        text = (generator.PB_ROOT / target).read_text()
        header, body = text.split("\n\n", 1)
        assert f"From etcd (https://github.com/etcd-io/etcd), {source} at commit" in header
        assert "Apache License, Version 2.0" in header
        assert generator.strip(body) == body
        for gone in ("gogoproto", "google.api", "versionpb", "openapiv2"):
            assert gone not in body


def test_strip_removes_annotations_and_keeps_fields() -> None:
    generator = _load_generator()
    text = ('import "etcd/api/mvccpb/kv.proto";\nimport "gogoproto/gogo.proto";\n'
            'service KV {\n  rpc Range(A) returns (B) {\n      option (google.api.http) = {\n'
            '        post: "/v3/kv/range"\n        body: "*"\n    };\n  }\n}\n'
            'message A {\n  option (versionpb.etcd_version_msg) = "3.0";\n'
            '  int64 min_mod_revision = 10 [(versionpb.etcd_version_field)="3.1"];\n}\n')
    assert generator.strip(text) == (
        'import "mvccpb/kv.proto";\nservice KV {\n  rpc Range(A) returns (B) {\n  }\n}\n'
        'message A {\n  int64 min_mod_revision = 10;\n}\n')
