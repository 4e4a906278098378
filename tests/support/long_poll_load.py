"""Load for test_long_poll_load.py: many open long polls and a few slow subscribers.

A separate process, so that its threads do not share the test's GIL with
the publisher being measured. Arguments: broker address, the stream the
test publishes to, how many long polls, how many slow subscribers.

Half the long polls are shared-group ``Receive`` calls (members of one
group), half cursor-group ``Pull`` calls (ten groups), on two streams that
get no messages, each re-issued as soon as it ends (they end only at their
wait), spread over connections of 100 calls each. The slow subscribers
consume the test's stream through shared-group subscriptions with one
message in flight and 200 ms per message.

Commands on stdin, one per line, each answered with one line: ``open``
(issue every call and start the subscribers; ``opened``), ``count`` (``N``:
calls open now), ``close`` (cancel them all, stop the subscribers;
``closed``). At stdin's end: one JSON line with the totals.
"""

from __future__ import annotations

import json
import sys
import threading
import time

import grpc

from npstream import Client
from npstream.groups.subscription import Subscription
from npstream.proto import pb, pb_grpc

SHARED, CURSOR = "lp-idle-shared", "lp-idle-cursor"
WAIT_MS = 20_000
PER_CONNECTION = 100


class Load:
    """The long polls and the subscribers, switched on and off."""

    def __init__(self, address: str, hot: str, polls: int, subscribers: int) -> None:
        self.hot, self.polls, self.subscribers = hot, polls, subscribers
        self.client = Client(address)
        for stream in (SHARED, CURSOR):
            self.client.create_stream(stream, exist_ok=True)
        self.channels = [grpc.insecure_channel(
            address, options=[("grpc.use_local_subchannel_pool", 1)])
            for _ in range(-(-polls // PER_CONNECTION))]
        self.stubs = [pb_grpc.GroupServiceStub(c) for c in self.channels]
        for group in range(10):  # cursor groups exist before they are pulled
            self.stubs[0].OpenConsumer(pb.OpenConsumerRequest(
                stream=CURSOR, group=f"c{group}", start_from=pb.StartFrom(latest=True)),
                timeout=30)
        self.lock = threading.Lock()
        self.futures: dict[int, grpc.Future] = {}
        self.totals = {"issued": 0, "ended_early": 0, "errors": 0, "handled": 0}
        self.errors: list[str] = []
        self.on = False
        self.subscriptions: list[Subscription] = []

    def open(self) -> None:
        with self.lock:
            self.on = True
        for index in range(self.polls):
            self._issue(index)
        self.subscriptions = [self.client.subscribe(self.hot, f"slow-{j}", self._slow,
                                                    max_in_flight=1)
                              for j in range(self.subscribers)]

    def close(self) -> None:
        with self.lock:
            self.on = False
            futures = list(self.futures.values())
        for future in futures:
            future.cancel()
        for subscription in self.subscriptions:
            subscription.stop()
        deadline = time.monotonic() + 30
        while self.count() and time.monotonic() < deadline:
            time.sleep(0.05)

    def count(self) -> int:
        with self.lock:
            return len(self.futures)

    def _issue(self, index: int) -> None:
        stub = self.stubs[index // PER_CONNECTION]
        timeout = WAIT_MS / 1000 + 30
        if index % 2:
            future = stub.Receive.future(pb.ReceiveRequest(
                stream=SHARED, group="lp", member_id=f"m{index}", max_messages=10,
                wait_ms=WAIT_MS), timeout=timeout)
        else:
            future = stub.Pull.future(pb.PullRequest(
                stream=CURSOR, group=f"c{index % 10}", limit=10, wait_ms=WAIT_MS),
                timeout=timeout)
        with self.lock:
            self.futures[index] = future
            self.totals["issued"] += 1
        future.add_done_callback(lambda f: self._ended(index, f))

    def _ended(self, index: int, future: grpc.Future) -> None:
        with self.lock:
            if self.futures.get(index) is future:
                del self.futures[index]
            if not self.on:
                return
            self.totals["ended_early"] += 1  # a 20 s wait ended while the load was on
            if future.exception() is not None:
                self.totals["errors"] += 1
                self.errors.append(repr(future.exception())[:300])
        self._issue(index)

    def _slow(self, lease: object) -> None:
        time.sleep(0.2)
        with self.lock:
            self.totals["handled"] += 1


def main(address: str, hot: str, polls: int, subscribers: int) -> int:
    load = Load(address, hot, polls, subscribers)
    for line in sys.stdin:
        command = line.strip()
        if command == "open":
            load.open()
            print("opened", flush=True)
        elif command == "count":
            print(load.count(), flush=True)
        elif command == "close":
            load.close()
            print("closed", flush=True)
    load.close()
    load.client.close()
    for channel in load.channels:
        channel.close()
    print(json.dumps({**load.totals, "first_errors": load.errors[:5]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
