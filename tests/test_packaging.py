"""Packaging and layering: the wheel holds exactly the packages, `import npstream` stays light."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
import zipfile

import pytest

from harness import REPO_ROOT, build_wheel

PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())


def _package_dirs() -> set[str]:
    """Every folder with an __init__.py under the three package roots, as import names."""
    roots = {"connector": "npstream", "broker": "npstream.broker", "proto": "npstream.proto"}
    found = set()
    for folder, name in roots.items():
        for init in (REPO_ROOT / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(REPO_ROOT / folder)
            found.add(".".join([name, *relative.parts]))
    return found


def test_pyproject_lists_every_package_folder():
    assert set(PYPROJECT["tool"]["setuptools"]["packages"]) == _package_dirs()


@pytest.mark.slow
def test_wheel_holds_exactly_the_packages_and_builds_without_setuptools_warnings(tmp_path):
    wheel, output = build_wheel(tmp_path)

    names = zipfile.ZipFile(wheel).namelist()
    code = [n for n in names if ".dist-info/" not in n]
    packages = {n.rsplit("/", 1)[0].replace("/", ".") for n in code if n.endswith("/__init__.py")}
    assert packages == set(PYPROJECT["tool"]["setuptools"]["packages"])
    top_level = {n.split("/", 1)[0] for n in code}
    assert top_level == {"npstream", "pyspark_npstream.py"}
    assert not [n for n in code if not n.endswith((".py", ".pyi", ".proto"))
                and not n.startswith(("npstream/broker/console/static/",
                                      "npstream/broker/kafka/schemas/"))]
    # the web console's files are package data the broker serves
    static = "npstream/broker/console/static/"
    assert {static + name for name in ("index.html", "console.js", "console.css")} <= set(code)
    # Kafka's message schemas drive the Kafka codec
    assert "npstream/broker/kafka/schemas/FetchRequest.json" in code
    warnings = [line for line in output.splitlines()
                if re.search(r"(?i)setuptools.*warning|deprecat|BuildBackendWarning", line)]
    assert warnings == []


def test_import_npstream_loads_no_broker_code():
    probe = ("import sys, npstream; from npstream import Client; "
             "print(sorted(m for m in sys.modules if m.startswith('npstream.broker')))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            check=True, timeout=60)
    assert result.stdout.strip() == "[]"
