"""StorageSettings: its defaults are the documented ones, and bad values are refused at once."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from harness import REPO_ROOT
from npstream.broker.errors import InvalidArgumentError
from npstream.broker.storage import StorageSettings


def test_docs_format_md_lists_every_setting_with_its_default():
    text = (REPO_ROOT / "docs" / "format.md").read_text()
    table = text.split("## Settings (`[storage]`", 1)[1].split("\n\n", 2)[1]
    documented = dict(re.findall(r"^\| `(\w+)` \| (\S+)", table, re.MULTILINE))
    fields = {f.name: f.default for f in dataclasses.fields(StorageSettings)}
    assert set(documented) == set(fields)
    for name, default in fields.items():
        if name != "data_dir":
            assert documented[name] in (str(default), f'`"{default}"`'), name


def test_every_bad_setting_is_named_in_one_error():
    with pytest.raises(InvalidArgumentError) as error:
        StorageSettings(data_dir=Path("d"), segment_bytes=10, flush_interval_ms=0,
                        metadata_sync="sometimes")
    message = str(error.value)
    for part in ("segment_bytes=10", "flush_interval_ms=0", "metadata_sync='sometimes'"):
        assert part in message
    with pytest.raises(InvalidArgumentError, match="must be <= 4294967295"):
        StorageSettings(data_dir=Path("d"), segment_bytes=1 << 32)
