"""``npstream cluster status|local``: a cluster of brokers seen and run from the command line.

``status`` asks the broker given for the members (``ClusterService.Owners``
answers with every member's address, or none without a cluster), then asks
each member for its own streams, the way members ask each other
(``x-npstream-cluster-local``): a cluster-wide ListStreams would fail as a
whole when one member is down, and the point of the command is to show which.

``local`` runs one etcd (local_etcd.py) and N brokers registered in it on this
machine as one cluster (one Python process per core is how a machine's cores
serve streams). It execs each broker as
``python -m npstream.broker`` in a subprocess: the client side never imports
the broker (the layering import-linter checks).
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import IO, Any

import grpc

from npstream.cli.common import (
    EXIT_ERROR,
    EXIT_USAGE,
    CliError,
    _pem,
    add_client_options,
    client_from_args,
    human_size,
)
from npstream.cli.local_etcd import LocalEtcd
from npstream.client.connection import Connection
from npstream.errors import BrokerUnavailable, NpstreamError
from npstream.proto import metadata_keys, pb, pb_grpc
from npstream.proto.defaults import MAX_LIST_PAGE_SIZE

__all__ = ["register"]

# How long ``status`` retries a member that does not answer before calling it
# down: long enough for a blip, short enough for a status command.
MEMBER_RETRY_SECONDS = 2.0
# How long ``local`` waits for every broker to serve, and for each to stop.
START_TIMEOUT_SECONDS = 60.0
STOP_TIMEOUT_SECONDS = 30.0
DEFAULT_LOCAL_PORT = 7070


def register(subparsers: Any) -> None:
    cluster = subparsers.add_parser(
        "cluster", help="a cluster of brokers: status, local (run one here)")
    commands = cluster.add_subparsers(dest="cluster_command", metavar="COMMAND", required=True)

    status = commands.add_parser(
        "status", help="the members of the broker's cluster: up or down, streams and bytes")
    status.add_argument("--json", action="store_true", help="print JSON")
    add_client_options(status)
    status.set_defaults(handler=_status)

    local = commands.add_parser(
        "local", help="run N brokers on consecutive ports as one cluster on this machine")
    local.add_argument("--brokers", type=int, required=True, metavar="N",
                       help="how many brokers (one per core is the usual choice)")
    local.add_argument("--data-dir", required=True, metavar="DIR",
                       help="each broker gets DIR/broker-I (and logs to DIR/broker-I.log)")
    local.add_argument("--port", type=int, default=DEFAULT_LOCAL_PORT, metavar="PORT",
                       help=f"the first broker's port; the others follow "
                            f"(default: {DEFAULT_LOCAL_PORT})")
    local.set_defaults(handler=_local)


# ---------------------------------------------------------------- status


class _MemberConnection(Connection):
    """A connection whose calls a member answers from its own streams only.

    The same metadata members send each other, so one member that is down
    does not make another member's answer fail.
    """

    def __init__(self, address: str, **kwargs: Any) -> None:
        super().__init__(address, **kwargs)
        self._metadata = (*self._metadata, (metadata_keys.CLUSTER_LOCAL, "1"))


@dataclass
class MemberStatus:
    address: str
    up: bool
    asked: bool  # the broker the command was given
    streams: int | None = None
    messages: int | None = None
    bytes: int | None = None
    error: str | None = None


def _member_status(address: str, asked: bool, args: argparse.Namespace) -> MemberStatus:
    """One member's own streams, counted; down when it cannot be reached."""
    try:
        conn = _MemberConnection(
            address, token=args.token, tls=args.tls,
            root_certificates=_pem("--ca-file", args.ca_file),
            client_cert=_pem("--client-cert", args.client_cert),
            client_key=_pem("--client-key", args.client_key),
            timeout=args.timeout, retry_deadline=min(args.retry_deadline, MEMBER_RETRY_SECONDS))
    except ValueError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    status = MemberStatus(address, up=True, asked=asked, streams=0, messages=0, bytes=0)
    try:
        token = ""
        while True:
            reply = conn.call(lambda s: s.StreamService.ListStreams, pb.ListStreamsRequest(
                page_size=MAX_LIST_PAGE_SIZE, page_token=token))
            for info in reply.streams:
                status.streams = (status.streams or 0) + 1
                status.messages = (status.messages or 0) + info.message_count
                status.bytes = (status.bytes or 0) + info.bytes_on_disk
            token = reply.next_page_token
            if not token:
                return status
    except BrokerUnavailable as exc:
        return MemberStatus(address, up=False, asked=asked, error=str(exc))
    except NpstreamError as exc:  # it answered, with a refusal: up, but no counts
        return MemberStatus(address, up=True, asked=asked, error=str(exc))
    finally:
        conn.close()


