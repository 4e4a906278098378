"""Fixtures for the storage engine unit tests: a fake clock, storages, tables, frame listings."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from npstream.broker import faults
from npstream.broker.storage import UNTYPED, Storage, StorageSettings, StreamConfig
from npstream.broker.storage.file_cache import FileCache
from npstream.broker.storage.files import stream_dir
from npstream.broker.storage.loader import load_log
from npstream.broker.storage.segment_store import SegmentStore
from npstream.proto.frames.reader import FrameReader
from npstream.proto.frames.record_batch import FrameHeader
from npstream.proto.schema import normalize_publish_table

START_MS = 1_700_000_000_000


class FakeClock:
    """Epoch milliseconds that move only when a test says so."""

    def __init__(self, now: int = START_MS) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def config() -> StreamConfig:
    return StreamConfig(max_age_ms=0, max_bytes=0, dedup_window_ms=0, max_message_bytes=1 << 20)


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    """The storage's data dir: on tmpfs when the machine has one.

    These tests check what the engine does, not how fast the disk syncs; on
    tmpfs fsync costs nothing, so loops over hundreds of recoveries stay fast
    on a busy shared disk. Everything else (files, renames, truncation) is
    the same.
    """
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        base = Path(tempfile.mkdtemp(prefix="npstream-storage-test-", dir=shm))
        yield base / "data"
        shutil.rmtree(base, ignore_errors=True)
    else:
        yield tmp_path / "data"


@pytest.fixture
def make_storage(data_dir: Path, clock: FakeClock) -> Iterator[Callable[..., Storage]]:
    """Storage(StorageSettings(data_dir, **settings), clock); all closed at teardown.

    ``fault_hook(operation, path, position)`` is armed (npstream.broker.faults)
    at the points ``storage.write`` and ``storage.fsync`` ("write", "fsync")
    until the test's storages are closed; raising OSError from it simulates a
    disk error.
    """
    made: list[Storage] = []

    def make(*, fault_hook: Callable[[str, Path, int], None] | None = None,
             **settings: object) -> Storage:
        if fault_hook is not None:
            for operation in ("write", "fsync"):
                faults.arm(f"storage.{operation}",
                           lambda path, position, operation=operation: fault_hook(
                               operation, path, position))
        storage = Storage(StorageSettings(data_dir=data_dir, **settings), clock)  # type: ignore[arg-type]
        made.append(storage)
        return storage

    yield make
    try:
        for storage in made:
            storage.close()
    finally:
        faults.disarm()


@pytest.fixture(autouse=True)
def _no_armed_faults() -> Iterator[None]:
    """Whatever a test armed is disarmed after it (faults are process-wide)."""
    yield
    faults.disarm()


@pytest.fixture
def table_of() -> Callable[..., pa.Table]:
    """table_of(values, ids=None, keys=None, headers=None): a normalized publish table."""

    def build(values: list[bytes] | int, *, ids: list[str | None] | None = None,
              keys: list[bytes | None] | None = None,
              headers: list[dict[str, bytes] | None] | None = None, tag: str = "m") -> pa.Table:
        if isinstance(values, int):
            values = [f"{tag}{i}".encode() for i in range(values)]
        columns: dict[str, pa.Array] = {"value": pa.array(values, pa.binary())}
        if ids is not None:
            columns["id"] = pa.array(ids, pa.string())
        if keys is not None:
            columns["key"] = pa.array(keys, pa.binary())
        if headers is not None:
            columns["headers"] = pa.array(
                [list(h.items()) if h is not None else None for h in headers],
                pa.map_(pa.string(), pa.binary()),
            )
        return normalize_publish_table(pa.table(columns))

    return build


def list_frames(path: Path) -> list[tuple[int, FrameHeader]]:
    """(position, header) of every frame of a segment file."""
    fd = os.open(path, os.O_RDONLY)
    try:
        reader = FrameReader(fd, 0, os.fstat(fd).st_size, read_size=1 << 20)
        frames = []
        while (frame := reader.next_frame()) is not None:
            frames.append((frame[0], frame[1]))
        return frames
    finally:
        os.close(fd)


@pytest.fixture
def frames_of() -> Callable[[Path], list[tuple[int, FrameHeader]]]:
    return list_frames


def segment_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.log"))


@pytest.fixture
def segments_in() -> Callable[[Path], list[Path]]:
    return segment_files


@pytest.fixture
def preadv_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Positions of every os.preadv during the test (a direct patch's reads of edge blocks)."""
    reads: list[int] = []
    real = os.preadv

    def preadv(fd: int, buffers: list[memoryview], position: int) -> int:
        reads.append(position)
        return real(fd, buffers, position)

    monkeypatch.setattr(os, "preadv", preadv)
    return reads


@pytest.fixture
def open_store(data_dir: Path, clock: FakeClock) -> Iterator[Callable[..., SegmentStore]]:
    """open_store(name, config, **settings): a SegmentStore of its own, recovered from disk,
    for unit tests of the parts of a log (closed at teardown)."""
    made: list[SegmentStore] = []

    def make(name: str, config: StreamConfig, **settings: object) -> SegmentStore:
        storage_settings = StorageSettings(data_dir=data_dir, **settings)  # type: ignore[arg-type]
        cache = FileCache(storage_settings.max_open_files)
        directory = stream_dir(data_dir, name)
        loaded = load_log(directory, cache, storage_settings.index_interval_bytes, name)
        store = SegmentStore(name, config, directory, loaded, settings=storage_settings,
                             cache=cache, clock=clock, value_schemas=UNTYPED)
        made.append(store)
        return store

    yield make
    for store in made:
        store.close()


@pytest.fixture
def build_log(make_storage: Callable[..., Storage], config: StreamConfig,
              table_of: Callable[..., pa.Table]) -> Callable[..., Path]:
    """build_log(name, appends, **settings): a cleanly closed log of ``appends`` frames
    (1, 2, 3, 1, ... messages) whose values are v<offset>; returns its directory."""

    def build(name: str, appends: int, **settings: object) -> Path:
        storage = make_storage(**settings)
        log = storage.open_log(name, config)
        offset = 0
        for index in range(appends):
            count = index % 3 + 1
            log.append(table_of([f"v{o}".encode() for o in range(offset, offset + count)]))
            offset += count
        storage.close()
        return storage.settings.data_dir / "streams" / name

    return build
