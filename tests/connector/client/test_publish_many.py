"""publish_many's client side (npstream.client.publish_many) against fake brokers.

What a real cluster makes hard to stage: entries refused with STREAM_MOVING
are sent again after the hint, NOT_OWNER ones go to the member named (and it
is remembered), a stream's entries keep their order across lanes and rounds,
and a request that fails whole gives its entries that error.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import grpc

from npstream import BrokerUnavailable, NotOwner
from npstream.client import publish_many as module
from npstream.client.publish_many import publish_many
from npstream.client.routing import Brokers
from npstream.client.stubs import Rpc, Stubs
from npstream.proto import metadata_keys, pb

Answer = Callable[[pb.PublishRequest], pb.PublishManyResult]


def published(offset: int) -> pb.PublishManyResult:
    return pb.PublishManyResult(published=pb.PublishResponse(first_offset=offset,
                                                             stored_count=1))


def refused(code: grpc.StatusCode, reason: str, **meta: str) -> pb.PublishManyResult:
    return pb.PublishManyResult(error=pb.EntryError(
        code=code.value[0], message=f"{reason} for this entry",
        metadata={metadata_keys.REASON: reason, **meta}))


class FakeConnection:
    """A broker that answers each entry with ``answer``; logs (address, streams) per call."""

    def __init__(self, address: str, answer: Answer, log: list[tuple[str, list[str]]]) -> None:
        self.address = address
        self.retry_deadline = 5.0
        self._answer = answer
        self._log = log
        self._lock = threading.Lock()
        self._channel = grpc.insecure_channel(address)  # never used: its stubs name methods
        self.stubs = Stubs(self._channel)

    def call_serialized(self, rpc: Rpc, raw: bytes, response_type: type, **_: object) -> object:
        assert self.stubs.method(rpc)[1] == "StreamService.PublishMany"
        request = pb.PublishManyRequest.FromString(raw)
        with self._lock:
            self._log.append((self.address, [e.stream for e in request.entries]))
        return pb.PublishManyResponse(results=[self._answer(e) for e in request.entries])

    def close(self) -> None:
        self._channel.close()


def test_moving_entries_are_resent_and_redirected_ones_follow_the_owner():
    log: list[tuple[str, list[str]]] = []
    moving_once = {"m-1"}
    offsets: dict[str, int] = {}

    def next_offset(stream: str) -> pb.PublishManyResult:
        offsets[stream] = offsets.get(stream, -1) + 1
        return published(offsets[stream])

    def home_answer(entry: pb.PublishRequest) -> pb.PublishManyResult:
        if entry.stream.startswith("b-"):
            return refused(grpc.StatusCode.FAILED_PRECONDITION, "ERROR_REASON_NOT_OWNER",
                           **{metadata_keys.OWNER: "b:1", metadata_keys.STREAM: entry.stream})
        if entry.stream in moving_once:  # refused once: the move is over after it
            moving_once.discard(entry.stream)
            return refused(grpc.StatusCode.UNAVAILABLE, "ERROR_REASON_STREAM_MOVING",
                           **{metadata_keys.RETRY_AFTER_MS: "10"})
        return next_offset(entry.stream)

    def b_answer(entry: pb.PublishRequest) -> pb.PublishManyResult:
        return next_offset(entry.stream)

    brokers = Brokers(FakeConnection("home:1", home_answer, log),  # type: ignore[arg-type]
                      lambda address: FakeConnection(  # type: ignore[return-value]
                          address, b_answer, log))
    entries = [("a-1", "x"), ("b-1", "y"), ("m-1", "z"), ("b-1", "w"), ("a-1", "v")]
    results = publish_many(brokers, entries, pb.ACK_FSYNC, retry_deadline=5.0)
    assert [r.stream for r in results] == ["a-1", "b-1", "m-1", "b-1", "a-1"]
    assert all(r.ok for r in results), [r.error for r in results]
    assert [r.offset for r in results] == [0, 0, 0, 1, 1]  # a stream's entries in order
    assert log[0] == ("home:1", ["a-1", "b-1", "m-1", "b-1", "a-1"])
    assert brokers.remembered("b-1") == "b:1"
    again = publish_many(brokers, [("b-1", "later")], pb.ACK_FSYNC, retry_deadline=5.0)
    assert again[0].offset == 2 and log[-1] == ("b:1", ["b-1"])  # straight to the owner


def test_a_failed_request_fails_its_entries_and_redirect_loops_end():
    def unreachable(_entry: pb.PublishRequest) -> pb.PublishManyResult:
        raise AssertionError("not called")

    class Down(FakeConnection):
        def call_serialized(self, *args: object, **kwargs: object) -> object:
            raise BrokerUnavailable("broker at home:1 is unavailable: down")

    def loop(entry: pb.PublishRequest) -> pb.PublishManyResult:
        return refused(grpc.StatusCode.FAILED_PRECONDITION, "ERROR_REASON_NOT_OWNER",
                       **{metadata_keys.OWNER: "home:1"})

    down = Brokers(Down("home:1", unreachable, []), lambda a: None)  # type: ignore[arg-type]
    results = publish_many(down, [("s-1", "a"), ("s-2", "b")], pb.ACK_FSYNC, 1.0)
    assert all(isinstance(r.error, BrokerUnavailable) for r in results)
    log: list[tuple[str, list[str]]] = []
    looping = Brokers(FakeConnection("home:1", loop, log),  # type: ignore[arg-type]
                      lambda a: None)  # type: ignore[arg-type,return-value]
    [result] = publish_many(looping, [("s-1", "a")], pb.ACK_FSYNC, 1.0)
    assert isinstance(result.error, NotOwner)
    assert len(log) == module.MAX_REDIRECTS + 1


def test_many_entries_travel_in_lanes_each_stream_in_one():
    log: list[tuple[str, list[str]]] = []
    counts: dict[str, int] = {}
    lock = threading.Lock()

    def answer(entry: pb.PublishRequest) -> pb.PublishManyResult:
        with lock:
            counts[entry.stream] = counts.get(entry.stream, -1) + 1
            return published(counts[entry.stream])

    brokers = Brokers(FakeConnection("home:1", answer, log),  # type: ignore[arg-type]
                      lambda a: None)  # type: ignore[arg-type,return-value]
    names = [f"s-{i % 700}" for i in range(5000)]  # ~7 entries per stream
    results = publish_many(brokers, [(n, "v") for n in names], pb.ACK_FSYNC, 1.0)
    seen: dict[str, int] = {}
    for name, result in zip(names, results, strict=True):
        seen[name] = seen.get(name, -1) + 1
        assert result.offset == seen[name]
    assert len(log) >= 5 and all(len(streams) <= module.REQUEST_ENTRIES for _, streams in log)
