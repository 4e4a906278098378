"""Consuming a shared group batch after batch, with the next batch already on its way.

Why: ``receive_batch(ack=previous)`` is one round trip per batch, and during
it the consumer waits for the broker and the broker for the consumer; with
1 KB messages each side was busy less than half the time (issue 16). A
``BatchStream`` keeps ``prefetch`` ReceiveBatch calls in flight while the
application works on the batch it holds, so the broker reads and sends the
next batches meanwhile. With one call in flight the broker still idled
while its reply crossed the wire and the client decoded it; more keep one
broker thread reading while another sends (1 KB messages on 2 cores: one
call in flight ~400 k msg/s, two ~500 k, three ~580 k, four no more). Acks ride along as with
``ack=previous``: asking for the next batch means the application is done
with the one it held, and that batch's unsettled messages are acked by the
next call sent (durable when that call returns; ``close()`` waits for it).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from typing import TYPE_CHECKING, Any

from npstream.errors import InvalidArgument
from npstream.groups.batch import LeaseBatch, lease_batch
from npstream.groups.leases import check_receive, default_member_id, shared_group_config
from npstream.groups.options import GroupOptions, group_options
from npstream.proto import pb

if TYPE_CHECKING:
    from npstream.client.client import Client

__all__ = ["DEFAULT_PREFETCH", "MAX_PREFETCH", "BatchStream", "receive_batches"]

# ReceiveBatch calls kept in flight by default, and the most allowed (each
# holds up to ``max`` leased messages the application has not asked for yet).
DEFAULT_PREFETCH = 3
MAX_PREFETCH = 16


def receive_batches(
    client: Client,
    stream: str,
    group: str,
    max: int = 1000,
    *,
    wait: float = 1.0,
    options: GroupOptions | None = None,
    prefetch: int | None = None,
    until_empty: bool = False,
    **keywords: Any,
) -> BatchStream:
    """An iterator of the group's LeaseBatches (see the module doc); arguments as receive_batch.

    ``wait``: seconds each call long-polls; an empty batch is not yielded
    but ends the iteration when ``until_empty`` is set (draining what is
    there). ``prefetch``: calls kept in flight beside the batch held (default
    DEFAULT_PREFETCH; ``True`` is 1); ``0`` or ``False`` makes one call at a time (no lease is taken
    before the application asks for it). With more than one in flight,
    batches are handed out as their calls come back (see ``_next_done``), so
    a later batch may hold lower offsets.
    """
    if prefetch is None:
        prefetch = DEFAULT_PREFETCH
    elif isinstance(prefetch, bool):
        prefetch = int(prefetch)
    if not isinstance(prefetch, int) or not 0 <= prefetch <= MAX_PREFETCH:
        raise InvalidArgument(f"receive_batches: prefetch must be an integer from 0 to "
                              f"{MAX_PREFETCH} (calls in flight), got {prefetch!r}")
    settings = group_options(options, keywords, "receive_batches")
    config = shared_group_config(stream, settings)
    member_id = settings.member_id
    check_receive(group, max, wait)
    return BatchStream(client, stream, group, member_id or default_member_id(), max, wait,
                       config, prefetch, until_empty)


class BatchStream:
    """Iterate to get LeaseBatches; taking the next one acks what is unsettled in the last.

    ``close()`` (also at the end of a ``with`` block) acks nothing of the
    batch you hold: ack it first if you finished it. Its unsettled messages
    and those of the batches prefetched for you are nacked, so other members
    get them at once (each such message counts one delivery attempt, as an
    expired lease would).
    """

    def __init__(self, client: Client, stream: str, group: str, member_id: str, max: int,
                 wait: float, config: pb.SharedGroupConfig, prefetch: int,
                 until_empty: bool) -> None:
        self.stream = stream
        self.group = group
        self.member_id = member_id
        self._call = (client, stream, group, member_id, max, wait, config)
        self._prefetch = prefetch
        self._until_empty = until_empty
        self._pool = ThreadPoolExecutor(max_workers=prefetch + 1,  # + the call with acks
                                        thread_name_prefix=f"npstream-batches-{stream}/{group}")
        # Calls in flight, in the order sent, each with whether it was quiet (_send).
        self._pending: deque[tuple[Future[LeaseBatch], bool]] = deque()
        self._current: LeaseBatch | None = None
        self._closed = False

    def _send(self, ack_ranges: Sequence[tuple[int, int]]) -> None:
        client, stream, group, member, max, wait, config = self._call
        # A call sent with nothing else in flight and nothing held unacked (its
        # acks included) is "quiet": if it comes back empty, the group had
        # nothing for this member. One sent beside others may come back empty
        # only because ordering="key" held a key whose previous message an
        # earlier call still had, or the broker served it before the call
        # carrying the acks that would free it.
        quiet = not self._pending and self._current is None
        future = self._pool.submit(lease_batch, client, stream, group, member, max, wait,
                                   config, ack_ranges)
        self._pending.append((future, quiet))

    def __iter__(self) -> BatchStream:
        return self

    def _next_done(self) -> tuple[Future[LeaseBatch], bool]:
        """The first call in flight to come back (of those back, the first sent).

        Why not strictly the first sent: calls in flight long-poll side by
        side, and messages that become deliverable (data appended, a key
        released by an ack with ordering="key") go to whichever call the
        broker wakes first. Waiting for the first one sent would leave the
        application idle until that call's long poll ended empty (``wait``
        seconds per batch with few keys).
        """
        wait_for([future for future, _quiet in self._pending], return_when=FIRST_COMPLETED)
        for index, (future, quiet) in enumerate(self._pending):
            if future.done():
                del self._pending[index]
                return future, quiet
        raise AssertionError("wait() returned with no call done")  # pragma: no cover

    def __next__(self) -> LeaseBatch:
        while not self._closed:
            done, self._current = self._current, None
            acks = done._take(None) if done is not None else []
            if acks or not self._pending:
                # The acks go out now, not after the calls in flight return: with
                # ordering="key" those calls may be waiting for exactly these acks.
                self._send(acks)
            future, quiet = self._next_done()
            batch = future.result()
            if not len(batch) and self._until_empty:
                if quiet:  # drained: nothing was held back by another call
                    self.close()
                    break
                continue  # not conclusive: once the calls in flight are back, ask quietly
            if len(batch):
                self._current = batch  # held before the next calls go out (quiet)
            while len(self._pending) < self._prefetch:
                self._send(())
            if len(batch):
                return batch
        raise StopIteration

    def close(self) -> None:
        """Stop: wait for the calls in flight (their acks are then durable); nack what is held."""
        if self._closed:
            return
        self._closed = True
        try:
            prefetched = [future.result() for future, _quiet in self._pending]
            self._pending.clear()
            # The held batch first: released messages come back in offset order.
            for batch in (self._current, *prefetched):
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
