"""A broker's membership of a cluster, registered in etcd under a lease.

There is no member list to configure: a broker started with ``--etcd``
writes ``/npstream/<cluster>/members/<member id>`` (its address, rack label,
disk id and start time, as JSON) with a lease it keeps alive, and deletes it
by revoking the lease on a clean stop. A broker that dies leaves the list
when its lease runs out (``[cluster] member_lease``). Every member watches
the prefix, so each knows the current members without asking.

The member id is stable per data dir (the file ``member-id`` in it, written
on the first start): a restarted broker is the same member, wherever its
address moved. The disk id (``disk-id``) is new with every new data dir, so
a member whose disk was replaced can be told apart later (replication will
not let it lead before it caught up).

Leases give liveness only. A broker that loses etcd for longer than its
lease is dropped from the list by etcd; it logs that, keeps serving the
streams it holds, and registers again (with a new lease) once etcd answers.
Replication will fence such a broker with the leader epoch, not with time.

The key layout (docs/scaling.md), all under ``/npstream/<cluster>/``:
``members/<id>`` (this module: the live members, under their leases),
``nodes/<id>`` (this module: every member that joined, without a lease, so
that one that is down is still known and a cluster-wide answer does not
silently miss its streams) and ``streams/<name>`` (each stream's replica
set and leader epoch).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from npstream.broker.cluster.errors import EtcdError, MemberIdTaken
from npstream.broker.cluster.etcd.client import (
    Compare,
    EtcdClient,
    Event,
    LeaseKeeper,
    Op,
    Watch,
)
from npstream.broker.cluster.tuning import REREGISTER_INTERVAL_S

__all__ = [
    "DISK_ID_FILE",
    "MEMBER_ID_FILE",
    "MemberRecord",
    "Membership",
    "cluster_prefix",
    "data_dir_id",
]

log = logging.getLogger(__name__)

MEMBER_ID_FILE = "member-id"
DISK_ID_FILE = "disk-id"


def cluster_prefix(cluster_name: str) -> str:
    """Where a cluster's keys live in etcd: ``/npstream/<cluster_name>/``."""
    return f"/npstream/{cluster_name}/"


def data_dir_id(data_dir: Path, file_name: str) -> str:
    """The id kept in ``data_dir/file_name``, made (16 hex digits) on first use."""
    path = data_dir / file_name
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        text = ""
    if text:
        return text
    value = uuid.uuid4().hex[:16]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(value + "\n")
    tmp.replace(path)
    return value


@dataclass(frozen=True)
class MemberRecord:
    """What ``members/<id>`` holds: how to reach the member and what it stands on."""

    id: str
    address: str
    rack: str
    disk_id: str
    started_at: float  # Unix seconds, for people (no decision depends on a clock)

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes) -> MemberRecord:
        fields = json.loads(raw)
        return cls(str(fields["id"]), str(fields["address"]), str(fields.get("rack", "")),
                   str(fields.get("disk_id", "")), float(fields.get("started_at", 0)))


