"""PublishStream: pipelined publishes on one call, written in arrival order, answered in order.

A unary Publish waits for its own fsync before the client can send the next
request, so one producer of a large table pays a round trip plus an fsync per
~4 MiB request. On a PublishStream the client keeps several requests in
flight: a reader thread takes the requests in the order they arrive and
writes each one (``write_one``: decode, check, append without waiting for the
fsync), while the call's own thread runs each written request's reply (which
waits for the fsync covering it) and sends the response. Request k+1 is therefore written while
request k's fsync runs, and one fsync covers every request written meanwhile;
``ack=fsync`` still replies only after the covering fsync.

When ``write_one`` fails for a request, the reader stops: the responses of the
requests written before it are sent (after their fsyncs) and the call then
ends with the failed request's error. Requests the client sent after it are
never read, so "the requests that got a response" is exactly what was stored.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator

import grpc

from npstream.broker.errors import ShuttingDownError
from npstream.broker.streams.tuning import POLL_INTERVAL_S
from npstream.proto import pb

__all__ = ["Reply", "serve_publish_stream"]


# A written request's reply: blocks until its data is as durable as its ack
# mode promises (the covering fsync for ack=fsync), then returns the response.
Reply = Callable[[], pb.PublishResponse]


class _End:
    """The client half-closed the call: every request has been written."""


def serve_publish_stream(
    request_iterator: Iterator[bytes],
    context: grpc.ServicerContext,
    write_one: Callable[[bytes], Reply],
    stopping: threading.Event,
) -> Iterator[pb.PublishResponse]:
    """Responses of a PublishStream call, one per request, in request order."""
    written: queue.SimpleQueue[Reply | BaseException | _End] = queue.SimpleQueue()
    finished = threading.Event()  # the replying side is gone: stop reading

    def read_and_write() -> None:
        try:
            for request in request_iterator:
                if finished.is_set():
                    return
                written.put(write_one(request))
        except BaseException as exc:  # the failed request's error, or the call's end
            written.put(exc)
        else:
            written.put(_End())

    reader = threading.Thread(target=read_and_write, name="publish-stream", daemon=True)
    reader.start()
    try:
        while True:
            try:
                item = written.get(timeout=POLL_INTERVAL_S)
            except queue.Empty:
                if not context.is_active():
                    return
                if stopping.is_set():
                    raise ShuttingDownError("broker is shutting down") from None
                continue
            if isinstance(item, _End):
                return
            if isinstance(item, BaseException):
                if isinstance(item, grpc.RpcError) or not context.is_active():
                    return  # the client cancelled or went away: nobody to answer
                raise item
            yield item()
    finally:
        finished.set()