def cluster_status(args: argparse.Namespace) -> tuple[str, list[MemberStatus]]:
    """(the asked broker's identity, every member's status); one member without a cluster."""
    with client_from_args(args) as client:
        try:
            reply: pb.OwnersResponse = client.call(lambda s: s.ClusterService.Owners,
                                                    pb.OwnersRequest())
        except NpstreamError as exc:
            if exc.code != grpc.StatusCode.UNIMPLEMENTED:
                raise
            reply = pb.OwnersResponse()  # a broker older than clusters: a cluster of one
        asked = reply.self or client.address
        members = list(reply.members) or [asked]
    with ThreadPoolExecutor(max_workers=min(16, len(members))) as pool:
        statuses = list(pool.map(lambda m: _member_status(m, m == asked, args), members))
    return asked, statuses


def _status(args: argparse.Namespace) -> int:
    asked, members = cluster_status(args)
    down = [m for m in members if not m.up or m.error]
    if args.json:
        print(json.dumps({"broker": asked, "members": [asdict(m) for m in members]}, indent=2))
        return EXIT_ERROR if down else 0
    rows = [[m.address + (" *" if m.asked else ""),
             ("up" if m.up else "down") + (" (error)" if m.up and m.error else ""),
             _count(m.streams), _count(m.messages), human_size(m.bytes)] for m in members]
    header = ["MEMBER", "STATUS", "STREAMS", "MESSAGES", "BYTES"]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(cell.rjust(w) if i >= 2 else cell.ljust(w)
                        for i, (cell, w) in enumerate(zip(row, widths, strict=True))).rstrip())
    up = sum(1 for m in members if m.up)
    print(f"{len(members)} member(s), {up} up (* = the broker asked, {asked})")
    for m in down:
        print(f"{m.address}: {m.error}", file=sys.stderr)
    return EXIT_ERROR if down else 0


