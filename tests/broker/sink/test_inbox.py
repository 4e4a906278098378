"""StageInbox (broker side): what a Stage by file may name, and what the broker reads."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pyarrow as pa
import pytest

from npstream.broker.sink.inbox import InboxRefused, StageInbox
from npstream.proto.host_identity import boot_id


@pytest.fixture
def inbox(tmp_path: Path) -> StageInbox:
    box = StageInbox(tmp_path / "data" / "stage-inbox", max_bytes=1 << 20)
    yield box
    box.close()


def _put(inbox: StageInbox, name: str, data: bytes) -> int:
    path = inbox.root / name
    path.write_bytes(data)
    return path.stat().st_ino


def test_describe_names_the_directory_its_identity_and_this_kernel(inbox):
    described = inbox.describe()
    info = os.stat(described.path)
    assert (described.host_id, described.path) == (boot_id(), str(inbox.root))
    assert (described.device, described.inode) == (info.st_dev, info.st_ino)


def test_read_returns_exactly_the_first_length_bytes(inbox):
    inode = _put(inbox, "task-1.arrow", b"0123456789" * 100 + b"stale tail of a bigger request")
    data = inbox.read("task-1.arrow", inode, 1000)
    assert isinstance(data, pa.Buffer)
    assert data.to_pybytes() == b"0123456789" * 100


@pytest.mark.parametrize("name", ["../escape.arrow", "sub/file.arrow", ".hidden", "..", "",
                                  "/etc/passwd", "a" * 129])
def test_read_refuses_anything_but_a_plain_name_of_the_inbox(inbox, tmp_path, name):
    (tmp_path / "data" / "escape.arrow").write_bytes(b"secret")
    with pytest.raises(InboxRefused, match="is not a file name of the stage inbox"):
        inbox.read(name, 1, 6)


def test_read_refuses_a_symlink_even_to_a_file_inside(inbox, tmp_path):
    target = tmp_path / "data" / "secret.arrow"
    target.write_bytes(b"secret")
    os.symlink(target, inbox.root / "link.arrow")
    with pytest.raises(InboxRefused, match=r"cannot open link\.arrow in .*: Too many levels"):
        inbox.read("link.arrow", target.stat().st_ino, 6)


def test_read_refuses_a_fifo_without_blocking_and_a_directory(inbox):
    os.mkfifo(inbox.root / "pipe.arrow")
    (inbox.root / "dir.arrow").mkdir()
    started = time.monotonic()
    with pytest.raises(InboxRefused, match=r"pipe\.arrow in .* is not a regular file"):
        inbox.read("pipe.arrow", (inbox.root / "pipe.arrow").stat().st_ino, 6)
    assert time.monotonic() - started < 5
    with pytest.raises(InboxRefused, match=r"dir\.arrow in .* is not a regular file"):
        inbox.read("dir.arrow", (inbox.root / "dir.arrow").stat().st_ino, 6)


def test_read_refuses_another_inode_a_short_file_and_a_missing_one(inbox):
    inode = _put(inbox, "task.arrow", b"abc")
    with pytest.raises(InboxRefused, match=rf"has inode {inode}, not {inode + 1}: another file"):
        inbox.read("task.arrow", inode + 1, 3)
    with pytest.raises(InboxRefused, match="holds 3 bytes, fewer than inbox_length 4"):
        inbox.read("task.arrow", inode, 4)
    with pytest.raises(InboxRefused, match=r"cannot open gone\.arrow in .*: No such file"):
        inbox.read("gone.arrow", inode, 3)


@pytest.mark.parametrize("length", [0, (1 << 20) + 1])
def test_read_refuses_a_length_outside_the_message_limit(inbox, length):
    inode = _put(inbox, "task.arrow", b"x" * ((1 << 20) + 1))
    with pytest.raises(InboxRefused, match=rf"inbox_length {length} is not between 1 and "
                                           r"1048576 bytes \(grpc_max_message_bytes\)"):
        inbox.read("task.arrow", inode, length)


def test_sweep_deletes_only_files_idle_longer_than_the_limit(inbox):
    _put(inbox, "fresh.arrow", b"x")
    _put(inbox, "idle.arrow", b"x")
    (inbox.root / "keep-dir").mkdir()  # nothing a client makes; left to the operator
    old = time.time() - 3600
    for name in ("idle.arrow", "keep-dir"):
        os.utime(inbox.root / name, (old, old))
    assert inbox.sweep(idle_s=600) == 1
    assert sorted(p.name for p in inbox.root.iterdir()) == ["fresh.arrow", "keep-dir"]
