"""Each stream's record in etcd: where it lives, so a membership change never moves data.

``/npstream/<cluster>/streams/<name>`` holds ``{"replicas", "leader",
"leader_epoch", "isr"}`` (member ids, docs/scaling.md). The member that
creates a stream writes it, once (a transaction comparing ``version = 0``);
the member that deletes it removes it, only while it names that member; a
move rewrites it in a transaction guarded by the ``mod_revision`` it read,
so a move from a stale view fails instead of overwriting a newer owner.
Today a stream has one replica and ``leader_epoch`` stays 1; replication
will bump the epoch in the same kind of guarded transaction.

Records found are cached for ``RECORD_TTL_S`` (a record changes only at a
create, delete or move, and a redirect to a member that no longer holds a
stream is followed on by that member); a name without a record is asked
again each time.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from npstream.broker.cluster.errors import EtcdError
from npstream.broker.cluster.etcd.client import Compare, EtcdClient, KeyValue, Op
from npstream.broker.cluster.membership import cluster_prefix
from npstream.broker.cluster.tuning import (
    RECORD_CACHE_MAX,
    RECORD_CREATE_BATCH,
    RECORD_RETRY_S,
    RECORD_TTL_S,
)

if TYPE_CHECKING:
    from npstream.broker.cluster.router import Cluster

__all__ = ["OwnerRecord", "StreamRecorder", "StreamRecords"]

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class OwnerRecord:
    """A stream's replica set, leader and leader epoch (member ids)."""

    replicas: tuple[str, ...]
    leader: str
    leader_epoch: int = 1
    isr: tuple[str, ...] = field(default=())

    @classmethod
    def single(cls, member_id: str) -> OwnerRecord:
        return cls((member_id,), member_id, 1, (member_id,))

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes) -> OwnerRecord:
        fields = json.loads(raw)
        return cls(tuple(fields["replicas"]), str(fields["leader"]),
                   int(fields.get("leader_epoch", 1)), tuple(fields.get("isr", ())))


