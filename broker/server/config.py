"""Broker configuration: defaults in code, then broker.toml, then NPSTREAM_* env, then CLI flags.

The defaults live in code (``KEYS``, config_keys.py; the ``[storage]`` ones
are ``StorageSettings``' own, and those the clients share come from
npstream.proto.defaults) so an installed package needs no file from the
repository; ``conf/broker.toml`` and docs/broker.md's key tables are generated
from that table (``make docs``). Every key has one name used everywhere: in its
toml section, as ``NPSTREAM_<NAME>`` in the environment, for the few that
have one as a ``--<name>`` flag, and as the field of its section in
``BrokerConfig`` (durations with an ``_ms`` suffix). Sizes accept "64MiB" and
durations "7d" (npstream.proto.units); a bare duration number means seconds,
as everywhere in npstream. An unknown toml key is a startup error because a
typo that silently keeps a default (say, an unlimited retention) is worse
than a refusal.

``BrokerConfig`` mirrors the file: one frozen object per section
(``config.server.port``, ``config.storage.max_open_files``), and
``config.storage`` is the very ``StorageSettings`` the storage engine gets.
Each section checks its own values when it is built and ``BrokerConfig`` the
rules that span sections, so a configuration is validated once, where it is
made; ``load_config`` reports every problem at once as a ``ConfigError``.
"""

from __future__ import annotations

import ipaddress
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from npstream.broker.cluster.settings import ClusterSettings, default_advertised_address
from npstream.broker.server.config_keys import (
    KEYS,
    KEYS_BY_FIELD,
    KEYS_BY_NAME,
    SECTIONS,
    ConfigKey,
)
from npstream.broker.server.errors import ConfigError
from npstream.broker.storage.settings import StorageSettings
from npstream.broker.streams.settings import StreamsSettings, allows_max_message_bytes

__all__ = [
    "KEYS",
    "SECTIONS",
    "AuthSettings",
    "BrokerConfig",
    "ClusterSettings",
    "ConfigError",
    "ConfigKey",
    "MetricsSettings",
    "ServerSettings",
    "SinkSettings",
    "StreamsSettings",
    "default_config",
    "is_loopback_host",
    "load_config",
]

ENV_PREFIX = "NPSTREAM_"
MIB = 1 << 20



def _refuse(problems: list[str]) -> None:
    if problems:  # all of them at once: a broker refusing to start names every fix
        raise ConfigError("; ".join(problems))


@dataclass(frozen=True)
class ServerSettings:
    """``[server]``: the process, its gRPC listener, security, memory and CPU placement."""

    host: str
    port: int
    data_dir: Path
    log_level: str
    log_format: str  # "text" (one line per record) or "json" (one object per line)
    max_workers: int
    max_concurrent_rpcs: int
    max_publish_bytes_in_flight: int  # publish memory budget (npstream.broker.rpc.budget); 0: off
    grpc_max_message_bytes: int
    max_fetch_wait_ms: int
    shutdown_grace_ms: int
    auth_token: str = field(repr=False)  # never logged
    tls_cert_file: str
    tls_key_file: str
    tls_client_ca_file: str
    allow_insecure: bool
    local_reads: bool
    retain_freed_memory: int
    cpu_affinity: str

    def __post_init__(self) -> None:
        problems: list[str] = []
        if not 0 <= self.port <= 65535:
            problems.append(f"port={self.port} must be within 0..65535")
        if self.max_workers < 4:
            problems.append(f"max_workers={self.max_workers} must be at least 4")
        if self.max_concurrent_rpcs < 0:
            problems.append(f"max_concurrent_rpcs={self.max_concurrent_rpcs} must be >= 0")
        if self.max_publish_bytes_in_flight < 0:
            problems.append(f"max_publish_bytes_in_flight={self.max_publish_bytes_in_flight} "
                            "must be >= 0 (0: no limit)")
        if self.grpc_max_message_bytes < 4 * MIB:
            problems.append(
                f"grpc_max_message_bytes={self.grpc_max_message_bytes} must be at least 4MiB"
            )
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            problems.append("tls_cert_file and tls_key_file must be set together")
        if self.tls_client_ca_file and not self.tls_cert_file:
            problems.append("tls_client_ca_file (client certificates) needs TLS: set "
                            "tls_cert_file and tls_key_file too")
        for name in ("tls_cert_file", "tls_key_file", "tls_client_ca_file"):
            value = getattr(self, name)
            if value and not Path(value).is_file():
                problems.append(f"{name}={value} is not a readable file")
        _refuse(problems)

    @property
    def max_message_bytes_limit(self) -> int:
        """Largest max_message_bytes a stream may have.

        Half the gRPC message limit, so that a Fetch reply (up to this cap of
        requested bytes plus one stored batch) and a one-message Publish both
        fit in a gRPC message.
        """
        return self.grpc_max_message_bytes // 2

    def allows_max_message_bytes(self, value: int) -> bool:
        """Whether a stream may have this max_message_bytes (the default or its own)."""
        return allows_max_message_bytes(value, self.max_message_bytes_limit)

    @property
    def tls_enabled(self) -> bool:
        return bool(self.tls_cert_file)


