"""The web console's view of the other members: their streams, asked over gRPC.

A member's console (npstream.broker.console) is served from its own HTTP port
and built from its own objects. In a cluster it also lists the streams the
other members hold, so one console shows the whole cluster: for each of its
``/api/streams`` requests it asks every other member's ``StreamStats``
(``x-npstream-cluster-local``: that member's own streams) with the token the
console's caller sent, so each member applies that token's rights as for
any call. A member that does not answer is named in the reply instead of
failing the page. Rows carry the member that holds the stream; details and
messages of such a stream are on that member's console.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from npstream.proto import metadata_keys, pb

if TYPE_CHECKING:
    from npstream.broker.cluster.router import Cluster

__all__ = ["STREAM_STATS_METHOD", "ClusterView", "PeerStreams"]

STREAM_STATS_METHOD = "/npstream.v1.StreamService/StreamStats"


@dataclass(frozen=True)
class PeerStreams:
    """Rows of the other members' streams (the console's stream row fields plus ``member``)."""

    rows: list[dict[str, object]]
    unavailable: list[str]  # members that did not answer ("member: detail")


class ClusterView:
    """Who this member is, who the others are, and their streams for the console."""

    def __init__(self, cluster: Cluster) -> None:
        self._cluster = cluster

    @property
    def member(self) -> str:
        return self._cluster.identity

    @property
    def members(self) -> list[str]:
        return list(self._cluster.members)

    def other_streams(self, token: bytes | None, prefix: str = "") -> PeerStreams:
        """Every other member's streams starting with ``prefix`` that ``token`` may read."""
        if not self._cluster.enabled or not self._cluster.others:
            return PeerStreams([], [])
        metadata: list[tuple[str, str]] = [(metadata_keys.CLUSTER_LOCAL, "1")]
        if token is not None:
            metadata.append((metadata_keys.AUTHORIZATION, f"Bearer {token.decode()}"))
        pattern = "".join(f"[{c}]" if c in "*?[]" else c for c in prefix) + "*"
        request = pb.StreamStatsRequest(pattern=pattern).SerializeToString()
        peers = self._cluster.peers

        def ask(member: str) -> pb.StreamStatsResponse:
            return pb.StreamStatsResponse.FromString(
                peers.call(member, STREAM_STATS_METHOD, request, metadata))

        replies, failures = peers.each(self._cluster.others, ask)
        rows: list[dict[str, object]] = []
        for member in self._cluster.others:
            reply = replies.get(member)
            if reply is None:
                continue
            for activity in reply.streams:
                info = activity.stream
                rows.append({
                    "name": info.name, "member": member, "error": info.error,
                    "typed": bool(info.value_schemas),
                    "messages_in": activity.messages_in, "messages_out": activity.messages_out,
                    "bytes_in": activity.bytes_in, "bytes_out": activity.bytes_out,
                    "rate_in": None, "rate_out": None, "created_ms": info.created_ms,
                    "start_offset": info.start_offset, "end_offset": info.end_offset,
                    "message_count": info.message_count, "bytes_on_disk": info.bytes_on_disk,
                    "segments": info.segment_count,
                    "first_timestamp_ms": info.first_timestamp_ms,
                    "last_timestamp_ms": info.last_timestamp_ms,
                })
        return PeerStreams(rows, [f"{f.member}: {f.detail}" for f in failures])
