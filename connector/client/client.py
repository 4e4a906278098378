"""``npstream.Client``: the Python SDK over the broker's gRPC API.

The client is a thin, typed layer: names and config values are checked here
so that mistakes fail before a round trip, message data travels as Arrow
(publish_batch sends Arrow IPC streams, fetches decode the broker's stored
record-batch messages without touching rows), and every transport concern
(auth, TLS, retries) lives in ``npstream.client.connection``.

``Client`` is assembled from one part per area of the API, so each can be
read on its own: ``core`` (the connection and the low-level calls),
``stream_admin`` (streams), ``publisher`` (publish, publish_batch) and
``reader`` (fetch, read_batches, read_range, offset lookups). This module adds
the doorways to consumer groups (``npstream.groups``) and the sink
(``npstream.sink``), which import their modules only when first used.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from npstream.client.publisher import Publisher
from npstream.client.reader import Reader
from npstream.client.stream_admin import StreamAdmin

if TYPE_CHECKING:
    from npstream.groups.admin import GroupInfo
    from npstream.groups.batch import LeaseBatch
    from npstream.groups.batch_stream import BatchStream
    from npstream.groups.cursor import Consumer
    from npstream.groups.leases import Lease
    from npstream.groups.options import GroupOptions
    from npstream.groups.redrive import RedriveResult
    from npstream.groups.subscription import Subscription
    from npstream.sink.client import SinkClient

__all__ = ["Client"]


class Client(StreamAdmin, Publisher, Reader):
    """A connection to one npstream broker.

    Thread-safe: one client may be shared by many threads (gRPC channels are).
    Use it as a context manager or call ``close()``.
    """

    # ------------------------------------------------------------ groups and sink

    def consumer(self, stream: str, group: str, start_from: object = "earliest") -> Consumer:
        from npstream.groups.cursor import Consumer

        return Consumer(self, stream, group, start_from=start_from)

    def subscribe(
        self,
        stream: str,
        group: str,
        handler: Callable[[Lease], object],
        *,
        max_in_flight: int = 1000,
        options: GroupOptions | None = None,
        **group_options: Any,
    ) -> Subscription:
        """Push delivery to ``handler`` in worker threads (npstream.groups.subscription).

        ``options``: the group settings (``GroupOptions``); the old keyword
        arguments (``ack_wait=``, ``max_deliver=``, ``backoff=``,
        ``dead_letter_stream=``, ``ordering=``, ``member_id=``) still work
        and win over ``options``. The same for the three ``receive`` methods.
        """
        from npstream.groups.subscription import subscribe

        return subscribe(self, stream, group, handler, max_in_flight=max_in_flight,
                         options=options, **group_options)

    def receive(
        self,
        stream: str,
        group: str,
        max: int = 10,
        *,
        wait: float = 0.0,
        options: GroupOptions | None = None,
        **group_options: Any,
    ) -> list[Lease]:
        """Lease up to ``max`` messages (npstream.groups.pull); ``options`` as ``subscribe``."""
        from npstream.groups.pull import receive

        return receive(self, stream, group, max, wait=wait, options=options, **group_options)

    def receive_batch(
        self,
        stream: str,
        group: str,
        max: int = 1000,
        *,
        wait: float = 0.0,
        options: GroupOptions | None = None,
        ack: LeaseBatch | None = None,
        **group_options: Any,
    ) -> LeaseBatch:
        """Lease up to ``max`` messages as one Arrow batch (npstream.groups.batch).

        ``options`` as ``subscribe``.
        """
        from npstream.groups.batch import receive_batch

        return receive_batch(self, stream, group, max, wait=wait, options=options, ack=ack,
                             **group_options)

    def receive_batches(
        self,
        stream: str,
        group: str,
        max: int = 1000,
        *,
        wait: float = 1.0,
        options: GroupOptions | None = None,
        prefetch: int | None = None,
        until_empty: bool = False,
        **group_options: Any,
    ) -> BatchStream:
        """Iterate over the group's LeaseBatches, the next ones prefetched (groups.batch_stream)."""
        from npstream.groups.batch_stream import receive_batches

        return receive_batches(self, stream, group, max, wait=wait, options=options,
                               prefetch=prefetch, until_empty=until_empty, **group_options)

    def redrive(self, dlq_stream: str, *, start: int | None = None, end: int | None = None,
                header: tuple[str, str] | None = None) -> RedriveResult:
        """Publish dead letters back to their origin streams (npstream.groups.redrive)."""
        from npstream.groups.redrive import redrive

        return redrive(self, dlq_stream, start=start, end=end, header=header)

    def list_groups(self, stream: str) -> list[GroupInfo]:
        from npstream.groups.admin import list_groups

        return list_groups(self, stream)

    def describe_group(self, stream: str, group: str) -> GroupInfo:
        from npstream.groups.admin import describe_group

        return describe_group(self, stream, group)

    def delete_group(self, stream: str, group: str) -> bool:
        from npstream.groups.admin import delete_group

        return delete_group(self, stream, group)

    def sink(self, *, local_staging: bool = True) -> SinkClient:
        """A SinkClient (exactly-once staging/commit) sharing this connection.

        ``local_staging``: on the broker's machine, Stage hands its data over
        in a file of the broker's stage inbox; False: always over gRPC.
        """
        from npstream.sink.client import SinkClient

        return SinkClient(self, local_staging=local_staging)
