"""This process's host identity: the kernel's boot id, or $NPSTREAM_HOST_ID when set."""

from __future__ import annotations

import pytest

from npstream.proto.host_identity import BOOT_ID_PATH, HOST_ID_ENV, boot_id


@pytest.fixture
def fresh_identity(monkeypatch):
    """boot_id() is read once per process: forget it before and after the test."""
    monkeypatch.delenv(HOST_ID_ENV, raising=False)
    boot_id.cache_clear()
    yield monkeypatch
    boot_id.cache_clear()


def test_identity_is_the_kernels_boot_id_by_default(fresh_identity):
    assert boot_id() == BOOT_ID_PATH.read_text().strip()


@pytest.mark.parametrize("value, expected", [
    ("elsewhere", "elsewhere"),
    ("  node-7 ", "node-7"),
])
def test_environment_variable_replaces_the_boot_id(fresh_identity, value, expected):
    fresh_identity.setenv(HOST_ID_ENV, value)
    assert boot_id() == expected


def test_an_empty_environment_variable_is_ignored(fresh_identity):
    fresh_identity.setenv(HOST_ID_ENV, " ")
    assert boot_id() == BOOT_ID_PATH.read_text().strip()
