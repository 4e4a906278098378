"""The sink package's own error, inside the broker: a stage-by-reference it refuses.

``InboxRefused`` never reaches a client as such: the sink service answers
the stage with the rows sent inline instead (npstream.broker.sink.inbox).
The sink's errors a client sees are BrokerErrors (npstream.broker.errors).
"""

from __future__ import annotations

__all__ = ["InboxRefused"]


class InboxRefused(Exception):
    """This request's file cannot be staged by reference; the message says why."""
