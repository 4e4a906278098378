"""Test-only fault injection: named points where a test makes the broker fail, stop or die.

Recovery code (a sink commit cut off half way, a disk error during an
append, a PublishStream request written but never acknowledged) can only be
tested by making those things happen at exact points of the real code; a
mock would test the mock. So the code calls ``hit(point, *details)`` at each
such point, and nothing happens unless a test armed that point. There is one
way to arm a fault, ``arm(point, action)``: an in-process test passes its own
action (raise OSError, record the call, delete a file); a broker process a
test starts is armed from its environment by ``arm_from_env()``, whose
actions count hits and ``os._exit(FAULT_EXIT_CODE)`` at the chosen one, which
is what kill -9 at that instant would leave behind. The types of the engine
carry none of this: a point costs one dictionary lookup while unarmed.

Points, and the details their action is called with:

* ``storage.write`` (path, position): before each frame is written to a
  segment file, and before each frame of a staged file is stamped.
* ``storage.fsync`` (path, size): before each fsync of a segment file or of a
  stamped staged file.
* ``storage.stamped`` (path): a staged file was stamped and fsynced.
* ``storage.renaming`` (path): a stamped staged file is about to be renamed
  into its stream directory.
* ``storage.adopted`` (path): it was (``path`` is where it was staged).
* ``sink.marker`` (stream_log, first_offset): a commit's 'committing' marker
  is durable and no byte of the append is written yet.
* ``sink.appended`` (stream_log, first_offset): a commit's append to one
  stream returned; its marker is not 'done' yet.
* ``sink.stream_done`` (sink_id, batch_id, streams): a commit finished one
  more stream (``streams``: how many of that commit so far).
* ``publish.written`` (): a PublishStream request is written, before its
  fsync and reply.
* ``move.<step>`` (stream): the steps of a stream move (cluster/move.py,
  move_in.py). On the source: ``move.paused`` (the move record is durable,
  nothing copied), ``move.copied`` (every file sent, not yet switching),
  ``move.switching`` (the record says switching, the target not yet told to
  install), ``move.switched`` (the target holds the stream, the record says
  removing, the source's copy not yet deleted), ``move.removed`` (the
  source's copy deleted, the record not yet done). On the target:
  ``move.file`` (a file chunk received and written), ``move.installed``
  (the install is durable, its reply not yet sent).

The environment of a broker process (``arm_from_env``, at start; ValueError
when malformed), never to be set in production:

* ``NPSTREAM_SINK_FAULT``: ``marker`` exits at the first ``sink.marker``,
  ``append`` at the first ``sink.appended``; ``torn:N`` is ``append`` after
  first cutting the segment bytes the append wrote back to N (a torn write);
  ``done:K`` exits at the K-th ``sink.stream_done``, ``stamped:K``,
  ``renaming:K`` and ``adopted:K`` at the K-th hit of that storage point.
* ``NPSTREAM_PUBLISH_FAULT=exit_after_write:N``: exits at the N-th
  ``publish.written``.
* ``NPSTREAM_MOVE_FAULT=<step>[:N]``: exits at the N-th (default first) hit
  of ``move.<step>``.
* ``NPSTREAM_STORAGE_FAULT=<write|fsync>:<ERRNO>:<stream>[:N]`` (a comma list
  of such): the N-th (default first) ``storage.write`` or ``storage.fsync`` of
  a file of stream ``<stream>`` raises ``OSError(errno.<ERRNO>)``, e.g.
  ``fsync:EIO:orders:3``, once; the broker goes on (a failing disk, not a crash).

``NPSTREAM_TEST_HIDE_RPCS`` is no fault but lives here for the same reason: a
comma list of ``Service.Method`` names the broker does not register, so
calls get gRPC's own UNIMPLEMENTED, as from a broker built before those RPCs
existed (``hidden_rpcs``).
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from npstream.broker.storage.log import StreamLog

__all__ = [
    "FAULT_EXIT_CODE",
    "HIDE_RPCS_ENV",
    "MOVE_FAULT_ENV",
    "POINTS",
    "PUBLISH_FAULT_ENV",
    "SINK_FAULT_ENV",
    "STORAGE_FAULT_ENV",
    "PublishFault",
    "arm",
    "arm_from_env",
    "disarm",
    "hidden_rpcs",
    "hit",
]

log = logging.getLogger(__name__)

HIDE_RPCS_ENV = "NPSTREAM_TEST_HIDE_RPCS"
SINK_FAULT_ENV = "NPSTREAM_SINK_FAULT"
PUBLISH_FAULT_ENV = "NPSTREAM_PUBLISH_FAULT"
MOVE_FAULT_ENV = "NPSTREAM_MOVE_FAULT"
STORAGE_FAULT_ENV = "NPSTREAM_STORAGE_FAULT"
FAULT_EXIT_CODE = 87

POINTS = frozenset({
    "storage.write", "storage.fsync", "storage.stamped", "storage.renaming", "storage.adopted",
    "sink.marker", "sink.appended", "sink.stream_done", "publish.written",
    "move.paused", "move.copied", "move.switching", "move.switched", "move.removed",
    "move.file", "move.installed",
})
MOVE_STEPS = ("paused", "copied", "switching", "switched", "removed", "file", "installed")
# Sink crash points counted in staged files: the storage point each one names.
_FILE_POINTS = {"stamped": "storage.stamped", "renaming": "storage.renaming",
                "adopted": "storage.adopted"}

Action = Callable[..., None]

_armed: dict[str, Action] = {}
_env_lock = threading.Lock()
_armed_from_env: dict[str, str] = {}  # variable -> the value its faults were armed for


def hit(point: str, *details: object) -> None:
    """Run the action armed at ``point`` (nothing when none is); it may raise or exit."""
    action = _armed.get(point)
    if action is not None:
        action(*details)


def arm(point: str, action: Action) -> None:
    """Call ``action(*details)`` at every hit of ``point`` from now on (replacing any other)."""
    if point not in POINTS:
        raise ValueError(f"unknown fault point {point!r}; the points are {sorted(POINTS)}")
    _armed[point] = action


def disarm(*points: str) -> None:
    """Disarm ``points`` (every point when none is named); for tests' teardown."""
    for point in points or list(_armed):
        _armed.pop(point, None)
    if not points:
        with _env_lock:
            _armed_from_env.clear()


