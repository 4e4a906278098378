"""broker.toml's keys: one entry per key, with its section, parser, default and meaning.

This table is the only place a key is described: ``make docs`` (docs/generate.py)
writes conf/broker.toml and docs/broker.md's key tables from it, and
tests/docs/test_docs_fresh.py fails when they are stale. ``doc`` is Markdown
(the reference's wording); the toml comments are the same text without link
targets and backquotes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from npstream.broker.cluster.settings import parse_etcd_endpoints, parse_members
from npstream.broker.server.affinity import parse_cpu_affinity
from npstream.broker.storage.settings import StorageSettings
from npstream.proto.defaults import DEFAULT_BROKER_PORT, GRPC_MAX_MESSAGE_BYTES
from npstream.proto.units import parse_duration_ms, parse_size

__all__ = ["KEYS", "KEYS_BY_FIELD", "KEYS_BY_NAME", "SECTIONS", "ConfigKey"]


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


def _parse_kafka_port(value: object) -> int | None:
    """A port number, 0 or "off" for no listener, "auto" for an ephemeral port."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return 0
    port = _parse_optional_port(value)
    return None if port == 0 else port


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
    doc: str  # what it does, in Markdown: docs/broker.md's table and conf/broker.toml's comment
    shown: object  # the default as written ("256MiB", "7d"); parsed for [storage]


def _key(name: str, section: str, parse: Callable[[object], object], default: object,
         doc: str, field: str | None = None) -> ConfigKey:
    return ConfigKey(name, section, parse, parse(default), field or name, doc, default)


def _duration(name: str, section: str, default: str, doc: str) -> ConfigKey:
    return _key(name, section, parse_duration_ms, default, doc, f"{name}_ms")


_STORAGE_DEFAULTS = {f.name: f.default for f in dataclasses.fields(StorageSettings)}


def _storage(name: str, parse: Callable[[object], object], doc: str,
             field: str | None = None) -> ConfigKey:
    """A ``[storage]`` key: its default is StorageSettings' (already a parsed value)."""
    default = _STORAGE_DEFAULTS[field or name]
    return ConfigKey(name, "storage", parse, default, field or name, doc, default)


SECTIONS = ("server", "auth", "metrics", "streams", "storage", "sink", "cluster", "kafka")

