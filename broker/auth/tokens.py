"""The tokens file: which bearer token may do what on which streams.

A tokens file is TOML with one ``[[tokens]]`` table per token::

    [[tokens]]
    name = "etl"                      # optional: how logs and errors name it
    token = "a-long-random-secret"    # what clients send as `Bearer <token>`
    read = ["orders", "orders-*"]     # stream-name globs (fnmatch: * ? [..])
    write = ["orders-enriched"]
    admin = []

A missing ``read``/``write``/``admin`` key grants nothing. The rights are
independent (``admin`` does not imply ``read``), so an operator can give a
cleanup job deletes without reads; docs/broker.md "Security" lists which
right each RPC needs on which stream. Globs match the whole name, case
sensitive, like ListStreams' ``pattern``. An unknown key, a duplicate or
empty token, or a glob that is not a non-empty string is refused: a typo
that silently grants nothing (or everything) is worse than a refusal.

The broker's single ``auth_token`` becomes one more entry, named
"auth_token", with every right on ``*``. The cluster's ``cluster_token``
([cluster] in broker.toml) becomes an entry named "cluster" with no right on
any stream, only ``internal``: the calls members make to each other on their
own behalf (a stream move's steps, ``ClusterService.MoveIn``), the way Kafka
brokers talk to each other as an inter-broker principal. So a member can
finish a move after a restart without keeping anybody's token, and the
cluster token read or wrote no stream if it leaked.

Secrets stay secret: an entry's ``repr`` and every message here name it by
its ``name`` (else ``tokens[i]``, its position in the file), never by the
token. Lookups hash the presented token with SHA-256 and find the entry by
that digest, then confirm with ``hmac.compare_digest``; no timing depends
on how many leading characters of a guess are right.
"""

from __future__ import annotations

import enum
import fnmatch
import hashlib
import hmac
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from npstream.broker.auth.errors import TokensFileError
from npstream.broker.auth.tuning import DECISION_CACHE_MAX

__all__ = [
    "AUTH_TOKEN_NAME",
    "CLUSTER_TOKEN_NAME",
    "Right",
    "TokenGrant",
    "TokenTable",
    "TokensFileError",
    "bearer_token",
]

# How the broker.toml ``auth_token`` entry is named in logs and errors.
AUTH_TOKEN_NAME = "auth_token"
# How the [cluster] ``cluster_token`` entry is named in logs and errors.
CLUSTER_TOKEN_NAME = "cluster"

_BEARER = "bearer "
_ENTRY_KEYS = frozenset({"name", "token", "read", "write", "admin"})


class Right(enum.Enum):
    """What a token may do on a stream (docs/broker.md "Security" maps every RPC to one)."""

    READ = "read"
    WRITE = "write"
    ADMIN = "admin"


def bearer_token(header: str | bytes | None) -> bytes | None:
    """The token of an ``authorization: Bearer <token>`` value; None when absent or malformed."""
    if header is None:
        return None
    text = header.decode("utf-8", "replace") if isinstance(header, bytes) else header
    if len(text) <= len(_BEARER) or text[: len(_BEARER)].lower() != _BEARER:
        return None
    return text[len(_BEARER):].encode()


@dataclass(frozen=True, eq=False)
class TokenGrant:
    """One token and its globs per right; ``name`` is what logs and errors show."""

    name: str
    token: bytes = field(repr=False)
    globs: Mapping[Right, tuple[str, ...]]
    # The cluster's own token (module doc): members' internal calls, no stream right.
    internal: bool = False
    # (right, stream) -> allowed. The table is rebuilt on every reload, so the cache never
    # outlives the rights it caches; cleared when full, a client cycling through many
    # stream names costs only glob matching again.
    _decisions: dict[tuple[Right, str], bool] = field(default_factory=dict, repr=False)

    def allows(self, stream: str, right: Right) -> bool:
        """Whether this token has ``right`` on ``stream`` (remembered per entry)."""
        key = (right, stream)
        decided = self._decisions.get(key)
        if decided is None:
            decided = any(fnmatch.fnmatchcase(stream, glob) for glob in self.globs[right])
            if len(self._decisions) >= DECISION_CACHE_MAX:
                self._decisions.clear()
            self._decisions[key] = decided
        return decided

    @property
    def digest(self) -> bytes:
        return hashlib.sha256(self.token).digest()


