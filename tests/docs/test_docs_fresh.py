"""The checked-in generated docs must be what docs/generate.py makes from the tables."""

from __future__ import annotations

import dataclasses
import importlib.util
import tomllib
from types import ModuleType

import pytest

from harness import REPO_ROOT
from npstream.broker.server.config import KEYS, SECTIONS, default_config, load_config


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