@dataclass(frozen=True)
class AuthSettings:
    """``[auth]``: per-stream rights of bearer tokens (npstream.broker.auth).

    The file itself is read when the broker starts (a bad one refuses the
    start) and again on SIGHUP or when it changes; here only its path is
    checked.
    """

    tokens_file: str

    def __post_init__(self) -> None:
        if self.tokens_file and not Path(self.tokens_file).is_file():
            _refuse([f"tokens_file={self.tokens_file} is not a readable file"])

    @property
    def tokens_path(self) -> Path | None:
        return Path(self.tokens_file) if self.tokens_file else None


@dataclass(frozen=True)
class MetricsSettings:
    """``[metrics]``: the HTTP port of the Prometheus endpoint and the web console.

    Per-stream and per-group series are capped (``*_gauges_max``) because a
    scrape of ten thousand streams would carry ten thousand series of each
    metric; above a cap only the broker-wide totals are exported.
    """

    metrics_host: str
    metrics_port: int | None  # None: no endpoint
    metrics_stream_gauges_max: int
    metrics_group_gauges_max: int
    console: bool  # the read-only web console at / of the same port
    console_history_ms: int  # how far back the console's charts reach

    def __post_init__(self) -> None:
        problems: list[str] = []
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            problems.append(f"metrics_port={self.metrics_port} must be within 0..65535 or 'off'")
        for name in ("metrics_stream_gauges_max", "metrics_group_gauges_max"):
            if getattr(self, name) < 0:
                problems.append(f"{name}={getattr(self, name)} must be >= 0")
        if not 10_000 <= self.console_history_ms <= 24 * 3_600_000:
            problems.append(f"console_history={self.console_history_ms}ms must be within "
                            "10s..24h")
        _refuse(problems)


@dataclass(frozen=True)
class SinkSettings:
    """``[sink]``: the Spark sink's staging."""

    sink_staging_ttl_ms: int
    sink_adopt_min_bytes: int
    sink_direct_writes: bool
    sink_stage_inbox: bool


@dataclass(frozen=True)
class KafkaSettings:
    """``[kafka]``: the Kafka protocol listener (npstream.broker.kafka, docs/kafka.md)."""

    kafka_port: int | None  # None: no listener; 0: an ephemeral port
    kafka_advertised_address: str  # host:port in Metadata; "": the listener's own
    kafka_auto_create_topics: bool

    def __post_init__(self) -> None:
        problems: list[str] = []
        if self.kafka_port is not None and not 0 <= self.kafka_port <= 65535:
            problems.append(f"kafka_port={self.kafka_port} must be within 1..65535, 0 (off) "
                            "or 'auto'")
        address = self.kafka_advertised_address
        if address and not (address.rpartition(":")[0]
                            and address.rpartition(":")[2].isdigit()):
            problems.append(f"kafka_advertised_address={address!r} must be host:port")
        _refuse(problems)


