"""Moving a stream to another member: pause, copy, switch, remove; resumable after any crash.

``npstream streams move NAME --to MEMBER`` calls ``ClusterService.MoveStream``
on the stream's holder (any other member redirects there), which runs the
move as a state machine whose state is a row of its metadata SQLite
(move_state.py), in the spirit of Kafka's partition reassignment: every step
is durable before the next one relies on it, and every step can be repeated.

0. **drain** (in memory only): new sink Stage calls into the stream are
   refused (STREAM_MOVING; writers send them again, to the new member in
   the end) while the batches already staged into it here commit, for up to
   ``DRAIN_WAIT_S``. Staged rows can only commit on the member they were
   staged on, and a writer's batch may be committed on another member
   already (a batch spanning members): were the stream to move under
   them, the batch replayed at the new member would find it committed
   there and leave these rows out. So a batch still uncommitted after the
   wait (a writer that died, or a slow one) makes the move fail
   (MOVE_FAILED, naming the sink and batch; nothing changed) until that
   batch is committed or aborted. The check is repeated once the stream is
   paused.
1. **pause** (state ``copying``, recorded first): the stream's calls are
   refused with STREAM_MOVING (clients send them again), running ones are
   waited for, groups leave memory with their positions written, and the
   log is closed, so its files are complete and still.
2. **copy**: the target forgets any earlier attempt (``MOVE_STEP_BEGIN``),
   then receives every file of the stream's directory (``MOVE_STEP_FILE``):
   segments, indexes, start offset. Offsets, timestamps and producer ids
   travel byte for byte, so the dedup window the target rebuilds from the
   log is the same.
3. **switch** (state ``switching`` first, then ``MOVE_STEP_INSTALL``): the
   target installs the stream in one SQLite transaction: the state records
   every owner of per-stream state exported here (npstream.broker.handover;
   ``ctx.state_owners``): its registry row and value schemas, its groups
   (cursor positions, shared groups' committed offsets, settings and
   dead-letter counts; leases do not survive, as over a restart), the sink
   floors (per sink, the last batch already in the stream), its listing
   stats; and a ``moves_in`` row for this move id. The mover reads no
   package's tables: it orchestrates. From ``switching`` on the move
   never goes back: the target may own the stream already.
4. **remove** (state ``removing``): this member redirects every call to the
   target and deletes its copy (files, rows, groups), then records ``done``.

A dead-letter stream lives with its group's stream (docs/groups.md), so the
stream's shared groups' dead-letter streams held here move with it, each as
a move of its own right after it, unless a group of another stream here
uses them too.

Who owns the stream at each point, whatever crashed: this member until the
target's install transaction commits; the target from then on. In between,
between the target's commit and this member learning of it, the stream is
paused here (``switching``), so at most one member takes writes at any time,
and once this member resumes (at start, or on its next retry) exactly one
holds it. A move that cannot reach its target stays paused and is retried
every ``RESUME_INTERVAL_S``; one still ``copying`` can be cancelled by moving
the stream to its holder.

With auth on, the target checks each step's token: the cluster's own
(``[cluster] cluster_token``, an inter-broker principal that may make these
calls and nothing else) when it is set, so a move interrupted by a restart
resumes by itself, and no user token is ever kept. Without it, the steps
carry the admin's token that ran the command, which a restart forgets: the
move then resumes when an admin runs the command again.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import grpc

from npstream.broker import faults
from npstream.broker.cluster.move_state import MoveBook, MoveRecord
from npstream.broker.cluster.peers import forwarded_metadata, member_metadata
from npstream.broker.cluster.tuning import (
    CHUNK_BYTES,
    DRAIN_POLL_S,
    DRAIN_WAIT_S,
    PAUSE_WAIT_S,
    RESUME_INTERVAL_S,
    STEP_TIMEOUT_S,
)
from npstream.broker.errors import (
    AlreadyExistsError,
    BrokerError,
    InvalidArgumentError,
    MemberUnavailableError,
    MoveFailedError,
    NotOwnerError,
    StreamNotFoundError,
)
from npstream.broker.groups.handover import GROUP, GroupsOwner
from npstream.broker.handover import encode_records, export_stream
from npstream.broker.log_events import event_fields
from npstream.broker.sink.handover import SinkFloorsOwner
from npstream.broker.sink.staging import STAGING_DIR
from npstream.broker.storage.files import stream_dir
from npstream.proto import metadata_keys, pb

if TYPE_CHECKING:
    from npstream.broker.server.context import BrokerContext

__all__ = ["MOVE_IN_METHOD", "Mover"]

log = logging.getLogger(__name__)

MOVE_IN_METHOD = "/npstream.v1.ClusterService/MoveIn"
# A resumed move's calls when no token is known (after a restart, no cluster_token).
_MEMBER_ONLY = ((metadata_keys.CLUSTER_LOCAL, "1"),)



def _staged_refusal(stream: str, waiting: list[tuple[str, int]], waited_s: float) -> str:
    batches = ", ".join(f"sink '{sink}' batch {batch}" for sink, batch in waiting)
    waited = f" and were not committed within {waited_s:g}s" if waited_s else ""
    return (f"stream '{stream}' is not moved: rows of {batches} are staged into it on this "
            f"member{waited}, and they can only be committed here. Let the writer commit or "
            "abort that batch (a stopped Spark query: start it again, it commits the batch; "
            "or SinkClient.abort), or wait for sink_staging_ttl to drop them, then run the "
            "move again")


class Mover:
    """This member's side of moving its streams away (module doc). Thread-safe."""

    def __init__(self, ctx: BrokerContext, book: MoveBook) -> None:
        self._ctx = ctx
        self._book = book
        # What the groups and the sink say about moving a stream (besides its records).
        self._groups = GroupsOwner(ctx.metadata)
        self._sinks = SinkFloorsOwner(ctx.metadata)
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        # The last caller's metadata per move (its token), for retries after a failure.
        self._callers: dict[str, tuple[tuple[str, str], ...]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # With auth on and a cluster token set, every step is sent as the cluster.
        self._own = (member_metadata(ctx.config.cluster.cluster_token)
                     if ctx.access.enabled else None)

    def start(self) -> None:
        """Resume unfinished moves now and keep retrying them (a thread)."""
        self._thread = threading.Thread(target=self._resume_loop, name="npstream-moves",
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _lock(self, stream: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(stream, threading.Lock())

    # ------------------------------------------------------------ MoveStream

    def move(self, stream: str, target: str,
             context: grpc.ServicerContext) -> pb.MoveStreamResponse:
        """Move ``stream`` to ``target`` now (or finish its unfinished move); see module doc."""
        cluster = self._ctx.cluster
        if target not in cluster.members:
            raise InvalidArgumentError(
                f"'{target}' is not a member of the cluster ({', '.join(cluster.members)})")
        metadata = self._own or forwarded_metadata(context)
        with self._lock(stream):
            record = self._book.active(stream)
            if target == cluster.identity:
                if record is not None and record.state == "copying":
                    self._cancel(record, metadata)
                    return pb.MoveStreamResponse(stream=stream, source=cluster.identity,
                                                 target=target, already_there=True)
                if record is None:
                    if stream not in self._ctx.registry:
                        self._gone(stream)
                    return pb.MoveStreamResponse(stream=stream, source=cluster.identity,
                                                 target=target, already_there=True)
            if record is not None and record.target != target:
                raise MoveFailedError(f"stream '{stream}' is being moved to {record.target} "
                                      f"already; run the move to {record.target} again to "
                                      "finish it first")
            if record is None:
                if stream not in self._ctx.registry:
                    self._gone(stream)
                self._check_no_pending_sink(stream)
                try:
                    self._drain(stream, target)
                    record = self._book.begin(stream, target)  # paused from here on
                finally:
                    self._book.undrain(stream)
                log.info("moving stream '%s' to %s (move %s)", stream, target, record.move_id,
                         extra=event_fields(stream=stream))
                faults.hit("move.paused", stream)
            dead_letters = self._dead_letter_streams(stream)
            self._callers[stream] = metadata
            reply = self._run(record, metadata)
        for name in dead_letters:  # each one its own move, after the stream's
            with self._lock(name):
                if name not in self._ctx.registry or self._book.active(name) is not None:
                    continue
                self._check_no_pending_sink(name)
                moved = self._book.begin(name, target)
                log.info("moving dead-letter stream '%s' with '%s' to %s", name, stream, target,
                         extra=event_fields(stream=name))
                self._run(moved, metadata)
                reply.dead_letter_streams.append(name)
        return reply

    def _dead_letter_streams(self, stream: str) -> list[str]:
        """The dead-letter streams of ``stream``'s shared groups that go with it (module doc)."""
        return [name for name in self._groups.dead_letter_streams(stream)
                if name in self._ctx.registry]

    def _gone(self, stream: str) -> None:
        """A stream not held here: it moved away meanwhile (a redirect), or it does not exist.

        A MoveStream routed here while the stream was paused waits for the
        stream's lock; a move finishing meanwhile (resumed after a restart)
        leaves the stream on its target, where the redirect sends the call.
        """
        target = self._book.moved_away(stream)
        if target is not None:
            raise NotOwnerError(stream, target, True)
        raise StreamNotFoundError(stream)

    def _check_no_pending_sink(self, stream: str) -> None:
        for sink_id in self._sinks.pending_into(stream):
            raise MoveFailedError(
                f"stream '{stream}' is a target of sink '{sink_id}''s unfinished commit; "
                "the move starts once that commit is finished (retried by its writer)")

    def _drain(self, stream: str, target: str) -> None:
        """Step 0 (module doc): refuse new stagings, let the staged batches commit."""
        self._book.drain(stream, target)
        deadline = time.monotonic() + DRAIN_WAIT_S
        self._book.wait_stages(stream, DRAIN_WAIT_S)
        started, waited_for = time.monotonic(), ""
        while True:
            waiting = self._staged_batches(stream)
            if not waiting:
                if waited_for:
                    log.info("stream '%s': %s committed before its move (waited %.0f ms)",
                             stream, waited_for, (time.monotonic() - started) * 1000,
                             extra=event_fields(stream=stream))
                return
            waited_for = ", ".join(f"sink '{sink}' batch {batch}" for sink, batch in waiting)
            if time.monotonic() >= deadline:
                raise MoveFailedError(_staged_refusal(stream, waiting, DRAIN_WAIT_S))
            time.sleep(DRAIN_POLL_S)

    def _check_no_staged_batches(self, stream: str) -> None:
        """MoveFailedError when rows of an uncommitted sink batch are staged into ``stream``."""
        waiting = self._staged_batches(stream)
        if waiting:
            raise MoveFailedError(_staged_refusal(stream, waiting, 0))

    def _staged_batches(self, stream: str) -> list[tuple[str, int]]:
        return self._sinks.staged_batches(self._ctx.config.server.data_dir / STAGING_DIR,
                                          stream)

    def _cancel(self, record: MoveRecord, metadata: Sequence[tuple[str, str]]) -> None:
        """Cancel a move still copying: the target drops what it got; served here again."""
        try:
            self._step(record, metadata, pb.MoveInRequest(step=pb.MOVE_STEP_ABORT))
        except MemberUnavailableError as exc:
            log.warning("move of '%s' cancelled; %s keeps the files it received until the "
                        "next move there (%s)", record.stream, record.target, exc)
        self._book.cancel(record)
        log.info("move of stream '%s' to %s cancelled; served here again", record.stream,
                 record.target, extra=event_fields(stream=record.stream))

    # ------------------------------------------------------------ the steps

    def _run(self, record: MoveRecord, metadata: Sequence[tuple[str, str]],
             ) -> pb.MoveStreamResponse:
        """Take ``record`` from its state to ``done``; the caller holds the stream's lock."""
        stream, started = record.stream, time.monotonic()
        reply = pb.MoveStreamResponse(stream=stream, source=self._ctx.cluster.identity,
                                      target=record.target)
        if record.state in ("copying", "switching"):
            end_offset = self._pause(stream)
            if record.state == "copying":
                try:  # a commit that began before the pause must finish here first
                    self._check_no_pending_sink(stream)
                    self._check_no_staged_batches(stream)
                except MoveFailedError:
                    self._book.cancel(record)
                    raise
            begun = self._step(record, metadata, pb.MoveInRequest(step=pb.MOVE_STEP_BEGIN))
            if not begun.installed:
                state, sent = self._copy(record, metadata, end_offset)
                reply.bytes, reply.groups = sent, state["groups"]
                faults.hit("move.copied", stream)
                if record.state == "copying":
                    record = self._book.advance(record, "switching")
                    faults.hit("move.switching", stream)
                self._step(record, metadata, pb.MoveInRequest(
                    step=pb.MOVE_STEP_INSTALL, state_json=json.dumps(state).encode()))
            reply.end_offset = end_offset
            self._ctx.cluster.record_moved(stream, record.target)
            record = self._book.advance(record, "removing")
            faults.hit("move.switched", stream)
        if record.state == "removing":
            self._ctx.registry.delete(stream)  # files, rows, groups and sink records
            faults.hit("move.removed", stream)
            record = self._book.advance(record, "done")
        self._callers.pop(stream, None)
        reply.paused_ms = int((time.monotonic() - started) * 1000)
        log.info("moved stream '%s' to %s (move %s): %d bytes, %d group(s), end offset %d",
                 stream, record.target, record.move_id, reply.bytes, reply.groups,
                 reply.end_offset, extra=event_fields(stream=stream))
        return reply

    def _pause(self, stream: str) -> int:
        """Quiesce a paused stream (module doc, step 1); its end offset."""
        for listener in list(self._ctx.on_stream_leaving):
            listener(stream)
        # Stage calls writing rows for it too: the staged-batch check after the pause
        # must see every staging that exists.
        if not (self._book.wait_idle(stream, PAUSE_WAIT_S)
                and self._book.wait_stages(stream, PAUSE_WAIT_S)):
            raise MoveFailedError(f"calls on stream '{stream}' did not end within "
                                  f"{PAUSE_WAIT_S:g}s of its pause; the move goes on when "
                                  "they have (run it again)")
        end_offset = self._ctx.registry.get(stream).end_offset
        self._ctx.registry.close_log(stream)
        return end_offset

    def _copy(self, record: MoveRecord, metadata: Sequence[tuple[str, str]],
              end_offset: int) -> tuple[dict[str, Any], int]:
        """Send every file of the stream; (its metadata for the install, bytes sent)."""
        directory = stream_dir(self._ctx.config.server.data_dir, record.stream)
        names = sorted(p.name for p in directory.iterdir()
                       if p.is_file() and not p.name.endswith(".tmp")) if directory.is_dir() else []
        sizes: dict[str, int] = {}
        for name in names:
            position = 0
            with open(directory / name, "rb") as handle:
                while True:
                    data = handle.read(CHUNK_BYTES)
                    if data or position == 0:
                        self._step(record, metadata, pb.MoveInRequest(
                            step=pb.MOVE_STEP_FILE, file=name, position=position, data=data))
                    position += len(data)
                    if len(data) < CHUNK_BYTES:
                        break
            sizes[name] = position
        state = self._state(record.stream, sizes, end_offset)
        return state, sum(sizes.values())

    def _state(self, stream: str, files: dict[str, int], end_offset: int) -> dict[str, Any]:
        """What the target's install takes: the files' sizes and every owner's records."""
        if stream not in self._ctx.registry:
            raise StreamNotFoundError(stream)
        records = export_stream(self._ctx.state_owners, stream)
        return {"files": files, "end_offset": end_offset, "records": encode_records(records),
                "groups": sum(record.kind == GROUP for record in records)}

    def _step(self, record: MoveRecord, metadata: Sequence[tuple[str, str]],
              request: pb.MoveInRequest) -> pb.MoveInResponse:
        """One MoveIn call to the target; MemberUnavailableError when it does not answer."""
        request.stream = record.stream
        request.move_id = record.move_id
        request.source = self._ctx.cluster.identity
        try:
            raw = self._ctx.cluster.peers.call(record.target, MOVE_IN_METHOD,
                                               request.SerializeToString(), metadata,
                                               timeout_s=STEP_TIMEOUT_S)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            detail = exc.details() if hasattr(exc, "details") else str(exc)
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, None):
                raise MemberUnavailableError(
                    record.target, f"the move of stream '{record.stream}' waits (it goes on "
                    "when the member answers)", str(detail)) from None
            if code == grpc.StatusCode.ALREADY_EXISTS and record.state == "copying":
                self._book.cancel(record)  # nothing installed: the stream is served here again
                raise AlreadyExistsError(
                    f"cannot move stream '{record.stream}' to {record.target}: {detail}; "
                    "the move is cancelled") from None
            raise MoveFailedError(f"the move of stream '{record.stream}' to {record.target} "
                                  f"failed: {code.name if code else 'error'}: {detail} "
                                  "(run it again)") from None
        return pb.MoveInResponse.FromString(raw)

    # ------------------------------------------------------------ resuming

    def _resume_loop(self) -> None:
        while True:
            for record in self._book.unfinished():
                if self._stop.is_set():
                    return
                lock = self._lock(record.stream)
                if not lock.acquire(blocking=False):
                    continue  # a MoveStream call is running it
                try:
                    current = self._book.active(record.stream)
                    if current is not None:
                        log.info("resuming the move of stream '%s' to %s (state %s)",
                                 current.stream, current.target, current.state)
                        self._run(current, self._own or self._callers.get(
                            current.stream, _MEMBER_ONLY))
                except BrokerError as exc:
                    log.warning("the move of stream '%s' to %s is unfinished: %s",
                                record.stream, record.target, exc)
                except Exception:
                    log.exception("resuming the move of stream '%s' failed", record.stream)
                finally:
                    lock.release()
            if self._stop.wait(RESUME_INTERVAL_S):
                return
