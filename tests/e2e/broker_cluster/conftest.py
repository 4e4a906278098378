"""Fixtures of the e2e tests: one cluster of broker processes per test module that asks.

``cluster_members`` starts ``CLUSTER_SIZE`` members (a module-level constant
of the test module, default 2) named a, b, c, ... once for the module and
stops them at its end (helpers: tests/support/cluster_members.py).
"""

from __future__ import annotations

import string
from collections.abc import Iterator

import pytest

from cluster_members import start_members, stop_members
from harness import BrokerProcess

# Members of the module's cluster when the module does not say (CLUSTER_SIZE).
DEFAULT_CLUSTER_SIZE = 2


@pytest.fixture(scope="module")
def cluster_members(request: pytest.FixtureRequest,
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[BrokerProcess]]:
    size = int(getattr(request.module, "CLUSTER_SIZE", DEFAULT_CLUSTER_SIZE))
    brokers = start_members(tmp_path_factory.mktemp("cluster"), string.ascii_lowercase[:size])
    yield brokers
    stop_members(brokers)
