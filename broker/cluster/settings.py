"""``[cluster]`` of broker.toml: who the members are and who this broker is among them.

Kept apart from npstream.broker.server.config (which builds it like every
other section) because the rules are the cluster's own: a member is named by
the address clients and the other members reach it at, the same string on
every member, since placement hashes over those strings. A broker without
members is a cluster of one and behaves as if this section did not exist.
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


def parse_members(value: object) -> tuple[str, ...]:
    """Members as a TOML list of "host:port" strings, or one comma-separated string (env, flag)."""
    if isinstance(value, (list, tuple)):
        items = list(value)
    elif isinstance(value, str):
        items = value.split(",")
    else:
        raise ValueError(f"expected a list of \"host:port\" strings, got {value!r}")
    members: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise ValueError(f"member {item!r} is not a \"host:port\" string")
        if item.strip():
            members.append(item.strip())
    return tuple(members)


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
    """``[cluster]``: the members (everyone's advertised address) and this broker's own.

    ``advertised_address`` "" means the listener's ``host:port``; whichever
    it is must be among ``members``. ``peer_timeout_ms`` bounds a member's
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
        for member in self.members:
            problem = check_member_address(member)
            if problem:
                problems.append(f"cluster member {problem}")
        duplicates = sorted({m for m in self.members if self.members.count(m) > 1})
        if duplicates:
            problems.append(f"cluster members list {', '.join(duplicates)} more than once")
        if self.advertised_address and not (self.members or self.etcd):
            problems.append("advertised_address is set but neither [cluster] etcd nor "
                            "members is: a broker alone is no cluster")
        if self.etcd and self.members:
            problems.append("[cluster] etcd and members are set: a cluster's members come "
                            "from etcd (--etcd); leave members (--cluster-members) empty")
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
        return bool(self.members)

    def identity(self, host: str, port: int) -> str:
        """This broker's advertised address: the configured one, else the listener's."""
        return self.advertised_address or default_advertised_address(host, port)
