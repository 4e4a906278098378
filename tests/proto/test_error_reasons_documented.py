"""Every ErrorReason is declared once, in its (error) option, and documented from it.

docs/client.md's table is generated from the declaration (`make proto`;
tests/proto/test_proto_fresh.py checks it is fresh): it lists every reason once.
"""

from __future__ import annotations

import re
from pathlib import Path

import grpc
import pytest

from npstream.proto import metadata_keys, pb
from npstream.proto.error_reasons import PREFIX, SPECS, attribute_of

ROOT = Path(__file__).resolve().parents[2]
PROTO = ROOT / "proto" / "npstream" / "v1" / "npstream.proto"
CLIENT_DOC = ROOT / "docs" / "client.md"
REASONS = [pb.ErrorReason.Name(value) for value in pb.ErrorReason.values()
           if value != pb.ERROR_REASON_UNSPECIFIED]


def _doc_rows() -> dict[str, tuple[str, str]]:
    """docs/client.md's table: reason -> (status code, exception)."""
    rows: dict[str, tuple[str, str]] = {}
    for line in CLIENT_DOC.read_text().splitlines():
        match = re.match(r"\| `([A-Z_]+)` \| ([A-Z_]+) \| `(\w+)`", line)
        if match:
            assert match.group(1) not in rows, f"{match.group(1)} twice in docs/client.md"
            rows[match.group(1)] = (match.group(2), match.group(3))
    return rows


@pytest.mark.parametrize("name", REASONS)
def test_reason_declares_status_class_and_is_in_the_client_docs(name: str) -> None:
    spec = SPECS[pb.ErrorReason.Value(name)]
    assert spec.name == name and spec.short == name.removeprefix(PREFIX)
    assert grpc.StatusCode[spec.status].name == spec.status
    assert _doc_rows()[spec.short] == (spec.status, spec.client_class)


def test_docs_list_no_reason_the_proto_lacks() -> None:
    assert set(_doc_rows()) == {name.removeprefix(PREFIX) for name in REASONS}
    assert list(SPECS) == [pb.ErrorReason.Value(name) for name in REASONS]


def test_declared_trailing_keys_are_metadata_keys_with_attribute_names() -> None:
    declared = {key for spec in SPECS.values() for key in spec.trailing}
    assert declared == {metadata_keys.RETRY_AFTER_MS, metadata_keys.OWNER,
                        *metadata_keys.OFFSET_KEYS}
    assert attribute_of(metadata_keys.START_OFFSET) == "start_offset"
    assert attribute_of(metadata_keys.RETRY_AFTER_MS) == "retry_after_ms"


def test_the_reason_metadata_key_is_the_documented_one() -> None:
    assert metadata_keys.REASON == "x-npstream-reason"
    assert metadata_keys.REASON in PROTO.read_text()
    assert metadata_keys.REASON in CLIENT_DOC.read_text()
