"""``make test-fast`` leaves out every test that starts a process, found from its code:
the marks tests/conftest.py sets (tests/support/integration_marks.py), checked by
collecting small test modules with the suite's real conftest and fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

SUITE_CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"

FIXTURES = '''
def test_publish_with_broker(broker): pass
def test_publish_with_client(client): pass
def test_start_with_broker_factory(broker_factory): pass
def test_read_with_spark(spark): pass
def test_watch_with_etcd(etcd): pass
def test_name_and_certificates(stream_name, tls_files): pass
'''

HARNESS_IMPORT = '''
from harness import BrokerProcess

def test_anything_in_a_module_that_imports_the_harness(): pass
'''

HELPERS = '''
import json

def _run_tool():
    import subprocess
    return subprocess.run(["true"], check=True)

class _Job:
    def start(self):
        return _run_tool()

def test_job_that_runs_a_tool():
    _Job().start()

def test_json_round_trip():
    assert json.loads(json.dumps([1])) == [1]
'''


def collected(pytester: pytest.Pytester, marks: str) -> set[str]:
    result = pytester.runpytest("--collect-only", "-q", "-m", marks, "-p", "no:cacheprovider",
                                "--import-mode=importlib")
    return {line.split("::")[1] for line in result.outlines if "::" in line}


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(SUITE_CONFTEST.read_text())
    pytester.makepyfile(test_fixtures=FIXTURES, test_harness_import=HARNESS_IMPORT,
                        test_helpers=HELPERS)
    return pytester


def test_collect_process_starting_tests_are_marked_integration(suite: pytest.Pytester) -> None:
    assert collected(suite, "integration") == {
        "test_publish_with_broker", "test_publish_with_client",
        "test_start_with_broker_factory", "test_read_with_spark", "test_watch_with_etcd",
        "test_anything_in_a_module_that_imports_the_harness", "test_job_that_runs_a_tool"}


def test_collect_not_integration_keeps_only_the_unit_tests(suite: pytest.Pytester) -> None:
    assert collected(suite, "not integration") == {
        "test_name_and_certificates", "test_json_round_trip"}
