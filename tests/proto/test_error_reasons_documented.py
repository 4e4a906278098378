"""Every ErrorReason is documented where clients look: the proto header and docs/client.md."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from npstream.proto import metadata_keys, pb

ROOT = Path(__file__).resolve().parents[2]
PROTO = ROOT / "proto" / "npstream" / "v1" / "npstream.proto"
CLIENT_DOC = ROOT / "docs" / "client.md"
PREFIX = "ERROR_REASON_"
REASONS = [pb.ErrorReason.Name(value) for value in pb.ErrorReason.values()
           if value != pb.ERROR_REASON_UNSPECIFIED]


def _header_rows() -> dict[str, tuple[str, str]]:
    """The proto header's table: reason (without prefix) -> (status code, client class)."""
    header = PROTO.read_text().split("syntax =", 1)[0]
    rows: dict[str, tuple[str, str]] = {}
    for line in header.splitlines():
        match = re.fullmatch(r"//\s+([A-Z_]+)\s+([A-Z_]+)\s+(\w+).*", line)
        if match:
            rows[match.group(1)] = (match.group(2), match.group(3))
    return rows


def _doc_rows() -> dict[str, tuple[str, str]]:
    """docs/client.md's table: reason -> (status code, exception)."""
    rows: dict[str, tuple[str, str]] = {}
    for line in CLIENT_DOC.read_text().splitlines():
        match = re.match(r"\| `([A-Z_]+)` \| ([A-Z_]+) \| `(\w+)`", line)
        if match:
            rows[match.group(1)] = (match.group(2), match.group(3))
    return rows


@pytest.mark.parametrize("name", REASONS)
def test_reason_is_in_the_proto_header_and_client_docs(name: str) -> None:
    short = name.removeprefix(PREFIX)
    header, doc = _header_rows(), _doc_rows()
    assert short in header, f"{name} missing from the table in {PROTO.name}'s header"
    assert short in doc, f"{name} missing from the Errors table of docs/client.md"
    assert header[short] == doc[short]


def test_tables_list_no_reason_the_proto_lacks() -> None:
    known = {name.removeprefix(PREFIX) for name in REASONS}
    assert set(_header_rows()) == known
    assert set(_doc_rows()) == known


def test_the_reason_metadata_key_is_the_documented_one() -> None:
    assert metadata_keys.REASON == "x-npstream-reason"
    assert metadata_keys.REASON in PROTO.read_text()
    assert metadata_keys.REASON in CLIENT_DOC.read_text()
