"""``python -m npstream.broker`` and ``npstream broker``: run one broker process.

Flags override NPSTREAM_* environment variables, which override the toml file,
which overrides the built-in defaults (npstream.broker.server.config).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

__all__ = ["build_parser", "main"]


def build_parser(prog: str = "python -m npstream.broker") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="Run the npstream broker.")
    parser.add_argument("--config", type=Path,
                        help="broker.toml to read (default: $NPSTREAM_CONFIG, else built-ins)")
    parser.add_argument("--data-dir", help="where streams and metadata live (default ./data)")
    parser.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="gRPC port (default 7070; 0 picks a free one)")
    parser.add_argument("--ready-file", type=Path,
                        help="write host:port here once serving (removed at stop)")
    parser.add_argument("--log-level", help="DEBUG, INFO (default), WARNING or ERROR")
    parser.add_argument("--log-format", choices=("text", "json"),
                        help="text (default) or json: one JSON object per line")
    parser.add_argument("--metrics-host",
                        help="address of the metrics and web console HTTP port "
                             "(default 127.0.0.1)")
    parser.add_argument("--metrics-port",
                        help="HTTP port of /metrics and the web console (default 7071; "
                             "0 picks a free one; off: none)")
    parser.add_argument("--kafka-port",
                        help="serve the Kafka protocol on this port (default 0: off; "
                             "auto picks a free one; docs/kafka.md)")
    parser.add_argument("--tokens-file", type=Path,
                        help="TOML file of tokens and their read/write/admin stream globs "
                             "(reloaded on SIGHUP and when it changes; docs/broker.md)")
    parser.add_argument("--allow-insecure", action="store_true", default=None,
                        help="serve on a non-loopback address without auth or TLS "
                             "(refused otherwise)")
    parser.add_argument("--cluster-members", metavar="A,B,...", help=argparse.SUPPRESS)
    parser.add_argument("--etcd", metavar="http://HOST:2379[,...]",
                        help="join a cluster of brokers: register as a member in this etcd "
                             "(default: none, a broker alone with no etcd)")
    parser.add_argument("--cluster-name", metavar="NAME",
                        help="which cluster of the etcd to join (default npstream)")
    parser.add_argument("--advertised-address", metavar="HOST:PORT",
                        help="this broker's address for clients and the other members "
                             "(default: --host:--port)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.cluster_members is not None:
        from npstream.broker.cluster.settings import MEMBERS_GONE

        parser.error(MEMBERS_GONE)
    # Imported after parsing so that --help works even when a dependency is broken.
    from npstream.broker.server.config import ConfigError, load_config

    try:
        config = load_config(args.config, os.environ, cli={
            "data_dir": args.data_dir, "host": args.host, "port": args.port,
            "log_level": args.log_level, "log_format": args.log_format,
            "metrics_host": args.metrics_host, "metrics_port": args.metrics_port,
            "kafka_port": args.kafka_port,
            "tokens_file": str(args.tokens_file) if args.tokens_file else None,
            "allow_insecure": args.allow_insecure,
            "advertised_address": args.advertised_address,
            "etcd": args.etcd, "cluster_name": args.cluster_name,
        })
    except ConfigError as exc:
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    from npstream.broker.server.logs import configure_logging

    configure_logging(config.server.log_level, config.server.log_format)
    from npstream.broker.server.affinity import apply_cpu_affinity
    from npstream.broker.server.heap import retain_freed_memory

    retain_freed_memory(config.server.retain_freed_memory)
    try:
        apply_cpu_affinity(config.server.cpu_affinity)
    except (ValueError, OSError) as exc:
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    from npstream.broker.server.process import run

    return run(config, ready_file=args.ready_file)


if __name__ == "__main__":
    sys.exit(main())
