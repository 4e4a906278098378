"""Broker configuration: defaults, units, precedence, and refusals with clear messages."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from harness import REPO_ROOT
from npstream.broker.__main__ import main
from npstream.broker.server.config import KEYS, SECTIONS, ConfigError, default_config, load_config
from npstream.broker.storage import StorageSettings
from npstream.proto.stream_config import StreamConfig

REPO = REPO_ROOT


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "broker.toml"
    path.write_text(text)
    return path


def test_load_config_without_file_uses_documented_defaults():
    config = load_config(None, env={})
    server = config.server
    assert (server.host, server.port, server.data_dir) == ("127.0.0.1", 7070, Path("data"))
    assert config.streams.default_max_age_ms == 7 * 86_400_000
    assert config.streams.default_max_bytes == 1 << 30
    assert config.streams.default_dedup_window_ms == 120_000
    assert config.streams.default_max_message_bytes == 1 << 20
    assert config.streams.auto_create_streams is True
    assert config.storage.max_open_files == 256
    assert config.storage.flush_interval_ms == 50
    assert config.metrics.metrics_port == 7071
    assert config.streams.default_max_message_bytes < config.server.grpc_max_message_bytes


def test_load_config_units_in_file_are_parsed(tmp_path):
    path = write(tmp_path, """
[streams]
default_max_age = "36h"
default_max_bytes = "512MiB"
default_dedup_window = 90
[storage]
flush_interval = "5ms"
max_open_files = 64
[metrics]
metrics_port = "off"
""")
    config = load_config(path, env={})
    assert config.streams.default_max_age_ms == 36 * 3_600_000
    assert config.streams.default_max_bytes == 512 << 20
    assert config.streams.default_dedup_window_ms == 90_000  # a bare duration number is seconds
    assert config.storage.flush_interval_ms == 5
    assert config.storage.max_open_files == 64
    assert config.metrics.metrics_port is None


def test_load_config_precedence_cli_over_env_over_file(tmp_path):
    path = write(tmp_path, """
