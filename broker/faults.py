"""Test-only hooks that make a real broker process behave like an older or dying one.

The client's fallbacks (unary publishes when PublishStream is missing or
breaks) can only be tested against a broker that lacks the RPC or dies at an
exact point of it. A mock would test the mock; these hooks let the tests run
the real broker process instead. Both are read from the environment once, at
start; never set them in production.

* ``NPSTREAM_TEST_HIDE_RPCS``: comma list of ``Service.Method`` names that the
  broker does not register, so calls get gRPC's own UNIMPLEMENTED, as from a
  broker built before those RPCs existed.
* ``NPSTREAM_PUBLISH_FAULT=exit_after_write:N``: the broker ``os._exit()``s
  with FAULT_EXIT_CODE right after writing the N-th PublishStream request of
  its lifetime, before that request's fsync and reply (what kill -9 at that
  instant leaves: the rows in the page cache, no response).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping

__all__ = ["FAULT_EXIT_CODE", "HIDE_RPCS_ENV", "PUBLISH_FAULT_ENV", "PublishFault",
           "hidden_rpcs"]

log = logging.getLogger(__name__)

HIDE_RPCS_ENV = "NPSTREAM_TEST_HIDE_RPCS"
PUBLISH_FAULT_ENV = "NPSTREAM_PUBLISH_FAULT"
FAULT_EXIT_CODE = 87


def hidden_rpcs(env: Mapping[str, str] = os.environ) -> frozenset[str]:
    """The ``Service.Method`` names the broker must not serve (empty: serve all)."""
    return frozenset(name.strip() for name in env.get(HIDE_RPCS_ENV, "").split(",")
                     if name.strip())


class PublishFault:
    """Counts written PublishStream requests; exits the process at the configured one."""

    def __init__(self, exit_after_write: int | None) -> None:
        self._exit_after = exit_after_write
        self._written = 0
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> PublishFault:
        """The fault of NPSTREAM_PUBLISH_FAULT (none when unset); ValueError when malformed."""
        text = env.get(PUBLISH_FAULT_ENV, "")
        if not text:
            return cls(None)
        point, _, count = text.partition(":")
        if point != "exit_after_write" or not count.isdigit() or int(count) < 1:
            raise ValueError(f"invalid {PUBLISH_FAULT_ENV}={text!r}: use exit_after_write:<N>, "
                             "N >= 1")
        return cls(int(count))

    def written(self) -> None:
        """Called after each PublishStream request is written, before its fsync and reply."""
        if self._exit_after is None:
            return
        with self._lock:
            self._written += 1
            if self._written < self._exit_after:
                return
        log.critical("test fault hook %s: exiting after writing PublishStream request %d",
                     PUBLISH_FAULT_ENV, self._written)
        logging.shutdown()
        os._exit(FAULT_EXIT_CODE)