class TokenTable:
    """Every known token (immutable: a reload builds a new table and swaps it in)."""

    def __init__(self, grants: Iterable[TokenGrant] = ()) -> None:
        self._by_digest: dict[bytes, TokenGrant] = {}
        for grant in grants:
            other = self._by_digest.get(grant.digest)
            if other is not None:
                raise TokensFileError(
                    f"'{grant.name}' has the same token as '{other.name}'; each token must "
                    "appear once (merge their rights into one entry)")
            self._by_digest[grant.digest] = grant

    def __len__(self) -> int:
        return len(self._by_digest)

    @property
    def names(self) -> list[str]:
        return [grant.name for grant in self._by_digest.values()]

    def lookup(self, token: bytes | None) -> TokenGrant | None:
        """The entry of a presented token, None for no token or an unknown one."""
        if not token:
            return None
        grant = self._by_digest.get(hashlib.sha256(token).digest())
        if grant is None or not hmac.compare_digest(grant.token, token):
            return None
        return grant

    # ------------------------------------------------------------ building

    @classmethod
    def build(cls, auth_token: str = "", tokens_file: Path | None = None,
              cluster_token: str = "") -> TokenTable:
        """The table of a broker: ``auth_token`` (all rights), the cluster's token
        (internal calls only) and the tokens file's entries."""
        grants: list[TokenGrant] = []
        if auth_token:
            grants.append(TokenGrant(AUTH_TOKEN_NAME, auth_token.encode(),
                                     {right: ("*",) for right in Right}))
        if cluster_token:
            grants.append(TokenGrant(CLUSTER_TOKEN_NAME, cluster_token.encode(),
                                     {right: () for right in Right}, internal=True))
        if tokens_file is not None:
            grants.extend(read_tokens_file(tokens_file))
        return cls(grants)


def read_tokens_file(path: Path) -> list[TokenGrant]:
    """The entries of a tokens file; TokensFileError naming the file and the entry."""
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise TokensFileError(f"cannot read tokens file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise TokensFileError(f"tokens file {path} is not UTF-8 text") from None
    try:
        # The decoder's message gives line and column, never the text there.
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TokensFileError(f"tokens file {path} is not valid TOML: {exc}") from None
    return parse_tokens(document, str(path))


def parse_tokens(document: Mapping[str, object], origin: str) -> list[TokenGrant]:
    """The ``[[tokens]]`` entries of a parsed tokens file (``origin`` names it in errors)."""
    unknown = sorted(set(document) - {"tokens"})
    if unknown:
        raise TokensFileError(
            f"tokens file {origin}: unknown top-level key(s) {unknown}; write one "
            "[[tokens]] table per token")
    entries = document.get("tokens", [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise TokensFileError(f"tokens file {origin}: 'tokens' must be [[tokens]] tables")
    return [_grant(entry, index, origin) for index, entry in enumerate(entries)]


def _grant(entry: Mapping[str, object], index: int, origin: str) -> TokenGrant:
    label = f"tokens[{index}]"
    name = entry.get("name", label)
    if not isinstance(name, str) or not name.strip():
        raise TokensFileError(f"tokens file {origin}, {label}: 'name' must be a non-empty "
                              "string")
    where = f"tokens file {origin}, {label}" + (f" ('{name}')" if name != label else "")
    unknown = sorted(set(entry) - _ENTRY_KEYS)
    if unknown:
        raise TokensFileError(f"{where}: unknown key(s) {unknown} (known: token, name, read, "
                              "write, admin)")
    token = entry.get("token")
    if not isinstance(token, str) or not token:
        raise TokensFileError(f"{where}: 'token' must be a non-empty string")
    if token != token.strip() or any(ch.isspace() or not ch.isprintable() for ch in token):
        raise TokensFileError(f"{where}: 'token' must not contain spaces or control "
                              "characters (it travels in a gRPC metadata value)")
    globs = {right: _globs(entry.get(right.value, []), f"{where}: '{right.value}'")
             for right in Right}
    return TokenGrant(name, token.encode(), globs)


def _globs(value: object, where: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise TokensFileError(f"{where} must be a list of stream-name globs, e.g. "
                              "[\"orders-*\"]")
    bad = [g for g in value if not isinstance(g, str) or not g.strip()]
    if bad:
        raise TokensFileError(f"{where}: {bad!r} is not a glob (use non-empty strings)")
    return tuple(value)