[server]
port = 7001
host = "0.0.0.0"
allow_insecure = true
log_level = "ERROR"
[storage]
max_open_files = 100
""")
    env = {"NPSTREAM_PORT": "7002", "NPSTREAM_MAX_OPEN_FILES": "64",
           "NPSTREAM_LOG_LEVEL": "warning", "NPSTREAM_BROKER": "ignored:1"}
    config = load_config(path, env=env, cli={"port": 7003, "host": None})
    assert config.server.port == 7003             # CLI beats env and file
    assert config.storage.max_open_files == 64    # env beats file
    assert config.server.log_level == "WARNING"   # env beats file
    assert config.server.host == "0.0.0.0"        # file beats default; None CLI value is ignored


def test_load_config_file_from_env_variable(tmp_path):
    path = write(tmp_path, "[streams]\nauto_create_streams = false\n")
    config = load_config(None, env={"NPSTREAM_CONFIG": str(path)})
    assert config.streams.auto_create_streams is False


def test_load_config_metrics_port_env_zero_and_off():
    assert load_config(None, env={"NPSTREAM_METRICS_PORT": "0"}).metrics.metrics_port == 0
    assert load_config(None, env={"NPSTREAM_METRICS_PORT": "off"}).metrics.metrics_port is None


def test_load_config_unknown_key_names_the_key(tmp_path):
    path = write(tmp_path, "[storage]\nmax_open_file = 64\n")
    with pytest.raises(ConfigError, match=r"unknown key 'max_open_file' in \[storage\]"):
        load_config(path, env={})


def test_load_config_key_in_wrong_section_says_where_it_belongs(tmp_path):
    path = write(tmp_path, "port = 1\n")
    with pytest.raises(ConfigError, match=r"unknown key 'port'.*belongs in the \[server\]"):
        load_config(path, env={})
    path = write(tmp_path, "[server]\nmax_open_files = 1\n")
    with pytest.raises(ConfigError,
                       match=r"'max_open_files' in \[server\].*belongs in \[storage\]"):
        load_config(path, env={})


def test_load_config_bad_value_names_key_and_origin(tmp_path):
    with pytest.raises(ConfigError,
                       match=r"bad value for 'default_max_bytes' from the environment"):
        load_config(None, env={"NPSTREAM_DEFAULT_MAX_BYTES": "lots"})
    path = write(tmp_path, "[server]\nport = \"seventy\"\n")
    with pytest.raises(ConfigError, match=r"bad value for 'port' from config file"):
        load_config(path, env={})


def test_load_config_message_limit_above_half_grpc_limit_is_refused():
    with pytest.raises(ConfigError, match=r"default_max_message_bytes=33554433 must be within"):
        load_config(None, env={"NPSTREAM_DEFAULT_MAX_MESSAGE_BYTES": str(32 * 2**20 + 1)})


def test_load_config_tls_needs_both_files():
    with pytest.raises(ConfigError, match="tls_cert_file and tls_key_file must be set together"):
        load_config(None, env={"NPSTREAM_TLS_CERT_FILE": "/nonexistent.pem"})


def test_load_config_invalid_toml_is_reported(tmp_path):
    path = write(tmp_path, "[server\n")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        load_config(path, env={})


def test_main_unknown_key_exits_2_naming_the_key(tmp_path, capsys):
    path = write(tmp_path, "[streams]\nauto_create = true\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["--config", str(path), "--data-dir", str(tmp_path / "d")])
    assert exit_info.value.code == 2
    assert "unknown key 'auto_create' in [streams]" in capsys.readouterr().err


def test_each_section_object_has_exactly_the_keys_of_its_toml_section():
    config = default_config()
    for section in SECTIONS:
        settings = getattr(config, section)
        fields = {f.name for f in dataclasses.fields(settings)}
        keys = {k.field for k in KEYS if k.section == section}
        if section == "storage":
            keys.add("data_dir")  # the [server] key, which the storage engine works in
            assert settings.data_dir == config.server.data_dir
        assert fields == keys, section


def test_the_storage_section_is_what_the_storage_engine_gets():
    config = load_config(None, env={"NPSTREAM_SEGMENT_AGE": "2h", "NPSTREAM_DATA_DIR": "/x"})
    assert config.storage == StorageSettings(data_dir=Path("/x"), segment_age_ms=7_200_000)
    assert default_config().storage == StorageSettings(data_dir=Path("data"))


def test_max_open_files_has_one_minimum_for_the_broker_and_the_engine():
    with pytest.raises(ConfigError, match=r"max_open_files=7 is invalid: must be an integer >= 8"):
        load_config(None, env={"NPSTREAM_MAX_OPEN_FILES": "7"})
    with pytest.raises(ValueError, match=r"max_open_files=7 is invalid: must be an integer >= 8"):
        StorageSettings(data_dir=Path("d"), max_open_files=7)
    assert load_config(None, env={"NPSTREAM_MAX_OPEN_FILES": "8"}).storage.max_open_files == 8


def test_every_problem_of_a_section_is_reported_at_once():
    with pytest.raises(ConfigError) as error:
        load_config(None, env={"NPSTREAM_PORT": "70000", "NPSTREAM_MAX_WORKERS": "1",
                               "NPSTREAM_SEGMENT_BYTES": "1", "NPSTREAM_METADATA_SYNC": "x"})
    message = str(error.value)
    assert message.startswith("invalid broker configuration: ")
    for part in ("port=70000", "max_workers=1", "segment_bytes=1", "metadata_sync='x'"):
        assert part in message


def test_with_values_changes_fields_across_sections_and_validates_again(tmp_path):
    config = default_config().with_values(data_dir=tmp_path, port=0, metrics_port=None)
    assert config.server.data_dir == config.storage.data_dir == tmp_path
    assert (config.server.port, config.metrics.metrics_port) == (0, None)
    with pytest.raises(ConfigError, match="max_workers=1 must be at least 4"):
        config.with_values(max_workers=1)
    with pytest.raises(ConfigError, match="unknown config field"):
        config.with_values(max_open_file=64)


def test_stream_defaults_are_the_default_keys():
    config = load_config(None, env={"NPSTREAM_DEFAULT_MAX_BYTES": "0"})
    assert config.streams.stream_defaults == StreamConfig(
        max_age_ms=7 * 86_400_000, max_bytes=0, dedup_window_ms=120_000,
        max_message_bytes=1 << 20)


def test_flag_help_states_the_builtin_defaults():
    from npstream.broker.__main__ import build_parser

    text = " ".join(build_parser().format_help().split())
    defaults = {k.name: k.default for k in KEYS}
    assert f"default {defaults['host']}" in text
    assert f"default {defaults['port']};" in text
    assert f"default ./{defaults['data_dir']}" in text
    assert f"{defaults['log_level']} (default)" in text


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "broker.internal", "10.1.2.3"])
def test_non_loopback_host_without_auth_or_tls_is_refused_naming_allow_insecure(host):
    with pytest.raises(ConfigError) as error:
        load_config(None, env={}, cli={"host": host})
    message = str(error.value)
    assert "not a loopback address" in message and "neither authentication nor TLS" in message
    assert "allow_insecure = true" in message and "--allow-insecure" in message


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "localhost", "::1", "[::1]"])
def test_loopback_hosts_need_nothing(host):
    assert load_config(None, env={}, cli={"host": host}).server.host == host


def test_non_loopback_host_starts_with_auth_tls_or_allow_insecure(tmp_path):
    tokens = tmp_path / "tokens.toml"
    tokens.write_text("")
    (tmp_path / "c.pem").write_text("x")
    for env in ({"NPSTREAM_AUTH_TOKEN": "t"}, {"NPSTREAM_TOKENS_FILE": str(tokens)},
                {"NPSTREAM_ALLOW_INSECURE": "true"},
                {"NPSTREAM_TLS_CERT_FILE": str(tmp_path / "c.pem"),
                 "NPSTREAM_TLS_KEY_FILE": str(tmp_path / "c.pem")}):
        assert load_config(None, env=env, cli={"host": "0.0.0.0"}).server.host == "0.0.0.0"
    config = load_config(None, env={}, cli={"host": "0.0.0.0", "allow_insecure": True})
    assert config.server.allow_insecure


def test_an_open_console_on_a_non_loopback_metrics_host_is_refused():
    with pytest.raises(ConfigError) as error:
        load_config(None, env={}, cli={"metrics_host": "0.0.0.0"})
    message = str(error.value)
    assert "web console on metrics_host='0.0.0.0'" in message and "console = false" in message
    for env in ({"NPSTREAM_CONSOLE": "false"}, {"NPSTREAM_AUTH_TOKEN": "t"},
                {"NPSTREAM_ALLOW_INSECURE": "true"}, {"NPSTREAM_METRICS_PORT": "off"}):
        assert load_config(None, env=env, cli={"metrics_host": "0.0.0.0"}).metrics.metrics_host \
            == "0.0.0.0"


def test_main_refuses_an_insecure_bind_with_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--data-dir", str(tmp_path / "d"), "--host", "0.0.0.0"])
    assert exit_info.value.code == 2
    assert "--allow-insecure" in capsys.readouterr().err


def test_auth_section_tokens_file_must_exist_and_client_ca_needs_tls(tmp_path):
    with pytest.raises(ConfigError, match=r"tokens_file=\S+missing.toml is not a readable file"):
        load_config(None, env={"NPSTREAM_TOKENS_FILE": str(tmp_path / "missing.toml")})
    path = write(tmp_path, f'[auth]\ntokens_file = "{tmp_path / "t.toml"}"\n')
    (tmp_path / "t.toml").write_text("")
    config = load_config(path, env={})
    assert config.auth.tokens_path == tmp_path / "t.toml" and config.auth_enabled
    (tmp_path / "ca.pem").write_text("x")
    with pytest.raises(ConfigError, match=r"tls_client_ca_file .* needs TLS"):
        load_config(None, env={"NPSTREAM_TLS_CLIENT_CA_FILE": str(tmp_path / "ca.pem")})


def test_load_config_kafka_port_zero_off_auto_ephemeral_bad_refused(tmp_path):
    assert default_config().kafka.kafka_port is None  # off by default
    assert load_config(None, {}, cli={"kafka_port": "auto"}).kafka.kafka_port == 0
    assert load_config(None, {"NPSTREAM_KAFKA_PORT": "9092"}, cli={}).kafka.kafka_port == 9092
    with pytest.raises(ConfigError, match=r"kafka_port=70000 must be within 1\.\.65535"):
        load_config(None, {}, cli={"kafka_port": "70000"})
    with pytest.raises(ConfigError, match="kafka_advertised_address='nohost' must be host:port"):
        load_config(None, {"NPSTREAM_KAFKA_ADVERTISED_ADDRESS": "nohost"}, cli={})
