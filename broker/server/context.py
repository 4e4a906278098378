"""The objects every broker service shares, built once by the server and handed to each."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from npstream.broker.auth.access import AccessControl
from npstream.broker.cluster.router import Cluster
from npstream.broker.groups.handover import GroupsOwner
from npstream.broker.handover import StreamStateOwner
from npstream.broker.metadata import Metadata
from npstream.broker.rpc.budget import PublishBudget
from npstream.broker.rpc.long_polls import ParkedPolls
from npstream.broker.server.config import BrokerConfig
from npstream.broker.server.metrics import BrokerMetrics
from npstream.broker.sink.handover import SinkFloorsOwner
from npstream.broker.storage import Storage
from npstream.broker.streams.registry import StreamRegistry

__all__ = ["BrokerContext", "state_owners"]


@dataclass
class BrokerContext:
    """Shared broker state; ``on_stream_deleted`` listeners run after a stream is deleted.

    Groups and sink append a listener to drop their state for the stream; the
    registry calls them (each failure is logged, never hidden).
    """

    config: BrokerConfig
    metadata: Metadata
    storage: Storage
    registry: StreamRegistry
    metrics: BrokerMetrics
    on_stream_deleted: list[Callable[[str], None]] = field(default_factory=list)
    # Every package keeping state per stream in the metadata (npstream.broker.handover):
    # a move exports a stream's records through them and installs them on its target.
    state_owners: list[StreamStateOwner] = field(default_factory=list)
    # Called when a stream is paused to be moved to another member (cluster/move.py):
    # drop its in-memory state (groups end their waiting calls, positions are flushed)
    # so that what is copied is everything, and nothing changes until the move is done.
    on_stream_leaving: list[Callable[[str], None]] = field(default_factory=list)
    # Set when a graceful stop begins, so long-lived calls (Subscribe, long polls)
    # end at once instead of holding the drain for the whole shutdown grace.
    stopping: threading.Event = field(default_factory=threading.Event)
    # Who may do what: each servicer asks ``access.require(context, stream, right)``
    # where it knows the stream (off, allowing everything, without auth configured).
    access: AccessControl = field(default_factory=AccessControl)
    # The cluster this broker is a member of (npstream.broker.cluster): who owns
    # which stream; a cluster of one (no routing) without ``[cluster] etcd``.
    cluster: Cluster = field(default_factory=Cluster.single)
    # Bytes of publish data decoded and written at once (max_publish_bytes_in_flight):
    # Publish, PublishStream and Stage are admitted against it (off: no limit).
    publish_budget: PublishBudget = field(default_factory=lambda: PublishBudget(0))
    # Long polls waiting at once, each on a worker thread (max_workers // 2; off: no limit).
    parked_polls: ParkedPolls = field(default_factory=lambda: ParkedPolls(0))


def state_owners(metadata: Metadata, registry: StreamRegistry) -> list[StreamStateOwner]:
    """Every package's owner of per-stream state (``BrokerContext.state_owners``)."""
    return [*registry.state_owners, GroupsOwner(metadata), SinkFloorsOwner(metadata)]
