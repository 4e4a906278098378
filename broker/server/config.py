"""Broker configuration: defaults in code, then broker.toml, then NPSTREAM_* env, then CLI flags.

The defaults live in code (``KEYS``; the ``[storage]`` ones are
``StorageSettings``' own, and those the clients share come from
npstream.proto.defaults) so an installed package needs no file from the
repository; ``conf/broker.toml`` and docs/broker.md repeat them for operators
and tests keep them in step. Every key has one name used everywhere: in its
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

import dataclasses
import ipaddress
import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from npstream.broker.cluster.settings import ClusterSettings, parse_members
from npstream.broker.server.affinity import parse_cpu_affinity
from npstream.broker.server.errors import ConfigError
from npstream.broker.storage.settings import StorageSettings
from npstream.broker.streams.settings import StreamsSettings, allows_max_message_bytes
from npstream.proto.defaults import DEFAULT_BROKER_PORT, GRPC_MAX_MESSAGE_BYTES
from npstream.proto.units import parse_duration_ms, parse_size

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


def _parse_bool(value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in {"true", "1", "yes", "on"}:
        return True
    if isinstance(value, str) and value.strip().lower() in {"false", "0", "no", "off"}:
        return False
    raise ValueError(f"invalid boolean {value!r}: use true or false")


def _parse_int(value: object) -> int:
    if isinstance(value, bool):
        raise ValueError(f"invalid integer {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    raise ValueError(f"invalid integer {value!r}")


def _parse_str(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {value!r}")
    return value


def _parse_optional_port(value: object) -> int | None:
    """A port number, 0 for an ephemeral port, or "off" to disable the listener."""
    if isinstance(value, str) and value.strip().lower() in {"off", "false", "none", ""}:
        return None
    if value is False:
        return None
    return _parse_int(value)


def _parse_level(value: object) -> str:
    level = _parse_str(value).strip().upper()
    if level not in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}:
        raise ValueError(f"invalid log level {value!r}: use DEBUG, INFO, WARNING or ERROR")
    return level


def _parse_log_format(value: object) -> str:
    text = _parse_str(value).strip().lower()
    if text not in {"text", "json"}:
        raise ValueError(f"invalid log format {value!r}: use text or json")
    return text


def _parse_sync(value: object) -> str:
    """The mode's spelling only; StorageSettings decides which modes exist."""
    return _parse_str(value).strip().lower()


@dataclass(frozen=True)
class ConfigKey:
    """One configuration key: where it lives, how it is parsed, its default."""

    name: str  # toml key, NPSTREAM_<NAME.upper()>, and --<name> when a flag exists
    section: str
    parse: Callable[[object], object]
    default: object
    field: str  # attribute of the section's settings object (durations get an _ms suffix)


def _key(name: str, section: str, parse: Callable[[object], object], default: object,
         field: str | None = None) -> ConfigKey:
    return ConfigKey(name, section, parse, parse(default), field or name)


def _duration(name: str, section: str, default: str) -> ConfigKey:
    return _key(name, section, parse_duration_ms, default, f"{name}_ms")


_STORAGE_DEFAULTS = {f.name: f.default for f in dataclasses.fields(StorageSettings)}


def _storage(name: str, parse: Callable[[object], object], field: str | None = None) -> ConfigKey:
    """A ``[storage]`` key: its default is StorageSettings' (already a parsed value)."""
    return ConfigKey(name, "storage", parse, _STORAGE_DEFAULTS[field or name], field or name)


SECTIONS = ("server", "auth", "metrics", "streams", "storage", "sink", "cluster")

