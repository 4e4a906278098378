"""Broker configuration: defaults in code, then broker.toml, then NPSTREAM_* env, then CLI flags.

The defaults live here (``KEYS``) so an installed package needs no file from
the repository; ``conf/broker.toml`` repeats them with comments for operators
and a test keeps the two in step. Every key has one name used everywhere: in
its toml section, as ``NPSTREAM_<NAME>`` in the environment and, for the few
that have one, as a ``--<name>`` flag. Sizes accept "64MiB" and durations
"7d" (npstream.proto.units); a bare duration number means seconds, as everywhere in
npstream. An unknown toml key is a startup error because a typo that silently
keeps a default (say, an unlimited retention) is worse than a refusal.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from npstream.broker.server.affinity import parse_cpu_affinity
from npstream.proto.units import parse_duration_ms, parse_size

__all__ = ["KEYS", "SECTIONS", "BrokerConfig", "ConfigError", "ConfigKey", "load_config"]

ENV_PREFIX = "NPSTREAM_"
MIB = 1 << 20


class ConfigError(ValueError):
    """A configuration value or file the broker refuses to start with."""


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


def _parse_sync(value: object) -> str:
    mode = _parse_str(value).strip().lower()
    if mode not in {"normal", "full"}:
        raise ValueError(f"invalid metadata_sync {value!r}: use normal or full")
    return mode


@dataclass(frozen=True)
class ConfigKey:
    """One configuration key: where it lives, how it is parsed, its default."""

    name: str  # toml key, NPSTREAM_<NAME.upper()>, and --<name> when a flag exists
    section: str
    parse: Callable[[object], object]
    default: object
    field: str  # BrokerConfig attribute (durations get an _ms suffix)


def _key(name: str, section: str, parse: Callable[[object], object], default: object,
         field: str | None = None) -> ConfigKey:
    return ConfigKey(name, section, parse, parse(default), field or name)


def _duration(name: str, section: str, default: str) -> ConfigKey:
    return _key(name, section, parse_duration_ms, default, f"{name}_ms")


SECTIONS = ("server", "metrics", "streams", "storage", "sink")

# The single source of every default (conf/broker.toml documents each one).
KEYS: tuple[ConfigKey, ...] = (
    # [server]
    _key("host", "server", _parse_str, "127.0.0.1"),
    _key("port", "server", _parse_int, 7070),
    _key("data_dir", "server", lambda v: Path(_parse_str(v)) if not isinstance(v, Path) else v,
         "./data"),
    _key("log_level", "server", _parse_level, "INFO"),
    _key("max_workers", "server", _parse_int, 64),
    _key("max_concurrent_rpcs", "server", _parse_int, 0),
    _key("grpc_max_message_bytes", "server", parse_size, "64MiB"),
    _duration("max_fetch_wait", "server", "5m"),
    _duration("shutdown_grace", "server", "10s"),
    _key("auth_token", "server", _parse_str, ""),
    _key("tls_cert_file", "server", _parse_str, ""),
    _key("tls_key_file", "server", _parse_str, ""),
    _key("local_reads", "server", _parse_bool, True),
    _key("retain_freed_memory", "server", parse_size, "256MiB"),
    _key("cpu_affinity", "server", parse_cpu_affinity, "auto"),
    # [metrics]
    _key("metrics_host", "metrics", _parse_str, "127.0.0.1"),
    _key("metrics_port", "metrics", _parse_optional_port, 7071),
    _key("metrics_stream_gauges_max", "metrics", _parse_int, 1000),
    # [streams]
    _key("auto_create_streams", "streams", _parse_bool, True),
    _duration("default_max_age", "streams", "7d"),
    _key("default_max_bytes", "streams", parse_size, "1GiB"),
    _duration("default_dedup_window", "streams", "2m"),
    _key("default_max_message_bytes", "streams", parse_size, "1MiB"),
    # [storage]
    _key("segment_bytes", "storage", parse_size, "64MiB"),
    _duration("segment_age", "storage", "1d"),
    _key("max_open_files", "storage", _parse_int, 256),
    _duration("flush_interval", "storage", "50ms"),
    _key("max_batch_bytes", "storage", parse_size, "8MiB"),
    _duration("retention_check_interval", "storage", "5s"),
    _key("index_interval_bytes", "storage", parse_size, "4KiB"),
    _key("metadata_sync", "storage", _parse_sync, "normal"),
    # [sink]
    _duration("sink_staging_ttl", "sink", "1d"),
    _key("sink_adopt_min_bytes", "sink", parse_size, "4MiB"),
    _key("sink_direct_writes", "sink", _parse_bool, True),
    _key("sink_stage_inbox", "sink", _parse_bool, True),
)
KEYS_BY_NAME: dict[str, ConfigKey] = {k.name: k for k in KEYS}


@dataclass(frozen=True)
class BrokerConfig:
    """Effective broker configuration; see conf/broker.toml for what each field means."""

    host: str
    port: int
    data_dir: Path
    log_level: str
    max_workers: int
    max_concurrent_rpcs: int
    grpc_max_message_bytes: int
    max_fetch_wait_ms: int
    shutdown_grace_ms: int
    auth_token: str = field(repr=False)  # never logged
    tls_cert_file: str
    tls_key_file: str
    local_reads: bool
    retain_freed_memory: int
    cpu_affinity: str
    metrics_host: str
    metrics_port: int | None
    metrics_stream_gauges_max: int
    auto_create_streams: bool
    default_max_age_ms: int
    default_max_bytes: int
    default_dedup_window_ms: int
    default_max_message_bytes: int
    segment_bytes: int
    segment_age_ms: int
    max_open_files: int
    flush_interval_ms: int
    max_batch_bytes: int
    retention_check_interval_ms: int
    index_interval_bytes: int
    metadata_sync: str
    sink_staging_ttl_ms: int
    sink_adopt_min_bytes: int
    sink_direct_writes: bool
    sink_stage_inbox: bool

    @property
    def max_message_bytes_limit(self) -> int:
        """Largest max_message_bytes a stream may have.

        Half the gRPC message limit, so that a Fetch reply (up to this cap of
        requested bytes plus one stored batch) and a one-message Publish both
        fit in a gRPC message.
        """
        return self.grpc_max_message_bytes // 2

    @property
    def tls_enabled(self) -> bool:
        return bool(self.tls_cert_file)

    def replace(self, **changes: object) -> BrokerConfig:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


def default_config() -> BrokerConfig:
    return BrokerConfig(**{k.field: k.default for k in KEYS})


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


def _validate(config: BrokerConfig) -> None:
    """Refuse combinations that would fail later, at a worse time."""
    problems: list[str] = []
    if not 0 <= config.port <= 65535:
        problems.append(f"port={config.port} must be within 0..65535")
    if config.metrics_port is not None and not 0 <= config.metrics_port <= 65535:
        problems.append(f"metrics_port={config.metrics_port} must be within 0..65535 or 'off'")
    if config.max_workers < 4:
        problems.append(f"max_workers={config.max_workers} must be at least 4")
    if config.max_concurrent_rpcs < 0:
        problems.append(f"max_concurrent_rpcs={config.max_concurrent_rpcs} must be >= 0")
    if config.max_open_files < 8:
        problems.append(f"max_open_files={config.max_open_files} must be at least 8")
    if config.grpc_max_message_bytes < 4 * MIB:
        problems.append(
            f"grpc_max_message_bytes={config.grpc_max_message_bytes} must be at least 4MiB"
        )
    limit = config.max_message_bytes_limit
    if not 1 <= config.default_max_message_bytes <= limit:
        problems.append(
            f"default_max_message_bytes={config.default_max_message_bytes} must be within "
            f"1..{limit} (half of grpc_max_message_bytes={config.grpc_max_message_bytes})"
        )
    if config.max_batch_bytes > limit:
        problems.append(
            f"max_batch_bytes={config.max_batch_bytes} must be at most {limit} "
            f"(half of grpc_max_message_bytes) so a stored batch fits in a Fetch reply"
        )
    if config.segment_bytes < 1024:
        problems.append(f"segment_bytes={config.segment_bytes} must be at least 1KiB")
    if config.flush_interval_ms < 1 or config.retention_check_interval_ms < 1:
        problems.append("flush_interval and retention_check_interval must be at least 1ms")
    if bool(config.tls_cert_file) != bool(config.tls_key_file):
        problems.append("tls_cert_file and tls_key_file must be set together")
    for name in ("tls_cert_file", "tls_key_file"):
        value = getattr(config, name)
        if value and not Path(value).is_file():
            problems.append(f"{name}={value} is not a readable file")
    if problems:
        raise ConfigError("invalid broker configuration: " + "; ".join(problems))


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
    config = BrokerConfig(**merged)  # type: ignore[arg-type]
    _validate(config)
    return config
