"""SourceOffset: the {stream: next_offset} value Spark checkpoints (no broker, no Spark)."""

from __future__ import annotations

import json
import pickle

import pytest

from npstream.spark.offsets import SourceOffset


def test_offset_json_round_trip_is_flat_and_sorted():
    offset = SourceOffset({"orders": 42, "clicks": 7})
    assert offset.to_json() == '{"clicks":7,"orders":42}'
    assert SourceOffset.from_json(offset.to_json()) == offset
    assert json.loads(offset.to_json()) == {"orders": 42, "clicks": 7}


def test_offset_from_dict_matches_what_spark_hands_back():
    offset = SourceOffset.from_dict({"a": 0, "b": 10})
    assert offset.to_dict() == {"a": 0, "b": 10}
    assert offset.get("b") == 10 and offset.get("c") is None and offset.get("c", 0) == 0
    assert offset.streams == frozenset({"a", "b"})
    assert "a" in offset and "c" not in offset and len(offset) == 2


def test_offset_is_immutable_hashable_and_picklable():
    offset = SourceOffset({"a": 1})
    with pytest.raises(TypeError):
        offset.next_offsets["a"] = 2  # type: ignore[index]
    assert hash(offset) == hash(SourceOffset({"a": 1}))
    assert pickle.loads(pickle.dumps(offset)) == offset


def test_offset_source_dict_changes_do_not_leak_in():
    source = {"a": 1}
    offset = SourceOffset(source)
    source["a"] = 99
    assert offset.get("a") == 1


@pytest.mark.parametrize("bad,reason", [
    ({"a": -1}, "invalid offset -1 for stream 'a'"),
    ({"a": "3"}, "invalid offset '3' for stream 'a'"),
    ({"a": True}, "invalid offset True for stream 'a'"),
    ({"../x": 1}, "invalid stream name '../x'"),
])
def test_offset_rejects_bad_entries(bad, reason):
    with pytest.raises(ValueError, match=reason.replace("(", r"\(").replace(".", r"\.")):
        SourceOffset.from_dict(bad)


def test_offset_from_json_rejects_malformed_text():
    with pytest.raises(ValueError, match="invalid npstream offset JSON"):
        SourceOffset.from_json("{oops")
    with pytest.raises(ValueError, match="expected a JSON object"):
        SourceOffset.from_json("[1, 2]")