# Every key, its default and what it does (conf/broker.toml and docs/broker.md are made from it).
KEYS: tuple[ConfigKey, ...] = (
    # [server]
    _key("host", "server", _parse_str, "127.0.0.1",
         "listen address (`--host`); any address but a loopback one (`127.0.0.0/8`, `::1`, "
         "`localhost`) needs auth (`auth_token`, `tokens_file`) or TLS, unless `allow_insecure`"),
    _key("port", "server", _parse_int, DEFAULT_BROKER_PORT,
         "gRPC port; `0` = ephemeral (`--port`)"),
    _key("data_dir", "server", lambda v: Path(_parse_str(v)) if not isinstance(v, Path) else v,
         "./data",
         "where `streams/`, `sink/`, `meta.sqlite3` live (`--data-dir`)"),
    _key("log_level", "server", _parse_level, "INFO",
         "`DEBUG`, `INFO`, `WARNING` or `ERROR` (`--log-level`)"),
    _key("log_format", "server", _parse_log_format, "text",
         "`text`: one line per record; `json`: one JSON object per line, with stream, group "
         "and offsets as fields ([Logs](#logs), `--log-format`)"),
    _key("max_workers", "server", _parse_int, 4096,
         "most RPC worker threads, made as calls need them. A waiting long poll (Fetch, Pull, "
         "Receive) and an open Subscribe stream each hold one (~45 KiB, next to no CPU), and "
         "calls past this many queue behind them, publishes included: keep it above the calls "
         "your consumers hold open (with 64, the 65th long poll makes publishes wait out the "
         "polls)"),
    _key("max_concurrent_rpcs", "server", _parse_int, 0,
         "calls accepted at once before new ones get RESOURCE_EXHAUSTED; `0` = no limit (extra"
         " calls queue for a thread)"),
    _key("max_publish_bytes_in_flight", "server", parse_size, "256MiB",
         "the publish memory budget: wire bytes of publish requests (Publish, Stage, each "
         "PublishStream request) the broker reads, decodes and writes at once. Past it a "
         "Publish or Stage is refused with RESOURCE_EXHAUSTED, reason OVERLOADED, before its "
         "request is read (the SDK retries with backoff; nothing is stored), and a "
         "PublishStream stops reading until there is room ([Overload](#overload)). `0` = no "
         "limit"),
    _key("grpc_max_message_bytes", "server", parse_size, GRPC_MAX_MESSAGE_BYTES,
         "largest gRPC message, both directions; a stream's `max_message_bytes`, "
         "`max_batch_bytes` and the bytes of a Fetch reply are at most half of it "
         "([Size limits](#size-limits))"),
    _duration("max_fetch_wait", "server", "5m",
         "longest long poll; a larger `wait_ms` is shortened"),
    _duration("shutdown_grace", "server", "10s",
         "time in-flight calls get to finish at shutdown"),
    _key("auth_token", "server", _parse_str, "",
         "when set, calls must carry `authorization: Bearer <token>`; this token has every "
         "right on every stream (the shortcut for one trusted user; a [tokens "
         "file](#access-control) gives rights per token and stream, and both may be set). "
         "Never logged"),
    _key("tls_cert_file", "server", _parse_str, "",
         "PEM certificate (chain); set with `tls_key_file` to serve TLS. `\"\"`: plaintext"),
    _key("tls_key_file", "server", _parse_str, "",
         "PEM private key"),
    _key("tls_client_ca_file", "server", _parse_str, "",
         "PEM CA certificate(s); when set (needs `tls_cert_file`), every client must present a"
         " certificate signed by one of them, else the TLS handshake fails (mutual TLS; "
         "[Security](#tls-and-mutual-tls))"),
    _key("allow_insecure", "server", _parse_bool, False,
         "serve on a `host` other than a loopback address (`127.0.0.0/8`, `::1`, `localhost`) "
         "with neither auth (`auth_token`, `tokens_file`) nor TLS. Without it such a broker "
         "refuses to start, saying so; with it, it starts and logs a warning "
         "(`--allow-insecure`)"),
    _key("local_reads", "server", _parse_bool, True,
         "let clients on this machine read stored frames straight from the segment files "
         "(`StreamReadService.Locate`, see [client.md, local reads](client.md#local-reads)); "
         "they need read access to `data_dir`. `false`: every read goes over gRPC"),
    _key("retain_freed_memory", "server", parse_size, "256MiB",
         "freed heap the broker process keeps for reuse instead of returning it to the kernel "
         "(glibc `mallopt`: mmap threshold 32 MiB, trim threshold this value). Large publish "
         "requests then reuse their buffers instead of page-faulting them in again (halved the"
       " broker's kernel CPU time publishing 200,000 x 1 KB on the 2-core dev machine); "
         "resident memory may stay up to this much higher after a burst (more when the heap is"
       " fragmented: [Overload](#overload)). `0` = the allocator's defaults; no effect "
       "without glibc. Independently of this key the broker caps glibc's arenas at 2 (the "
         "default is 8 per CPU), because every arena keeps its own freed request buffers "
         "(`npstream.broker.server.heap`)"),
    _key("cpu_affinity", "server", parse_cpu_affinity, "auto",
         "CPUs the broker process runs on. `auto`: one CPU of those the process may use "
         "(chosen by process id, so several brokers on a host spread out; nothing happens with"
         " one usable CPU). `none`: the OS places the threads. Or a CPU list as for `taskset "
         '-c`: `"1"`, `"0,2"`, `"0-3,8"` (a CPU the process may not use is a startup error). '
       "Why one CPU: the broker's Python threads run one at a time (GIL) and every call "
         "hands work between several of them (gRPC poller, pool worker, group-commit leader, "
         "the woken Fetch or Subscribe sender); on one CPU each hand-off is a local wake-up "
         "instead of a cross-CPU one (an inter-processor interrupt, a hypervisor exit on a "
         "VM). On the 2-core dev VM it cut CPU per call by ~30%, publish-to-fetch p99 from "
         "~2.1 to ~1.5 ms and in two alternating A/B runs lifted a shared group with 4 "
         "consumer processes from ~60 k to ~90-110 k msg/s (a later full run, pinned, measured"
         " 73 k: that figure is noisy), with publish, replay and Spark throughput unchanged "
         "([benchmarks.md](benchmarks.md#cpu-affinity)). Work outside the GIL (kernel copies, "
         "fsync waits, Arrow) also shares that CPU; set `none` or a wider list if a profile "
       "shows the broker's CPU saturated by it. Linux only; `auto` is a no-op elsewhere"),
    # [auth]
    _key("tokens_file", "auth", _parse_str, "",
         "TOML file of tokens and their `read`/`write`/`admin` stream globs ([Access "
         "control](#access-control)); reloaded on SIGHUP and within a second of a change (a "
         "file that fails to parse keeps the previous tokens, logged as an ERROR). "
         "Empty = only `auth_token` (if any) (`--tokens-file`, `NPSTREAM_TOKENS_FILE`)"),
    # [metrics]
    _key("metrics_host", "metrics", _parse_str, "127.0.0.1",
         "address of the HTTP port serving the Prometheus endpoint `/metrics` and the web "
         "console `/` (`--metrics-host`). With auth on, both ask for a token; with TLS on, the "
         "port serves HTTPS with the broker's certificate"),
    _key("metrics_port", "metrics", _parse_optional_port, 7071,
         'its port; `0` = ephemeral (logged at start), `"off"` = no endpoint and no console '
         "(`--metrics-port`)"),
    _key("metrics_stream_gauges_max", "metrics", _parse_int, 1000,
         "per-stream series (offsets, size, age, messages and bytes in and out) are exported "
         "only while at most this many streams are open (opened since start); above it only "
         "the broker-wide totals"),
    _key("metrics_group_gauges_max", "metrics", _parse_int, 1000,
         "per-group series (committed offset, lag, in-flight, members, counts) are exported "
         "only while at most this many groups exist; above it only `npstream_groups` and the "
         "totals"),
    _key("console", "metrics", _parse_bool, True,
         "serve the read-only [web console](#web-console) at `/` of the metrics port"),
    _duration("console_history", "metrics", "15m",
       "how far back the console's charts reach (sampled every `console_history / 180`, at "
         "least every second)"),
    # [streams]
    _key("auto_create_streams", "streams", _parse_bool, True,
         "Publish to a missing stream creates it with the defaults; `false`: NOT_FOUND"),
    _duration("default_max_age", "streams", "7d",
         "retention by age (`0` = keep forever)"),
    _key("default_max_bytes", "streams", parse_size, "1GiB",
         "retention by size (`0` = no limit)"),
    _duration("default_dedup_window", "streams", "2m",
         "a message id seen within this window is not stored again (`0` = off); 2 minutes like"
       " JetStream's duplicate window"),
    _key("default_max_message_bytes", "streams", parse_size, "1MiB",
         "largest accepted message (value + key + headers); at most half of "
         "`grpc_max_message_bytes`"),
    # [storage]
    _storage("segment_bytes", parse_size,
         "a new segment file starts past this size (or `segment_age`)"),
    _storage("segment_age", parse_duration_ms,
         "a new segment file starts past this age (or `segment_bytes`)", field="segment_age_ms"),
    _storage("max_open_files", _parse_int,
         "cap on message-data file handles, shared by all streams (LRU)"),
    _storage("max_open_logs", _parse_int,
         "streams whose log state (segment list, indexes, dedup window: a few KB each) stays "
         "in memory while idle (LRU); the others are freed when unused and reopened from "
         "their files on next use, so a million idle streams cost their metadata row, not "
         "their log state ([scaling.md](scaling.md))"),
    _storage("flush_interval", parse_duration_ms,
         "group commit: concurrent publishes are written and fsynced together at least this "
         "often; bounds the `ack=fsync` latency and the `ack=write` loss window",
         field="flush_interval_ms"),
    _storage("max_batch_bytes", parse_size,
         "largest coalesced batch written at once; at most half of `grpc_max_message_bytes`"),
    _storage("retention_check_interval", parse_duration_ms,
         "how often retention runs (a background thread)", field="retention_check_interval_ms"),
    _storage("index_interval_bytes", parse_size,
         "one index entry per this many log bytes"),
    _storage("metadata_sync", _parse_sync,
         "SQLite durability: `normal` survives process crashes (kill -9), `full` also power "
         "loss at one fsync per metadata write"),
    # [sink]
    _duration("sink_staging_ttl", "sink", "1d",
         "staged, uncommitted Spark sink data older than this is garbage-collected"),
    _key("sink_adopt_min_bytes", "sink", parse_size, "4MiB",
         "a commit turns a staged file holding at least this many bytes for one stream into a "
         "segment of that stream in place (stamped and renamed, no copy); smaller files are "
         'copied, so small micro-batches leave no trail of small segments. `"0B"` adopts every'
         " single-stream file "
         "([exactly-once.md](exactly-once.md#choices-made-where-the-design-was-silent))"),
    _key("sink_direct_writes", "sink", _parse_bool, True,
         "Stage writes staged data files with `O_DIRECT` (and the commit stamps them the same "
         "way), so staged bytes never fill the page cache; a consumer of a just-committed "
         "micro-batch then reads it from disk. Falls back to the page cache by itself where "
         "the filesystem refuses `O_DIRECT` "
         "([exactly-once.md](exactly-once.md#choices-made-where-the-design-was-silent))"),
    _key("sink_stage_inbox", "sink", _parse_bool, True,
         "a Spark task (any `SinkClient`) on this machine may hand its Stage data over in a "
         "file of `data_dir/stage-inbox/` instead of sending the bytes over gRPC, which costs "
         "more CPU than the rest of a Stage; the broker reads only plain files of that "
         "directory, checks each one (regular file, the inode the client named, long enough) "
         "and copies it before decoding. Anything unusable is refused and the client resends "
         "over gRPC. Clients need write access to the directory. `false`: every Stage carries "
         "its data ([exactly-once.md](exactly-once.md#stage-by-file-on-the-brokers-machine))"),
    # [cluster]
    _key("etcd", "cluster", parse_etcd_endpoints, [],
         "the etcd endpoints this broker registers at as a member of a "
         "[cluster](#a-cluster-of-brokers), each `\"http://host:port\"` "
         "(`--etcd http://HOST:2379,...`; in the environment one comma-separated string, "
         "`NPSTREAM_ETCD`). Any member of the etcd cluster will do; calls move to the next "
         "endpoint when one does not answer. Empty: no cluster, no etcd, this broker alone"),
    _key("cluster_name", "cluster", _parse_str, "npstream",
         "which cluster of the etcd this broker joins: its keys live under "
         "`/npstream/<cluster_name>/` ([scaling.md](scaling.md#what-a-cluster-adds)), so one "
         "etcd can hold several clusters"),
    _key("rack", "cluster", _parse_str, "",
         "this member's rack (or zone) label, recorded with its membership; replica "
         'placement will spread over distinct racks. `""`: none'),
    _duration("member_lease", "cluster", "5s",
         "the TTL of the etcd lease the membership is registered under (whole seconds, at "
         "least 2s). It is renewed every third of it; a broker killed without a clean stop "
         "leaves the member list that long after"),
    _key("members", "cluster", parse_members, [],
         "gone: the static member list of earlier versions. A cluster's members register "
         "in etcd (`etcd`); a non-empty value (or `--cluster-members`) is refused with a "
         "message pointing to `--etcd`"),
    _key("advertised_address", "cluster", _parse_str, "",
       "this broker's address as clients and the other members reach it, registered in "
         'etcd (`--advertised-address`); `""`: `host:port` of `[server]` (which must then '
         "be a usable address, not `0.0.0.0`; port 0 is the port bound)"),
    _duration("peer_timeout", "cluster", "5s",
       "how long a member waits for another (finding a stream's owner, its part of a "
         "cluster-wide list) before the call fails with `MEMBER_UNAVAILABLE`"),
    _key("peer_ca_file", "cluster", _parse_str, "",
       "with TLS on, members call each other over TLS and check the other's certificate "
         'against these PEM CA certificate(s); `""`: the system\'s roots. With '
         "`tls_client_ca_file` set, a member presents its own certificate (`tls_cert_file`) to"
         " the others, so it must be signed by a CA in their `tls_client_ca_file`"),
    _key("cluster_token", "cluster", _parse_str, "",
       "with auth on, the members' own bearer token, the same on every member (prefer "
         "`NPSTREAM_CLUSTER_TOKEN` to the file): they send each other the steps of a [stream "
         "move](#moving-a-stream) (`MoveIn`) with it, and ask each other with it whether a "
         "dead-letter stream about to be created is held elsewhere "
         "([groups.md](groups.md#redelivery-rules)), as Kafka brokers use an inter-broker "
         "principal. It has no right on any stream and may make no other call (a client "
         "presenting it is refused everything else); it must differ from every other token. "
         'With it, a move cut off by a restart of the old member finishes by itself; `""`: the'
         " steps carry the token of the admin who ran the move, which a restart forgets, and "
         "such a move waits for an admin to run it again. Ignored without auth. Never logged"),
    # [kafka]
    _key("kafka_port", "kafka", _parse_kafka_port, 0,
         "port of the [Kafka protocol listener](kafka.md) on `host` (`--kafka-port`): Kafka "
         "producers and consumers read and write streams as topics of one partition. `0` = "
         'off; `"auto"` = an ephemeral port (logged at start as `kafka=host:port`)'),
    _key("kafka_advertised_address", "kafka", _parse_str, "",
         "the `host:port` Kafka clients are told to connect to (Metadata's broker address); "
         '`""`: `host` and the port bound'),
    _key("kafka_auto_create_topics", "kafka", _parse_bool, True,
         "Metadata and Produce naming a missing topic create its stream, as Kafka's "
         "`auto.create.topics.enable` (with `[streams] auto_create_streams` also on); "
         "`false`: UNKNOWN_TOPIC_OR_PARTITION"),
)
KEYS_BY_NAME: dict[str, ConfigKey] = {k.name: k for k in KEYS}
KEYS_BY_FIELD: dict[str, ConfigKey] = {k.field: k for k in KEYS}