def is_loopback_host(host: str) -> bool:
    """Whether a listen address only this machine can reach (127.0.0.0/8, ::1, localhost)."""
    name = host.strip().strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:  # a host name, or "" (every interface): reachable from elsewhere
        return False


_SECTION_TYPES: dict[str, type] = {
    "server": ServerSettings,
    "auth": AuthSettings,
    "metrics": MetricsSettings,
    "streams": StreamsSettings,
    "storage": StorageSettings,
    "sink": SinkSettings,
    "cluster": ClusterSettings,
    "kafka": KafkaSettings,
}


@dataclass(frozen=True)
class BrokerConfig:
    """Effective broker configuration, one field per broker.toml section.

    See config_keys.KEYS (or conf/broker.toml) for what each key means. Build it with
    ``load_config`` or ``default_config`` and change it with ``with_values``,
    which keep ``storage.data_dir`` equal to ``server.data_dir``.
    """

    server: ServerSettings
    auth: AuthSettings
    metrics: MetricsSettings
    streams: StreamsSettings
    storage: StorageSettings
    sink: SinkSettings
    cluster: ClusterSettings
    kafka: KafkaSettings

    def __post_init__(self) -> None:
        """The rules that span sections."""
        problems: list[str] = []
        limit = self.server.max_message_bytes_limit
        if not self.server.allows_max_message_bytes(self.streams.default_max_message_bytes):
            problems.append(
                f"default_max_message_bytes={self.streams.default_max_message_bytes} must be "
                f"within 1..{limit} (half of grpc_max_message_bytes="
                f"{self.server.grpc_max_message_bytes})"
            )
        if self.storage.max_batch_bytes > limit:
            problems.append(
                f"max_batch_bytes={self.storage.max_batch_bytes} must be at most {limit} "
                f"(half of grpc_max_message_bytes) so a stored batch fits in a Fetch reply"
            )
        if not (self.auth_enabled or self.server.tls_enabled or self.server.allow_insecure
                or is_loopback_host(self.server.host)):
            problems.append(
                f"refusing to listen on {self.server.host!r}, which is not a loopback address, "
                "with neither authentication nor TLS: anyone who can reach the port could "
                "read, write and delete every stream. Set auth_token or [auth] tokens_file "
                "(and tls_cert_file/tls_key_file), or set allow_insecure = true "
                "(--allow-insecure, NPSTREAM_ALLOW_INSECURE=true) to serve openly on a "
                "trusted network")
        if (self.cluster.coordinated and not self.cluster.advertised_address
                and not default_advertised_address(self.server.host, 1)):
            problems.append(
                f"[cluster] etcd is set but this broker listens on {self.server.host!r}, "
                "which is no address another member or a client can use: set "
                "advertised_address (--advertised-address) to the host:port they reach it at")
        metrics = self.metrics
        if (metrics.metrics_port is not None and metrics.console
                and not (self.auth_enabled or self.server.tls_enabled
                         or self.server.allow_insecure
                         or is_loopback_host(metrics.metrics_host))):
            problems.append(
                f"refusing to serve the web console on metrics_host={metrics.metrics_host!r}, "
                "which is not a loopback address, with neither authentication nor TLS: anyone "
                "who can reach the port could read every stream's messages. Set auth_token or "
                "[auth] tokens_file, or console = false (NPSTREAM_CONSOLE=false) to serve only "
                "/metrics there, or allow_insecure = true (--allow-insecure) on a trusted network")
        if self.storage.data_dir != self.server.data_dir:
            problems.append(f"storage.data_dir={self.storage.data_dir} must be "
                            f"server.data_dir={self.server.data_dir}")
        _refuse(problems)

    @property
    def auth_enabled(self) -> bool:
        """Whether calls need a token (``auth_token``, or a tokens file)."""
        return bool(self.server.auth_token or self.auth.tokens_file)

    def values(self) -> dict[str, object]:
        """Every key's value by field name (``port``, ``segment_age_ms``), across sections."""
        return {k.field: getattr(getattr(self, k.section), k.field) for k in KEYS}

    def with_values(self, **changes: object) -> BrokerConfig:
        """A copy with the given fields changed (parsed values, any section), validated again."""
        unknown = sorted(set(changes) - set(KEYS_BY_FIELD))
        if unknown:
            raise ConfigError(f"unknown config field(s) {unknown}")
        return _build({**self.values(), **changes})