def _count(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


# ---------------------------------------------------------------- local


def _on_sigterm(_signum: int, _frame: FrameType | None) -> None:
    """SIGTERM stops the brokers as Ctrl-C does (no exception class of its own: every
    exception class of the package is an NpstreamError, and this one is control flow)."""
    raise KeyboardInterrupt


@dataclass
class _LocalBroker:
    address: str
    data_dir: Path
    log_path: Path
    ready: Path
    proc: subprocess.Popen[bytes]

    def log_tail(self) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return text[-2000:]


def _start(index: int, port: int, etcd: str, root: Path) -> _LocalBroker:
    data_dir = root / f"broker-{index}"
    log_path = root / f"broker-{index}.log"
    ready = root / f"broker-{index}.ready"
    ready.unlink(missing_ok=True)
    address = f"127.0.0.1:{port}"
    command = [sys.executable, "-m", "npstream.broker", "--data-dir", str(data_dir),
               "--host", "127.0.0.1", "--port", str(port), "--ready-file", str(ready),
               # consecutive gRPC ports leave no room for the default metrics port (port+1)
               "--metrics-port", "0",
               "--etcd", etcd, "--advertised-address", address]
    log: IO[bytes] = open(log_path, "ab")  # noqa: SIM115 - the child owns it
    try:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    finally:
        log.close()
    return _LocalBroker(address, data_dir, log_path, ready, proc)


def _stop_all(brokers: list[_LocalBroker]) -> None:
    """SIGTERM every broker (a clean stop: flushed, exit 0), kill any still running after."""
    for broker in brokers:
        if broker.proc.poll() is None:
            broker.proc.terminate()
    deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
    for broker in brokers:
        try:
            broker.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            broker.proc.kill()
            broker.proc.wait()


def _wait_ready(brokers: list[_LocalBroker]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    waiting = list(brokers)
    while waiting:
        for broker in list(waiting):
            if broker.proc.poll() is not None:
                raise CliError(f"broker {broker.address} exited with {broker.proc.returncode} "
                               f"while starting; its log ({broker.log_path}) ends with:\n"
                               f"{broker.log_tail()}")
            if broker.ready.exists() and broker.ready.read_text().strip():
                waiting.remove(broker)
        if waiting and time.monotonic() > deadline:
            raise CliError(f"brokers not serving after {START_TIMEOUT_SECONDS:.0f} s: "
                           + ", ".join(b.address for b in waiting))
        time.sleep(0.05)


def _wait_members(addresses: list[str]) -> None:
    """Until every broker's view of the members (from etcd, watched) lists them all."""
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    for address in addresses:
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.ClusterServiceStub(channel)
            while set(stub.Owners(pb.OwnersRequest(), timeout=10).members) < set(addresses):
                if time.monotonic() > deadline:
                    raise CliError(f"broker {address} does not list every member after "
                                   f"{START_TIMEOUT_SECONDS:.0f} s")
                time.sleep(0.05)


def _local(args: argparse.Namespace) -> int:
    count, first = args.brokers, args.port
    if count < 1:
        raise CliError(f"--brokers must be >= 1, got {count}", EXIT_USAGE)
    if first < 1 or first + count - 1 > 65535:
        raise CliError(f"--port {first} with --brokers {count} leaves the 1-65535 range",
                       EXIT_USAGE)
    root = Path(args.data_dir).expanduser()
    root.mkdir(parents=True, exist_ok=True)
    ports = [first + i for i in range(count)]
    members = [f"127.0.0.1:{port}" for port in ports]
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    brokers: list[_LocalBroker] = []
    etcd = LocalEtcd(root / "etcd", log_path=root / "etcd.log")
    try:
        try:
            etcd.start()
        except RuntimeError as exc:
            raise CliError(f"cannot start etcd for the cluster: {exc}") from None
        for index, port in enumerate(ports):
            brokers.append(_start(index, port, etcd.endpoint, root))
        _wait_ready(brokers)
        _wait_members(members)
        for broker in brokers:
            print(f"{broker.address}  pid={broker.proc.pid}  data_dir={broker.data_dir}  "
                  f"log={broker.log_path}")
        print(f"cluster of {count} broker(s) serving (etcd {etcd.endpoint} pid="
              f"{etcd.proc.pid if etcd.proc else '-'} log={etcd.log_path}); clients may use "
              f"any address, e.g. NPSTREAM_BROKER={members[0]}. Ctrl-C or SIGTERM stops them.",
              flush=True)
        while True:
            for broker in brokers:
                if broker.proc.poll() is not None:
                    raise CliError(f"broker {broker.address} exited with "
                                   f"{broker.proc.returncode}; stopping the others. Its log "
                                   f"({broker.log_path}) ends with:\n{broker.log_tail()}")
            time.sleep(0.5)
    except KeyboardInterrupt:
        print("stopping the brokers", file=sys.stderr, flush=True)
        return 0
    finally:
        # Ctrl-C in a terminal reaches the brokers too (same process group);
        # SIGTERM to this process alone does not: each gets its own.
        try:  # a second SIGTERM while stopping: kill
            _stop_all(brokers)
            etcd.stop()  # after the brokers: they leave by revoking their leases
        except KeyboardInterrupt:
            for broker in brokers:
                if broker.proc.poll() is None:
                    broker.proc.kill()
            etcd.kill()
        signal.signal(signal.SIGTERM, previous)
