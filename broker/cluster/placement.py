"""Where a new stream goes: rendezvous (highest-random-weight) hashing of its name.

Every member computes the same answer from the same member list, with no
coordination: two clients creating one name through two members both end up
on the same broker, which creates it once. The weight of a member for a name
is a BLAKE2b digest of both (stable across processes and machines, unlike
Python's ``hash()``, which is salted per process). Adding a member moves only
the names whose highest weight is now the new member's, about 1/N of them;
and since a stream that exists stays where it is (the router asks the
members before it places anything), adding members never moves data.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

__all__ = ["placement_weight", "rendezvous_owner"]


def placement_weight(member: str, stream: str) -> int:
    """The member's weight for the stream name: 64 bits of BLAKE2b(member, name)."""
    # NUL separates the two: neither a stream name nor a host:port contains one.
    digest = hashlib.blake2b(member.encode() + b"\0" + stream.encode(), digest_size=8,
                             person=b"npstream-place")
    return int.from_bytes(digest.digest(), "big")


def rendezvous_owner(stream: str, members: Iterable[str]) -> str:
    """The member with the highest weight for ``stream`` (ties: the greatest address)."""
    chosen = max(members, key=lambda member: (placement_weight(member, stream), member),
                 default="")
    if not chosen:
        raise ValueError("rendezvous_owner needs at least one member")
    return chosen