def _build(values: Mapping[str, object]) -> BrokerConfig:
    """The sections from {field: parsed value}; ConfigError naming every problem."""
    problems: list[str] = []
    sections: dict[str, object] = {}
    for section, settings_type in _SECTION_TYPES.items():
        fields = {k.field: values[k.field] for k in KEYS if k.section == section}
        if section == "storage":
            fields["data_dir"] = values["data_dir"]  # a [server] key the engine works in
        try:
            sections[section] = settings_type(**fields)
        except ValueError as exc:  # ConfigError, or the storage engine's InvalidArgumentError
            problems.append(str(exc))
    if not problems:
        try:
            # sections maps each section name to an instance of its _SECTION_TYPES
            # type, which a dict built in a loop cannot tell the checker.
            return BrokerConfig(**sections)  # type: ignore[arg-type]
        except ConfigError as exc:
            problems.append(str(exc))
    raise ConfigError("invalid broker configuration: " + "; ".join(problems))


def default_config() -> BrokerConfig:
    return _build({k.field: k.default for k in KEYS})


def _read_toml(path: Path) -> dict[str, object]:
    """Flatten the toml file to {key: raw value}, refusing unknown sections and keys."""
    try:
        with path.open("rb") as handle:
            document = tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    values: dict[str, object] = {}
    for top, content in document.items():
        if top not in SECTIONS:
            hint = ""
            if top in KEYS_BY_NAME:
                hint = f"; it belongs in the [{KEYS_BY_NAME[top].section}] section"
            raise ConfigError(
                f"unknown key '{top}' in {path}{hint} (sections: {', '.join(SECTIONS)})"
            )
        if not isinstance(content, dict):
            raise ConfigError(f"'{top}' in {path} must be a [{top}] table")
        for name, raw in content.items():
            key = KEYS_BY_NAME.get(name)
            if key is None or key.section != top:
                known = ", ".join(k.name for k in KEYS if k.section == top)
                hint = f"; it belongs in [{key.section}]" if key else ""
                raise ConfigError(
                    f"unknown key '{name}' in [{top}] of {path}{hint} (known keys: {known})"
                )
            values[name] = raw
    return values


def _read_env(env: Mapping[str, str]) -> dict[str, object]:
    """NPSTREAM_<KEY> variables for known keys; other NPSTREAM_* names belong to clients."""
    return {
        key.name: env[ENV_PREFIX + key.name.upper()]
        for key in KEYS
        if ENV_PREFIX + key.name.upper() in env
    }


def _parse_layer(values: Mapping[str, object], origin: str) -> dict[str, object]:
    parsed: dict[str, object] = {}
    for name, raw in values.items():
        key = KEYS_BY_NAME[name]
        try:
            parsed[key.field] = key.parse(raw)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"bad value for '{name}' from {origin}: {exc}") from None
    return parsed


def load_config(
    config_file: Path | str | None = None,
    env: Mapping[str, str] | None = None,
    cli: Mapping[str, object] | None = None,
) -> BrokerConfig:
    """Merge defaults < file < environment < CLI (None values in cli are ignored).

    ``config_file`` falls back to $NPSTREAM_CONFIG; with neither, only the
    built-in defaults, env and flags apply.
    """
    env = os.environ if env is None else env
    merged: dict[str, object] = {k.field: k.default for k in KEYS}
    path = config_file or env.get(ENV_PREFIX + "CONFIG")
    if path:
        merged.update(_parse_layer(_read_toml(Path(path)), f"config file {path}"))
    merged.update(_parse_layer(_read_env(env), "the environment"))
    cli_values = {name: v for name, v in (cli or {}).items() if v is not None}
    unknown = sorted(set(cli_values) - set(KEYS_BY_NAME))
    if unknown:
        raise ConfigError(f"unknown option(s) {unknown}")
    merged.update(_parse_layer(cli_values, "the command line"))
    return _build(merged)