class StreamRecords:
    """The ``streams/`` records of one cluster, read through a small cache."""

    def __init__(self, client: EtcdClient, cluster_name: str) -> None:
        self.client = client
        self.prefix = cluster_prefix(cluster_name) + "streams/"
        self._cache: OrderedDict[str, tuple[OwnerRecord, float]] = OrderedDict()
        self._lock = threading.Lock()

    def key(self, stream: str) -> str:
        return self.prefix + stream

    # ------------------------------------------------------------ reads

    def read(self, stream: str) -> tuple[OwnerRecord | None, KeyValue | None]:
        """The record as etcd holds it now (and its key, for a guarded change)."""
        kv = self.client.get(self.key(stream))
        record = _decode(kv)
        self._put_cache(stream, record)
        return record, kv

    def lookup(self, stream: str) -> OwnerRecord | None:
        """The record, from the cache when read less than RECORD_TTL_S ago (EtcdError)."""
        with self._lock:
            entry = self._cache.get(stream)
            if entry is not None and entry[1] > time.monotonic():
                self._cache.move_to_end(stream)
                return entry[0]
        return self.read(stream)[0]

    def forget(self, stream: str) -> None:
        with self._lock:
            self._cache.pop(stream, None)

    def _put_cache(self, stream: str, record: OwnerRecord | None) -> None:
        """Only records are kept: a name without one may be created any moment elsewhere."""
        with self._lock:
            if record is None:
                self._cache.pop(stream, None)
                return
            self._cache[stream] = (record, time.monotonic() + RECORD_TTL_S)
            self._cache.move_to_end(stream)
            while len(self._cache) > RECORD_CACHE_MAX:
                self._cache.popitem(last=False)

    def names(self) -> set[str]:
        """Every stream with a record (one range read)."""
        items, _revision = self.client.get_prefix(self.prefix)
        return {kv.key[len(self.prefix):] for kv in items}

    # ------------------------------------------------------------ changes

    def create(self, streams: Iterable[str], member_id: str) -> list[str]:
        """Record ``member_id`` as the one replica and leader of each stream that has no
        record yet; the names whose record names another member (left as they are)."""
        names = list(dict.fromkeys(streams))
        value = OwnerRecord.single(member_id).encode()
        conflicts: list[str] = []
        for start in range(0, len(names), RECORD_CREATE_BATCH):
            batch = names[start:start + RECORD_CREATE_BATCH]
            done = self.client.txn([Compare.version(self.key(n), "=", 0) for n in batch],
                                   [Op.put(self.key(n), value) for n in batch]).succeeded
            if done:
                for name in batch:
                    self._put_cache(name, OwnerRecord.single(member_id))
                continue
            for name in batch:  # some exist: one by one
                result = self.client.txn([Compare.version(self.key(name), "=", 0)],
                                         [Op.put(self.key(name), value)],
                                         [Op.get(self.key(name))])
                record = OwnerRecord.single(member_id) if result.succeeded else _decode(
                    result.gets[0])
                self._put_cache(name, record)
                if record is not None and record.leader != member_id:
                    conflicts.append(name)
        return conflicts

    def delete_if_leader(self, stream: str, member_id: str) -> bool:
        """Delete the record while it names ``member_id`` as leader (a stream deleted there);
        whether it went."""
        record, kv = self.read(stream)
        if record is None or kv is None or record.leader != member_id:
            return False
        gone = self.client.txn([Compare.mod_revision(kv.key, "=", kv.mod_revision)],
                               [Op.delete(kv.key)]).succeeded
        self.forget(stream)
        return gone

    def move_leader(self, stream: str, source_id: str, target_id: str) -> OwnerRecord:
        """Make ``target_id`` the stream's one replica and leader, in a transaction guarded
        by the record's mod_revision; EtcdError when the record names neither member (or
        changed under the transaction): the move must not overwrite a newer owner."""
        record, kv = self.read(stream)
        moved = OwnerRecord.single(target_id)
        if record is not None and record.leader == target_id:
            return record  # done before (a resumed move)
        if record is not None and record.leader != source_id:
            raise EtcdError(f"stream '{stream}' is recorded in etcd on member "
                            f"{record.leader}, not on {source_id}: not moved")
        guard = (Compare.mod_revision(self.key(stream), "=", kv.mod_revision) if kv is not None
                 else Compare.version(self.key(stream), "=", 0))
        if not self.client.txn([guard], [Op.put(self.key(stream), moved.encode())]).succeeded:
            self.forget(stream)
            raise EtcdError(f"the etcd record of stream '{stream}' changed during its move: "
                            "not moved (retried)")
        self._put_cache(stream, moved)
        return moved


class StreamRecorder:
    """Keeps the records of this member's streams: written as they are created here,
    removed as they are deleted here. A create etcd did not take (out of reach) is
    tried again every RECORD_RETRY_S on a thread; the stream is served here meanwhile."""

    def __init__(self, cluster: Cluster) -> None:
        assert cluster.records is not None and cluster.membership is not None
        self._records = cluster.records
        self._own = cluster.membership.record.id
        self._pending: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._retry, name="stream-records",
                                        daemon=True)
        self._thread.start()

    def created(self, names: list[str]) -> None:
        """Streams just created here (the registry's created listener)."""
        try:
            conflicts = self._records.create(names, self._own)
        except EtcdError as exc:
            log.warning("%d stream(s) created here (%s) are not recorded in etcd yet: %s; "
                        "tried again every %gs", len(names), ", ".join(names[:5]), exc,
                        RECORD_RETRY_S)
            with self._lock:
                self._pending.update(names)
            return
        for name in conflicts:
            log.warning("stream '%s' was created here but etcd records it on another "
                        "member: move or delete one of the two copies", name)

    def deleted(self, name: str) -> None:
        """A stream deleted here (or moved away): its record goes while it names us."""
        with self._lock:
            self._pending.discard(name)
        try:
            self._records.delete_if_leader(name, self._own)
        except EtcdError as exc:
            log.warning("the etcd record of deleted stream '%s' stays: %s", name, exc)

    def _retry(self) -> None:
        while not self._stop.wait(RECORD_RETRY_S):
            with self._lock:
                names, self._pending = sorted(self._pending), set()
            if names:
                self.created(names)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def _decode(kv: KeyValue | None) -> OwnerRecord | None:
    if kv is None:
        return None
    try:
        return OwnerRecord.decode(kv.value)
    except (ValueError, KeyError, TypeError):
        log.warning("etcd key %s is no stream record: ignored", kv.key)
        return None
