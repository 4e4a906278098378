"""Client.publish_many on a cluster of two members: each entry reaches its stream's owner.

The client knows no owner at first, so every entry goes to the member it was
given; that member routes each entry (its holders asked once for the whole
request) and answers the other member's entries with NOT_OWNER, which the
SDK follows per entry and remembers. Streams a member already holds stay
there; new names land where placement puts them.
"""

from __future__ import annotations

import grpc
import pytest

from cluster_members import held, names_on
from npstream import Client
from npstream.proto import pb, pb_grpc

pytestmark = pytest.mark.slow

CLUSTER_SIZE = 2  # the module's cluster_members (tests/e2e/broker_cluster/conftest.py)


def test_entries_for_the_other_member_follow_its_redirect(cluster_members):
    a, b = cluster_members
    members = [a.address, b.address]
    on_a = names_on(a.address, members, "pm-a", 30)
    on_b = names_on(b.address, members, "pm-b", 30)
    mixed = [name for pair in zip(on_a, on_b, strict=True) for name in pair]
    with Client(a.address) as client:
        results = client.publish_many([(n, n) for n in mixed])
        assert all(r.ok and r.offset == 0 for r in results), [r.error for r in results]
        assert held(a) >= set(on_a) and not held(a) & set(on_b)
        assert held(b) >= set(on_b) and not held(b) & set(on_a)
        again = client.publish_many([(n, "second") for n in mixed])  # owners remembered
        assert all(r.offset == 1 for r in again)
    with grpc.insecure_channel(a.address) as channel:  # the raw answer: an owner per entry
        stub = pb_grpc.StreamServiceStub(channel)
        reply = stub.PublishMany(pb.PublishManyRequest(entries=[
            pb.PublishRequest(stream=on_a[0], messages=[pb.Message(value=b"x")]),
            pb.PublishRequest(stream=on_b[0], messages=[pb.Message(value=b"y")]),
        ]), timeout=30)
        assert reply.results[0].published.first_offset == 2
        error = reply.results[1].error
        assert error.code == grpc.StatusCode.FAILED_PRECONDITION.value[0]
        assert error.metadata["x-npstream-owner"] == b.address
        assert error.metadata["x-npstream-reason"] == "ERROR_REASON_NOT_OWNER"
