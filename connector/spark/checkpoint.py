"""What the streaming writer reads from its query's Spark checkpoint: the query's identity.

The sink's commits on the broker are keyed by a sink id, and a restarted
query must find its own commits under it (a replayed batch then appends
nothing), while any other query must not. A path string or a query name is
the wrong key: a checkpoint deleted and re-created at the same path, two
applications with the same ``queryName`` under different roots, or one
checkpoint reached through a symlink all give wrong answers. Spark records
the query's identity in the checkpoint itself: the ``metadata`` file's
``id``, written once when the query first starts (before the writer is
created) and kept across restarts; tasks see the same id as the local
property ``sql.streaming.queryId``. The default sink id is ``query-<id>``.

The driver reads the file when the writer's options name the checkpoint
(``checkpointLocation``, resolved as Spark resolves it: a ``file:`` URI, or a
path relative to the driver's working directory) and it is on a local file
system; otherwise (a checkpoint under ``spark.sql.streaming.checkpointLocation``
named by ``queryName``, or on HDFS/S3) each task takes the id from its local
property and the driver learns it from the tasks' commit messages.

The checkpoint also says which batches Spark has planned (``offsets/<N>``):
a broker that holds a later committed batch for the sink than any the
checkpoint has planned means the checkpoint was deleted or replaced under a
sink id that outlived it (an explicit ``sinkId``), and every batch up to that
one would be skipped as already committed. ``check_planned_batches`` refuses
to start then.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from urllib.parse import unquote, urlparse

from npstream.errors import SinkConflict

__all__ = [
    "QUERY_ID_PROPERTY",
    "check_planned_batches",
    "checkpoint_dir",
    "checkpoint_query_id",
    "last_planned_batch",
    "query_sink_id",
]

# The local property Spark sets on every task of a streaming query (StreamExecution).
QUERY_ID_PROPERTY = "sql.streaming.queryId"


def query_sink_id(query_id: str) -> str:
    """The default sink id of the query with this id (Spark's UUID; a valid name)."""
    return f"query-{query_id}"


def checkpoint_dir(location: str) -> Path | None:
    """The checkpoint as a local directory, as Spark resolves the option; None when it
    is on another file system (a URI with another scheme)."""
    text = location.strip()
    parsed = urlparse(text)
    if parsed.scheme == "file":
        path = unquote(parsed.path)
    elif parsed.scheme and len(parsed.scheme) > 1:  # hdfs://, s3a://, ... (not a drive letter)
        return None
    else:
        path = text
    return Path(os.path.abspath(path))  # relative: to the driver's working directory


def checkpoint_query_id(location: str) -> str | None:
    """The query id recorded in the checkpoint's ``metadata`` file; None when the file
    cannot be read here (not written yet, or not on a local file system)."""
    directory = checkpoint_dir(location)
    if directory is None:
        return None
    try:
        text = (directory / "metadata").read_text(encoding="utf-8")
    except OSError:
        return None
    try:
        query_id = json.loads(text.splitlines()[0])["id"]
    except (ValueError, IndexError, KeyError, TypeError):
        return None
    return str(query_id)


def last_planned_batch(directory: Path) -> int:
    """The highest batch id in the checkpoint's offsets log; -1 when none is planned."""
    try:
        names = os.listdir(directory / "offsets")
    except OSError:
        return -1
    return max((int(name) for name in names if name.isdigit()), default=-1)


def check_planned_batches(sink_id: str, location: str, directory: Path, committed: int,
                          broker: str) -> None:
    """SinkConflict when the broker holds a later batch than the checkpoint ever planned.

    ``directory`` is the checkpoint ``location`` (the option) resolved;
    ``committed`` is the sink's last committed batch id on ``broker`` (-1:
    none). A batch committed on the broker but not in Spark's commit log (the
    crash the replay is for) was planned, so it passes.
    """
    planned = last_planned_batch(directory)
    if committed <= planned:
        return
    has = (f"has planned batches only up to {planned}" if planned >= 0
           else "has planned no batch")
    raise SinkConflict(
        f"npstream sink '{sink_id}' has batches up to {committed} committed on broker "
        f"{broker}, but the query's checkpoint {location!r} {has}: it is not the "
        "checkpoint that wrote them (a new or re-created one starts again at batch 0), and "
        "Spark would run those batch ids again for the broker to skip as already committed, "
        "writing nothing. Give a new checkpoint a new option 'sinkId' (or drop the option: "
        "the default sink id is the checkpoint's own query id), or restore the checkpoint "
        "that wrote those batches.")