def arm_from_env(env: Mapping[str, str] = os.environ) -> None:
    """Arm what the broker's environment asks for (module doc); ValueError when malformed.

    Services call it while the broker starts; a value already armed is not
    armed again, so its hit counts go on.
    """
    for variable, parse in ((SINK_FAULT_ENV, _sink_faults), (PUBLISH_FAULT_ENV, _publish_faults),
                            (MOVE_FAULT_ENV, _move_faults), (STORAGE_FAULT_ENV, _storage_faults)):
        text = env.get(variable, "")
        with _env_lock:
            if not text or _armed_from_env.get(variable) == text:
                continue
            for point, action in parse(text).items():
                arm(point, action)
            _armed_from_env[variable] = text


def hidden_rpcs(env: Mapping[str, str] = os.environ) -> frozenset[str]:
    """The ``Service.Method`` names the broker must not serve (empty: serve all)."""
    return frozenset(name.strip() for name in env.get(HIDE_RPCS_ENV, "").split(",")
                     if name.strip())


class PublishFault:
    """The PublishStream service's handle on the ``publish.written`` point."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> PublishFault:
        """Arm the environment's faults (``arm_from_env``); ValueError when malformed."""
        arm_from_env(env)
        return cls()

    def written(self) -> None:
        """Called after each PublishStream request is written, before its fsync and reply."""
        hit("publish.written")


# ---------------------------------------------------------------- actions of the environment


def _exit(variable: str, when: str) -> NoReturn:
    log.critical("test fault hook %s: exiting %s", variable, when)
    logging.shutdown()
    os._exit(FAULT_EXIT_CODE)


class _ExitAtHit:
    """Exit the process at the ``count``-th hit of a point (hits of any thread).

    ``when(hits, details)`` says when, for the one log line before the exit.
    """

    def __init__(self, variable: str, count: int,
                 when: Callable[[int, tuple[object, ...]], str]) -> None:
        self._variable = variable
        self._count = count
        self._when = when
        self._hits = 0
        self._lock = threading.Lock()

    def __call__(self, *details: object) -> None:
        with self._lock:
            self._hits += 1
            if self._hits < self._count:
                return
        _exit(self._variable, self._when(self._hits, details))


def _now(point: str) -> Callable[[int, tuple[object, ...]], str]:
    """The sink's log of an exit: the point and what it was called with."""
    def when(hits: int, details: tuple[object, ...]) -> str:
        shown = ", ".join(getattr(d, "name", None) or str(d) for d in details)
        return f"now (hit {hits} of {point}: {shown or 'no details'})"
    return when


