"""The checked-in generated docs must be what docs/generate.py makes from the tables."""

from __future__ import annotations

import dataclasses
import importlib.util
import tomllib
from types import ModuleType

import pytest

from harness import REPO_ROOT
from npstream.broker.server.config import KEYS, SECTIONS, default_config, load_config
from npstream.spark.options import READ_SPECS
from npstream.spark.source import NpstreamDataSource
from npstream.spark.writer_options import WRITE_SPECS


def _load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_generate", REPO_ROOT / "docs/generate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GENERATOR = _load_generator()


@pytest.mark.parametrize("path", sorted(GENERATOR.generated()), ids=lambda p: p.name)
def test_generated_docs_match_the_tables(path) -> None:
    expected = GENERATOR.generated()[path]
    assert path.read_text() == expected, (
        f"{path.relative_to(REPO_ROOT)} is stale: run `make docs` (python docs/generate.py)")


def test_generated_broker_toml_loads_as_the_builtin_defaults(tmp_path) -> None:
    path = tmp_path / "broker.toml"
    path.write_text(GENERATOR.broker_toml())
    document = tomllib.loads(path.read_text())
    assert list(document) == list(SECTIONS)
    assert [name for section in document.values() for name in section] == [k.name for k in KEYS]
    assert load_config(path, env={}) == default_config()


def test_generate_broker_key_table_changes_with_the_table(monkeypatch) -> None:
    """The rows and comments are made from the table: another description gives another row."""
    keys = tuple(dataclasses.replace(k, doc="how many `files` ([LRU](#lru))")
                 if k.name == "max_open_files" else k for k in KEYS)
    monkeypatch.setattr(GENERATOR, "KEYS", keys)
    assert ("| `max_open_files` | `256` | how many `files` ([LRU](#lru)) |"
            in GENERATOR.broker_key_table("storage").splitlines())
    assert "# how many files (LRU)\nmax_open_files = 256\n" in GENERATOR.broker_toml()


def test_generate_refuses_a_doc_without_its_markers() -> None:
    with pytest.raises(ValueError, match=r"\[server\] keys"):
        GENERATOR.with_generated("no markers here", "[server] keys", "KEYS", "| row |")


def test_generate_spark_option_docs_change_with_the_table(monkeypatch) -> None:
    """docs/spark.md's rows and the docstring's entries are made from the option table."""
    specs = tuple(dataclasses.replace(s, doc="how **many** `bytes` ([Fetch](#fetch))")
                  if s.name == "fetchMaxBytes" else s for s in READ_SPECS)
    monkeypatch.setattr(GENERATOR, "READ_SPECS", specs)
    rows = GENERATOR.read_option_table("Everything else").splitlines()
    assert ("| `fetchMaxBytes` | `8MiB` | `1MiB`, `16MiB` | "
            "how **many** `bytes` ([Fetch](#fetch)) |") in rows
    entry = GENERATOR.docstring_entry(next(s for s in specs if s.name == "fetchMaxBytes"))
    assert entry == '    fetchMaxBytes : str, default "8MiB"\n        How many bytes (Fetch).'


def test_generated_option_lists_are_in_the_datasource_docstring() -> None:
    doc = NpstreamDataSource.__doc__ or ""
    for spec in (READ_SPECS[0], WRITE_SPECS[-1]):
        assert GENERATOR.docstring_entry(spec) in doc, spec.name


def test_generated_write_table_tells_where_each_option_applies() -> None:
    rows = {line.split(" | ")[0]: line.split(" | ")[2]
            for line in GENERATOR.write_option_table().splitlines()[2:]}
    assert rows["| `sinkId`"] == "streaming" and rows["| `stageBytes`"] == "both"