class Membership:
    """This broker's registration and its view of the cluster's members."""

    def __init__(self, client: EtcdClient, cluster_name: str, record: MemberRecord,
                 lease_ttl_s: int, on_change: Callable[[], None] | None = None) -> None:
        self.client = client
        self.cluster_name = cluster_name
        self.record = record
        self.lease_ttl_s = lease_ttl_s
        self.prefix = cluster_prefix(cluster_name) + "members/"
        self.key = self.prefix + record.id
        self.nodes_prefix = cluster_prefix(cluster_name) + "nodes/"
        self._on_change = on_change
        self._lease = 0
        self._keeper: LeaseKeeper | None = None
        self._watch: Watch | None = None
        self._nodes_watch: Watch | None = None
        self._members: dict[str, MemberRecord] = {}
        self._nodes: dict[str, MemberRecord] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._lost = threading.Event()
        self._rejoin: threading.Thread | None = None

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Register (EtcdError when etcd does not answer or the id is taken) and watch."""
        self._register()
        self._refresh()
        self._watch = self.client.watch_prefix(self.prefix, self._changed)
        self._nodes_watch = self.client.watch_prefix(self.nodes_prefix, self._changed)
        self._refresh()  # what changed between the first read and the watch's start
        self._rejoin = threading.Thread(target=self._rejoin_loop, name="etcd-membership",
                                        daemon=True)
        self._rejoin.start()

    def _register(self) -> None:
        lease = self.client.grant(self.lease_ttl_s)
        # Only when the key is absent or ours from before (a restart within the old
        # lease): a second live broker with the same id is refused.
        result = self.client.txn(
            [Compare.version(self.key, "=", 0)],
            [Op.put(self.key, self.record.encode(), lease)], [Op.get(self.key)])
        if not result.succeeded:
            held = result.gets[0]
            other = MemberRecord.decode(held.value) if held is not None else None
            if other is None or (other.address, other.disk_id) != (
                    self.record.address, self.record.disk_id):
                self.client.revoke(lease)
                where = other.address if other is not None else "an unreadable record"
                raise MemberIdTaken(
                    f"member id {self.record.id} is registered in etcd by {where} under a "
                    f"live lease: another broker runs on a copy of this data dir (remove its "
                    f"{MEMBER_ID_FILE} file to join as a new member), or one stopped without "
                    f"a clean stop less than member_lease={self.lease_ttl_s}s ago (start "
                    f"again after that)")
            # Our own registration from before a restart (same address and disk): take it over.
            self.client.put(self.key, self.record.encode(), lease=lease)
            if held is not None and held.lease:
                self.client.revoke(held.lease)
        # Known for good (no lease): a member that stopped stays one, shown down.
        self.client.put(self.nodes_prefix + self.record.id, self.record.encode())
        self._lease = lease
        self._lost.clear()
        self._keeper = self.client.keep_alive(lease, self.lease_ttl_s, self._lease_lost)
        log.info("registered cluster member %s (%s, rack %r) in etcd %s under %s "
                 "(lease %x, %ds)", self.record.id, self.record.address, self.record.rack,
                 ",".join(self.client.endpoints), self.key, lease, self.lease_ttl_s)

    def _lease_lost(self, why: str) -> None:
        log.error("cluster member %s lost its etcd registration: %s; it keeps serving the "
                  "streams it holds and registers again once etcd answers", self.record.id, why)
        self._lost.set()

    def _rejoin_loop(self) -> None:
        while not self._stopping.is_set():
            if self._lost.wait(timeout=0.5) and not self._stopping.is_set():
                if self._keeper is not None:
                    self._keeper.stop()
                try:
                    self._register()
                    self._refresh()
                except EtcdError as exc:
                    log.warning("registering cluster member %s again failed: %s",
                                self.record.id, exc)
                    self._stopping.wait(REREGISTER_INTERVAL_S)

    def stop(self) -> None:
        """Leave the cluster now: revoke the lease (the key goes with it)."""
        self._stopping.set()
        if self._rejoin is not None:
            self._rejoin.join(timeout=5)
        if self._keeper is not None:
            self._keeper.stop()
        for watch in (self._watch, self._nodes_watch):
            if watch is not None:
                watch.cancel()
        if self._lease:
            try:
                self.client.revoke(self._lease)
                log.info("cluster member %s left (lease %x revoked)", self.record.id,
                         self._lease)
            except EtcdError as exc:
                log.warning("cluster member %s could not revoke its lease (%s): it leaves "
                            "the member list when the lease runs out", self.record.id, exc)
        self.client.close()

    # ------------------------------------------------------------ the view

    def _changed(self, _events: list[Event] | None) -> None:
        try:
            self._refresh()
        except EtcdError as exc:
            log.warning("reading the cluster's members failed: %s", exc)

    def _refresh(self) -> None:
        members = self._read(self.prefix)
        nodes = self._read(self.nodes_prefix)
        with self._lock:
            changed = (members, nodes) != (self._members, self._nodes)
            self._members, self._nodes = members, nodes
        if changed:
            log.info("cluster %s members up: %s; down: %s", self.cluster_name,
                     ", ".join(f"{m.id}={m.address}" for m in members.values()) or "none",
                     ", ".join(f"{n.id}={n.address}" for n in nodes.values()
                               if n.id not in members) or "none")
            if self._on_change is not None:
                self._on_change()

    def _read(self, prefix: str) -> dict[str, MemberRecord]:
        items, _revision = self.client.get_prefix(prefix)
        records: dict[str, MemberRecord] = {}
        for kv in items:
            try:
                record = MemberRecord.decode(kv.value)
            except (ValueError, KeyError, TypeError):
                log.warning("etcd key %s is no member record: ignored", kv.key)
                continue
            records[record.id] = record
        return records

    def members(self) -> dict[str, MemberRecord]:
        """The members etcd lists now, by id (this one included while registered)."""
        with self._lock:
            return dict(self._members)

    def address_of(self, member_id: str) -> str | None:
        """The address of the member with this id, None when etcd does not list it."""
        member = self.members().get(member_id)
        return member.address if member is not None else None

    def id_of(self, address: str) -> str | None:
        """The id of the member at this address, None when etcd lists none there."""
        return next((m.id for m in self.members().values() if m.address == address), None)

    def addresses(self) -> tuple[str, ...]:
        """Every live member's address (registered under a lease now), sorted."""
        return tuple(sorted(m.address for m in self.members().values()))

    def known_addresses(self) -> tuple[str, ...]:
        """Every member that ever joined (``nodes/``) and has not been removed, up or down,
        by its last address, sorted: those a cluster-wide answer must ask."""
        with self._lock:
            known = {**self._nodes, **self._members}
        return tuple(sorted({m.address for m in known.values()}))

    @property
    def registered(self) -> bool:
        return bool(self._lease) and not self._lost.is_set()


def new_record(data_dir: Path, address: str, rack: str) -> MemberRecord:
    """This broker's record: ids from its data dir, the time it started."""
    return MemberRecord(data_dir_id(data_dir, MEMBER_ID_FILE), address, rack,
                        data_dir_id(data_dir, DISK_ID_FILE), round(time.time(), 3))
