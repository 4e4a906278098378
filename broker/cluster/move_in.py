"""The target's side of a stream move: receive the files, then install the stream at once.

Every step is idempotent, because the source repeats steps after a crash of
either side (move.py):

* BEGIN: answers ``installed`` when this move was installed here already;
  refuses (ALREADY_EXISTS) when this member holds another stream of that
  name; else drops what an earlier attempt left (its receiving directory,
  and a stream directory no registry row owns: a crash between an install's
  rename and its transaction) and starts afresh.
* FILE: writes a chunk at its position in ``<data_dir>/moves-in/<move id>/``.
  Nothing reads that directory but the install.
* INSTALL: checks every file has the size the source sent and that this
  member takes every kind of state record sent, fsyncs the files, renames
  the directory into ``streams/<name>``, then installs in ONE SQLite
  transaction the stream's state records (each through the package that
  owns it, ``ctx.state_owners``: registry row, value schemas, groups, sink
  floors, listing stats; npstream.broker.handover) and a ``moves_in`` row;
  then the registry serves it. That transaction is the moment the stream becomes this
  member's: before it, a crash leaves files no row owns (the next BEGIN
  drops them); after it, a repeated INSTALL answers ``installed``.
* ABORT: drops the receiving directory (the source cancelled the move).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from npstream.broker import faults
from npstream.broker.cluster.move_state import MoveBook
from npstream.broker.errors import AlreadyExistsError, InvalidArgumentError
from npstream.broker.handover import StateRecord, check_kinds, decode_records, install_stream
from npstream.broker.log_events import event_fields
from npstream.broker.storage.files import fsync_dir, stream_dir, streams_root
from npstream.proto import pb

if TYPE_CHECKING:
    from npstream.broker.server.context import BrokerContext

__all__ = ["MOVES_IN_DIR", "MoveReceiver"]

log = logging.getLogger(__name__)

MOVES_IN_DIR = "moves-in"
_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")
_MOVE_ID = re.compile(r"[0-9a-f]{32}")


class MoveReceiver:
    """MoveIn steps of the moves whose target this member is (module doc)."""

    def __init__(self, ctx: BrokerContext, book: MoveBook) -> None:
        self._ctx = ctx
        self._book = book
        self._root = ctx.config.server.data_dir / MOVES_IN_DIR

    def _receiving(self, move_id: str) -> Path:
        if not _MOVE_ID.fullmatch(move_id):
            raise InvalidArgumentError(f"'{move_id[:40]}' is not a move id")
        return self._root / move_id

    def step(self, request: pb.MoveInRequest) -> pb.MoveInResponse:
        stream = request.stream
        receiving = self._receiving(request.move_id)
        if request.step == pb.MOVE_STEP_BEGIN:
            return self._begin(stream, request.move_id, receiving)
        if request.step == pb.MOVE_STEP_FILE:
            self._file(receiving, request.file, request.position, request.data)
            faults.hit("move.file", stream)
            return pb.MoveInResponse()
        if request.step == pb.MOVE_STEP_INSTALL:
            return self._install(request, receiving)
        if request.step == pb.MOVE_STEP_ABORT:
            shutil.rmtree(receiving, ignore_errors=True)
            return pb.MoveInResponse()
        raise InvalidArgumentError(f"unknown move step {request.step}")

    def _begin(self, stream: str, move_id: str, receiving: Path) -> pb.MoveInResponse:
        if self._book.installed(stream, move_id):
            return pb.MoveInResponse(installed=True)
        if stream in self._ctx.registry:
            raise AlreadyExistsError(f"cluster member {self._ctx.cluster.identity} holds a "
                                     f"stream named '{stream}' already")
        shutil.rmtree(receiving, ignore_errors=True)
        shutil.rmtree(stream_dir(self._ctx.config.server.data_dir, stream), ignore_errors=True)
        receiving.mkdir(parents=True, exist_ok=True)
        return pb.MoveInResponse()

    def _file(self, receiving: Path, name: str, position: int, data: bytes) -> None:
        if not _FILE_NAME.fullmatch(name) or name in (".", ".."):
            raise InvalidArgumentError(f"'{name[:80]}' is not a stream file name")
        if position < 0:
            raise InvalidArgumentError(f"file position {position} must be >= 0")
        if not receiving.is_dir():
            raise InvalidArgumentError("no move in progress under this id (BEGIN first)")
        path = receiving / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.pwrite(fd, data, position)
        finally:
            os.close(fd)

    def _install(self, request: pb.MoveInRequest, receiving: Path) -> pb.MoveInResponse:
        stream, move_id = request.stream, request.move_id
        if self._book.installed(stream, move_id):
            return pb.MoveInResponse(installed=True)
        if stream in self._ctx.registry:
            raise AlreadyExistsError(f"cluster member {self._ctx.cluster.identity} holds a "
                                     f"stream named '{stream}' already")
        try:
            state: dict[str, Any] = json.loads(request.state_json)
        except ValueError:
            raise InvalidArgumentError("the move's state is not JSON") from None
        files: dict[str, int] = state["files"]
        records = decode_records(state.get("records"))
        check_kinds(self._ctx.state_owners, stream, records)
        self._check_files(receiving, files)
        directory = stream_dir(self._ctx.config.server.data_dir, stream)
        if files:
            shutil.rmtree(directory, ignore_errors=True)
            os.replace(receiving, directory)
            fsync_dir(streams_root(self._ctx.config.server.data_dir))
        else:
            shutil.rmtree(receiving, ignore_errors=True)
        self._write_rows(stream, move_id, request.source, records)
        self._ctx.registry.load_row(stream)
        self._book.forget_tombstone(stream)
        faults.hit("move.installed", stream)
        log.info("stream '%s' moved in from %s (move %s): %d file(s), %d state record(s), end "
                 "offset %d", stream, request.source, move_id, len(files), len(records),
                 state["end_offset"], extra=event_fields(stream=stream))
        return pb.MoveInResponse(installed=True)

    def _check_files(self, receiving: Path, files: dict[str, int]) -> None:
        """Every file complete (the size the source sent) and durable, or the step fails."""
        for name, size in files.items():
            path = receiving / name
            have = path.stat().st_size if path.is_file() else -1
            if have != size:
                raise InvalidArgumentError(
                    f"moved file {name} has {have} bytes here, the source sent {size}: "
                    "the copy is incomplete (the source starts it again)")
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        if files:
            fsync_dir(receiving)

    def _write_rows(self, stream: str, move_id: str, source: str,
                    records: list[StateRecord]) -> None:
        """The install's one transaction (module doc): every owner's records, the move's row."""
        metadata = self._ctx.metadata
        with metadata.transaction() as txn:
            install_stream(self._ctx.state_owners, stream, records, txn)
            txn.execute("INSERT INTO moves_in (stream, move_id, source, installed_ms) "
                        "VALUES (?, ?, ?, ?)", (stream, move_id, source, int(time.time() * 1000)))
        metadata.execute("PRAGMA wal_checkpoint(PASSIVE)")