class _TornAppend:
    """``torn:N``: the append's new segment bytes cut back to N, then exit.

    The sizes of the stream's segment files are taken when the marker is
    durable; after the append the first file that grew keeps N of its new
    bytes and any later one none of them, as if the broker had died after
    writing N bytes of the commit.
    """

    def __init__(self, keep_bytes: int) -> None:
        self._keep_bytes = keep_bytes
        self._before: dict[Path, int] = {}

    def marker(self, stream_log: StreamLog, first_offset: int) -> None:
        from npstream.broker.storage.files import segment_file_sizes

        self._before = segment_file_sizes(stream_log.directory)

    def appended(self, stream_log: StreamLog, first_offset: int) -> None:
        from npstream.broker.storage.files import cut_file, segment_file_sizes

        after = segment_file_sizes(stream_log.directory)
        grown = sorted(path for path, size in after.items() if size > self._before.get(path, 0))
        for index, path in enumerate(grown):
            base = self._before.get(path, 0)
            cut_file(path, base + self._keep_bytes if index == 0 else base)
        _exit(SINK_FAULT_ENV, f"now (appended '{stream_log.name}' at offset {first_offset}, "
                              f"torn to {self._keep_bytes} bytes, marker not done)")


def _sink_faults(text: str) -> dict[str, Action]:
    point, _, amount = text.partition(":")
    if point in ("marker", "append") and not amount:
        target = "sink.marker" if point == "marker" else "sink.appended"
        return {target: _ExitAtHit(SINK_FAULT_ENV, 1, _now(target))}
    if amount.isdigit():
        count = int(amount)
        if point == "torn":
            torn = _TornAppend(count)
            return {"sink.marker": torn.marker, "sink.appended": torn.appended}
        counted = {"done": "sink.stream_done", **_FILE_POINTS}.get(point)
        if counted is not None:
            return {counted: _ExitAtHit(SINK_FAULT_ENV, count, _now(counted))}
    raise ValueError(
        f"invalid {SINK_FAULT_ENV}={text!r}: use marker, append, torn:<bytes>, done:<streams>, "
        "stamped:<files>, renaming:<files> or adopted:<files>")


def _publish_faults(text: str) -> dict[str, Action]:
    point, _, count = text.partition(":")
    if point != "exit_after_write" or not count.isdigit() or int(count) < 1:
        raise ValueError(f"invalid {PUBLISH_FAULT_ENV}={text!r}: use exit_after_write:<N>, "
                         "N >= 1")
    return {"publish.written": _ExitAtHit(
        PUBLISH_FAULT_ENV, int(count),
        lambda hits, _details: f"after writing PublishStream request {hits}")}


def _move_faults(text: str) -> dict[str, Action]:
    step, _, count = text.partition(":")
    if step not in MOVE_STEPS or (count and (not count.isdigit() or int(count) < 1)):
        raise ValueError(f"invalid {MOVE_FAULT_ENV}={text!r}: use <step>[:<N>], N >= 1, "
                         f"step one of {', '.join(MOVE_STEPS)}")
    point = f"move.{step}"
    return {point: _ExitAtHit(MOVE_FAULT_ENV, int(count or 1), _now(point))}


class _FailStreamFile:
    """Raise ``OSError(code)`` at the ``count``-th hit of a storage point on ``stream``'s files.

    Once: a disk that failed one write or fsync, for the broker to report and
    survive (the point's other hits, and other streams' files, pass).
    """

    def __init__(self, stream: str, code: int, count: int,
                 inner: Action | None = None) -> None:
        self._stream = stream
        self._code = code
        self._count = count
        self._inner = inner  # another stream's fault at the same point
        self._hits = 0
        self._lock = threading.Lock()

    def __call__(self, *details: object) -> None:
        if self._inner is not None:
            self._inner(*details)
        path = details[0] if details else None
        if not isinstance(path, Path) or self._stream not in path.parts:
            return
        with self._lock:
            self._hits += 1
            if self._hits != self._count:
                return
        log.critical("test fault hook %s: failing this I/O on %s with %s",
                     STORAGE_FAULT_ENV, path, errno.errorcode[self._code])
        raise OSError(self._code, f"{os.strerror(self._code)} (test fault)", str(path))


def _storage_faults(text: str) -> dict[str, Action]:
    actions: dict[str, Action] = {}
    for item in text.split(","):
        parts = item.strip().split(":")
        count = parts[3] if len(parts) == 4 else "1"
        code = getattr(errno, parts[1], None) if len(parts) in (3, 4) else None
        if (len(parts) not in (3, 4) or parts[0] not in ("write", "fsync")
                or not isinstance(code, int) or not parts[2]
                or not count.isdigit() or int(count) < 1):
            raise ValueError(f"invalid {STORAGE_FAULT_ENV}={text!r}: use "
                             "<write|fsync>:<ERRNO>:<stream>[:<N>], N >= 1, comma-separated")
        point = f"storage.{parts[0]}"
        actions[point] = _FailStreamFile(parts[2], code, int(count), actions.get(point))
    return actions
