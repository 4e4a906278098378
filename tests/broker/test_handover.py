"""Handover records (broker/handover.py): plain JSON values, versioned, refused when unknown."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from npstream.broker.errors import InvalidArgumentError
from npstream.broker.handover import (
    StateRecord,
    check_version,
    decode_bytes,
    decode_records,
    encode_bytes,
    encode_records,
    install_stream,
)
from npstream.broker.metadata import Metadata


class _Owner:
    """An owner of one kind keeping its records in a table of its own."""

    kinds = ("test.item",)

    def __init__(self, metadata: Metadata) -> None:
        metadata.execute("CREATE TABLE IF NOT EXISTS items (stream TEXT, body TEXT)")
        self.metadata = metadata

    def export(self, stream: str, /) -> list[StateRecord]:
        return [StateRecord("test.item", 1, json.loads(body)) for (body,) in
                self.metadata.execute_tuples("SELECT body FROM items WHERE stream = ?", (stream,))]

    def install(self, stream: str, records: Sequence[StateRecord], txn: Metadata, /) -> None:
        for record in records:
            check_version(record, 1)
            txn.execute("INSERT INTO items VALUES (?, ?)", (stream, json.dumps(record.body)))

    def drop(self, stream: str, txn: Metadata, /) -> None:
        txn.execute("DELETE FROM items WHERE stream = ?", (stream,))


def test_records_through_json_text_come_back_equal() -> None:
    records = [StateRecord("group", 1, {"group": "g", "committed_offset": 7}),
               StateRecord("stream.schema", 2, {"arrow_schema": encode_bytes(b"\x00\xff")})]

    text = json.dumps(encode_records(records))

    assert decode_records(json.loads(text)) == records
    assert decode_bytes(decode_records(json.loads(text))[1].body["arrow_schema"]) == b"\x00\xff"


@pytest.mark.parametrize(("value", "message"), [
    ({"version": 1, "body": {}}, "without a kind"),
    ({"kind": "group", "version": 0, "body": {}}, "record 'group' has version 0"),
    ({"kind": "group", "version": 1}, "record 'group' has no body object"),
    ("group", "is a JSON object"),
])
def test_decode_malformed_record_is_refused_naming_it(value: object, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        decode_records([value])


def test_install_newer_version_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    metadata = Metadata(tmp_path)
    owner = _Owner(metadata)

    with pytest.raises(InvalidArgumentError, match="'test.item' version 2 is newer than this "
                       r"broker reads \(up to 1\)"), metadata.transaction() as txn:
        install_stream([owner], "s", [StateRecord("test.item", 1, {"a": 1}),
                                      StateRecord("test.item", 2, {"a": 2})], txn)

    assert owner.export("s") == []


def test_install_unknown_kind_is_refused_before_any_write(tmp_path: Path) -> None:
    metadata = Metadata(tmp_path)
    owner = _Owner(metadata)
    with metadata.transaction() as txn:
        install_stream([owner], "s", [StateRecord("test.item", 1, {"a": 1})], txn)

    with pytest.raises(InvalidArgumentError, match=r"kind\(s\) sink.cursor are unknown to this "
                       r"broker \(it takes test.item\)"), metadata.transaction() as txn:
        install_stream([owner], "s", [StateRecord("sink.cursor", 1, {})], txn)

    assert owner.export("s") == [StateRecord("test.item", 1, {"a": 1})]


def test_install_replaces_what_the_stream_held(tmp_path: Path) -> None:
    metadata = Metadata(tmp_path)
    owner = _Owner(metadata)
    with metadata.transaction() as txn:
        install_stream([owner], "s", [StateRecord("test.item", 1, {"a": 1})], txn)

    with metadata.transaction() as txn:
        install_stream([owner], "s", [StateRecord("test.item", 1, {"b": 2})], txn)

    assert owner.export("s") == [StateRecord("test.item", 1, {"b": 2})]