# Every key and its default (conf/broker.toml and docs/broker.md document each one).
KEYS: tuple[ConfigKey, ...] = (
    # [server]
    _key("host", "server", _parse_str, "127.0.0.1"),
    _key("port", "server", _parse_int, DEFAULT_BROKER_PORT),
    _key("data_dir", "server", lambda v: Path(_parse_str(v)) if not isinstance(v, Path) else v,
         "./data"),
    _key("log_level", "server", _parse_level, "INFO"),
    _key("log_format", "server", _parse_log_format, "text"),
    _key("max_workers", "server", _parse_int, 4096),
    _key("max_concurrent_rpcs", "server", _parse_int, 0),
    _key("max_publish_bytes_in_flight", "server", parse_size, "256MiB"),
    _key("grpc_max_message_bytes", "server", parse_size, GRPC_MAX_MESSAGE_BYTES),
    _duration("max_fetch_wait", "server", "5m"),
    _duration("shutdown_grace", "server", "10s"),
    _key("auth_token", "server", _parse_str, ""),
    _key("tls_cert_file", "server", _parse_str, ""),
    _key("tls_key_file", "server", _parse_str, ""),
    _key("tls_client_ca_file", "server", _parse_str, ""),
    _key("allow_insecure", "server", _parse_bool, False),
    _key("local_reads", "server", _parse_bool, True),
    _key("retain_freed_memory", "server", parse_size, "256MiB"),
    _key("cpu_affinity", "server", parse_cpu_affinity, "auto"),
    # [auth]
    _key("tokens_file", "auth", _parse_str, ""),
    # [metrics]
    _key("metrics_host", "metrics", _parse_str, "127.0.0.1"),
    _key("metrics_port", "metrics", _parse_optional_port, 7071),
    _key("metrics_stream_gauges_max", "metrics", _parse_int, 1000),
    _key("metrics_group_gauges_max", "metrics", _parse_int, 1000),
    _key("console", "metrics", _parse_bool, True),
    _duration("console_history", "metrics", "15m"),
    # [streams]
    _key("auto_create_streams", "streams", _parse_bool, True),
    _duration("default_max_age", "streams", "7d"),
    _key("default_max_bytes", "streams", parse_size, "1GiB"),
    _duration("default_dedup_window", "streams", "2m"),
    _key("default_max_message_bytes", "streams", parse_size, "1MiB"),
    # [storage]
    _storage("segment_bytes", parse_size),
    _storage("segment_age", parse_duration_ms, "segment_age_ms"),
    _storage("max_open_files", _parse_int),
    _storage("max_open_logs", _parse_int),
    _storage("flush_interval", parse_duration_ms, "flush_interval_ms"),
    _storage("max_batch_bytes", parse_size),
    _storage("retention_check_interval", parse_duration_ms, "retention_check_interval_ms"),
    _storage("index_interval_bytes", parse_size),
    _storage("metadata_sync", _parse_sync),
    # [sink]
    _duration("sink_staging_ttl", "sink", "1d"),
    _key("sink_adopt_min_bytes", "sink", parse_size, "4MiB"),
    _key("sink_direct_writes", "sink", _parse_bool, True),
    _key("sink_stage_inbox", "sink", _parse_bool, True),
    # [cluster]
    _key("members", "cluster", parse_members, []),
    _key("advertised_address", "cluster", _parse_str, ""),
    _duration("peer_timeout", "cluster", "5s"),
    _key("peer_ca_file", "cluster", _parse_str, ""),
    _key("cluster_token", "cluster", _parse_str, ""),
)
KEYS_BY_NAME: dict[str, ConfigKey] = {k.name: k for k in KEYS}
KEYS_BY_FIELD: dict[str, ConfigKey] = {k.field: k for k in KEYS}


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
}


@dataclass(frozen=True)
class BrokerConfig:
    """Effective broker configuration, one field per broker.toml section.

    See conf/broker.toml for what each key means. Build it with
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
        if self.cluster.enabled:
            identity = self.cluster_identity
            if not identity:
                problems.append(
                    f"[cluster] members is set but this broker listens on "
                    f"{self.server.host!r} port {self.server.port}, which is no address "
                    "another member can use: set advertised_address (--advertised-address) "
                    "to the host:port the others and clients reach it at")
            elif identity not in self.cluster.members:
                problems.append(
                    f"this broker's advertised address {identity} is not among [cluster] "
                    f"members ({', '.join(self.cluster.members)}): a broker's identity is its "
                    "advertised address, listed the same way on every member")
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

    @property
    def cluster_identity(self) -> str:
        """This broker's advertised address in its cluster ("" without one)."""
        if not self.cluster.enabled:
            return ""
        return self.cluster.identity(self.server.host, self.server.port)

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
