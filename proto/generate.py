"""Regenerate the Python gRPC code from proto/npstream/v1/*.proto.

Run from anywhere: ``python proto/generate.py`` (needs grpcio-tools, a dev
dependency). protoc writes imports as ``from npstream.v1 import ...``, which
would resolve against our own ``npstream`` package; they are rewritten to
``npstream.proto.npstream.v1`` so the generated code imports under the
collision-safe package name. ``tests/proto/test_proto_fresh.py`` fails when the
checked-in files differ from what this script produces.
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

PROTO_ROOT = Path(__file__).resolve().parent
PROTO_DIR = PROTO_ROOT / "npstream" / "v1"
_IMPORT = re.compile(r"^from npstream\.v1 import ", re.MULTILINE)


def generate(out_dir: Path) -> list[Path]:
    """Run protoc into out_dir and return the generated .py files (imports fixed)."""
    from grpc_tools import protoc

    protos = sorted(PROTO_DIR.glob("*.proto"))
    include = Path(protoc.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *[str(p.relative_to(PROTO_ROOT)) for p in protos],
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed: {' '.join(args)}")
    generated = sorted((out_dir / "npstream" / "v1").glob("*_pb2*.py*"))
    for path in generated:
        text = _IMPORT.sub("from npstream.proto.npstream.v1 import ", path.read_text())
        path.write_text(text)
    return generated


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        for path in generate(Path(tmp)):
            target = PROTO_DIR / path.name
            target.write_text(path.read_text())
            print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
