"""``[cluster]`` of broker.toml: the etcd this broker registers in, and how it is reached.

Kept apart from npstream.broker.server.config (which builds it like every
other section) because the rules are the cluster's own: the members are
whoever registered in etcd (membership.py), each reached at its advertised
address; placement of a new stream hashes over those addresses. A broker
without etcd is a cluster of one and behaves as if this section did not exist.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from npstream.broker.cluster.etcd.client import parse_endpoints

__all__ = ["ClusterSettings", "check_member_address", "default_advertised_address",
           "parse_etcd_endpoints", "parse_members"]

# etcd keys are /npstream/<cluster_name>/...: a name of these characters keeps the
# layout unambiguous (no "/").
_CLUSTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
# etcd does not grant leases shorter than about 1.5 s (its election timeout's worth).
MIN_MEMBER_LEASE_MS = 2000

# Wildcard listen addresses: a host that tells nobody where to connect.
_WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]"})


MEMBERS_GONE = ("[cluster] members (--cluster-members, NPSTREAM_MEMBERS) is gone: a "
                "cluster's members register in etcd, so start each broker with --etcd "
                "http://HOST:2379[,...] ([cluster] etcd, NPSTREAM_ETCD) and no member list")


def parse_members(value: object) -> tuple[str, ...]:
    """The static member list is gone: empty is accepted (so old files load), else refused."""
    if value in ("", [], ()) or (isinstance(value, (list, tuple)) and not any(
            str(item).strip() for item in value)) or (
            isinstance(value, str) and not value.replace(",", "").strip()):
        return ()
    raise ValueError(MEMBERS_GONE)


def parse_etcd_endpoints(value: object) -> tuple[str, ...]:
    """etcd endpoints as a TOML list of "http://host:port" strings, or one comma-separated
    string (env, flag)."""
    if not isinstance(value, (str, list, tuple)):
        raise ValueError(f'expected a list of "http://HOST:PORT" strings, got {value!r}')
    return parse_endpoints(value)


def check_member_address(address: str) -> str | None:
    """The problem with a member address, or None when it is a usable "host:port"."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        return f"'{address}' is not host:port with a port within 1..65535"
    if host in _WILDCARD_HOSTS:
        return f"'{address}' names a wildcard address, which no client can connect to"
    return None


def default_advertised_address(host: str, port: int) -> str:
    """``host:port`` of the listener, when that is an address others can use ("" if not)."""
    if host.strip() in _WILDCARD_HOSTS or port == 0:
        return ""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


@dataclass(frozen=True)
class ClusterSettings:
    """``[cluster]``: the etcd endpoints, the cluster's name there, this broker's address.

    ``advertised_address`` "" means the listener's ``host:port`` (the bound
    port). ``members`` is the static list that is gone (refused when set).
    ``peer_timeout_ms`` bounds a member's
    wait for another (an owner lookup, a listing). With TLS on, members call
    each other over TLS, checking certificates against ``peer_ca_file``
    (default: the system's roots) and presenting the broker's own certificate
    when ``tls_client_ca_file`` asks clients for one. ``cluster_token``: with
    auth on, the members' own bearer token for the calls they make to each
    other on their own behalf (a move's steps: npstream.broker.auth.tokens),
    the same on every member; "" = such calls carry the caller's token.
    """

    members: tuple[str, ...]
    advertised_address: str
    peer_timeout_ms: int
    peer_ca_file: str
    cluster_token: str = field(default="", repr=False)  # never logged
    etcd: tuple[str, ...] = ()
    cluster_name: str = "npstream"
    rack: str = ""
    member_lease_ms: int = 5000

    def __post_init__(self) -> None:
        problems: list[str] = []
        if self.members:
            problems.append(MEMBERS_GONE)
        if self.advertised_address and not self.etcd:
            problems.append("advertised_address is set but [cluster] etcd is not: a broker "
                            "alone is no cluster")
        if not _CLUSTER_NAME.match(self.cluster_name):
            problems.append(f"cluster_name={self.cluster_name!r} must be 1 to 63 letters, "
                            "digits, '.', '_' or '-', starting with a letter or digit")
        if self.member_lease_ms < MIN_MEMBER_LEASE_MS or self.member_lease_ms % 1000:
            problems.append(f"member_lease={self.member_lease_ms}ms must be whole seconds, "
                            f"at least {MIN_MEMBER_LEASE_MS // 1000}s (etcd's leases)")
        if self.rack != self.rack.strip() or any(not ch.isprintable() for ch in self.rack):
            problems.append(f"rack={self.rack!r} must be printable with no surrounding spaces")
        if self.advertised_address and (problem := check_member_address(
                self.advertised_address)):
            problems.append(f"advertised_address {problem}")
        if self.peer_timeout_ms <= 0:
            problems.append(f"peer_timeout={self.peer_timeout_ms}ms must be > 0")
        if self.cluster_token and (self.cluster_token != self.cluster_token.strip() or any(
                ch.isspace() or not ch.isprintable() for ch in self.cluster_token)):
            problems.append("cluster_token must not contain spaces or control characters "
                            "(it travels in a gRPC metadata value)")
        if self.peer_ca_file and not Path(self.peer_ca_file).is_file():
            problems.append(f"peer_ca_file={self.peer_ca_file} is not a readable file")
        if problems:  # a ValueError: load_config reports it with every other problem
            raise ValueError("; ".join(problems))

    @property
    def coordinated(self) -> bool:
        """Whether this broker registers in etcd (``[cluster] etcd``)."""
        return bool(self.etcd)

    @property
    def enabled(self) -> bool:
        """Whether this broker is a member of a cluster (of more than itself, usually)."""
        return self.coordinated
