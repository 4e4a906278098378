"""Consuming a shared group batch after batch, with the next batch already on its way.

Why: ``receive_batch(ack=previous)`` is one round trip per batch, and during
it the consumer waits for the broker and the broker for the consumer; with
1 KB messages each side was busy less than half the time (issue 16). A
``BatchStream`` keeps one ReceiveBatch call in flight while the application
works on the batch it holds, so the broker reads and sends batch N+1 while
batch N is processed. Acks ride along as with ``ack=previous``: asking for
the next batch means the application is done with the one it held, and
that batch's unsettled messages are acked by the next call (durable when
that call returns; ``close()`` waits for it).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

from npstream.groups.batch import LeaseBatch, lease_batch
from npstream.groups.leases import check_receive, default_member_id, shared_group_config
from npstream.proto import pb

if TYPE_CHECKING:
    from npstream.client.client import Client

__all__ = ["BatchStream", "receive_batches"]


def receive_batches(
    client: Client,
    stream: str,
    group: str,
    max: int = 1000,
    *,
    wait: float = 1.0,
    ack_wait: float = 30.0,
    max_deliver: int = 0,
    backoff: Sequence[float] | None = None,
    dead_letter_stream: str | None = None,
    ordering: str | None = None,
    member_id: str | None = None,
    prefetch: bool = True,
    until_empty: bool = False,
) -> BatchStream:
    """An iterator of the group's LeaseBatches (see the module doc); arguments as receive_batch.

    ``wait``: seconds each call long-polls; an empty batch is not yielded
    but ends the iteration when ``until_empty`` is set (draining what is
    there). ``prefetch=False`` makes one call at a time (no lease is taken
    before the application asks for it).
    """
    config = shared_group_config(stream, ack_wait, max_deliver, backoff, dead_letter_stream,
                                 ordering)
    check_receive(group, max, wait)
    return BatchStream(client, stream, group, member_id or default_member_id(), max, wait,
                       config, prefetch, until_empty)


class BatchStream:
    """Iterate to get LeaseBatches; taking the next one acks what is unsettled in the last.

    ``close()`` (also at the end of a ``with`` block) acks nothing of the
    batch you hold: ack it first if you finished it. Its unsettled messages
    and those of a batch prefetched for you are nacked, so other members get
    them at once (each such message counts one delivery attempt, as an
    expired lease would).
    """

    def __init__(self, client: Client, stream: str, group: str, member_id: str, max: int,
                 wait: float, config: pb.SharedGroupConfig, prefetch: bool,
                 until_empty: bool) -> None:
        self.stream = stream
        self.group = group
        self.member_id = member_id
        self._call = (client, stream, group, member_id, max, wait, config)
        self._prefetch = prefetch
        self._until_empty = until_empty
        self._pool = ThreadPoolExecutor(max_workers=1,
                                        thread_name_prefix=f"npstream-batches-{stream}/{group}")
        self._pending: Future[LeaseBatch] | None = None
        self._current: LeaseBatch | None = None
        self._closed = False

    def _send(self, ack_ranges: Sequence[tuple[int, int]]) -> Future[LeaseBatch]:
        client, stream, group, member, max, wait, config = self._call
        return self._pool.submit(lease_batch, client, stream, group, member, max, wait,
                                 config, ack_ranges)

    def __iter__(self) -> BatchStream:
        return self

    def __next__(self) -> LeaseBatch:
        while not self._closed:
            done, self._current = self._current, None
            acks = done._take(None) if done is not None else []
            if self._pending is None:  # the first call, or no prefetching
                self._pending = self._send(acks)
                acks = []
            batch = self._pending.result()
            self._pending = None
            if self._prefetch or acks:
                # Prefetch: the next call goes out now. Without it, acks left over
                # (a batch came back empty) still need their call.
                self._pending = self._send(acks)
            if len(batch):
                self._current = batch
                return batch
            if self._until_empty:
                self.close()
        raise StopIteration

    def close(self) -> None:
        """Stop: wait for the call in flight (its acks are then durable); nack what is held."""
        if self._closed:
            return
        self._closed = True
        try:
            prefetched = self._pending.result() if self._pending is not None else None
            self._pending = None
            # The held batch first: released messages come back in offset order.
            for batch in (self._current, prefetched):
                if batch is not None:
                    batch.nack()
            self._current = None
        finally:
            self._pool.shutdown(wait=True)

    def __enter__(self) -> BatchStream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"BatchStream(stream={self.stream!r}, group={self.group!r}, {state})"
