"""The one place where the Spark reader reacts to messages it can no longer read.

Retention (max age, max bytes, ``delete_messages``) or a deleted stream can
remove messages a query has not read yet. With ``failOnDataLoss=true`` (the
default) the query stops with ``DataLossError`` naming the stream and offsets
and how to continue; with ``false`` the gap is skipped and one WARNING says
what was skipped. Every data-loss decision goes through ``report_data_loss``
so both readers and the driver-side planning behave the same.
"""

from __future__ import annotations

import logging

from npstream.spark.errors import DataLossError

__all__ = ["DataLossError", "report_data_loss"]

log = logging.getLogger("npstream.spark.data_loss")

_FIX = (
    "If skipping the missing messages is acceptable, set the option "
    "failOnDataLoss=false and restart the query."
)


def report_data_loss(stream: str, start: int, end: int | None, reason: str, *,
                     fail: bool) -> None:
    """Raise DataLossError (``fail``) or log one WARNING about lost offsets.

    ``[start, end)`` are the offsets the reader needed and cannot read
    (``end`` None: everything from ``start`` on); ``reason`` says why, e.g.
    "retention moved the stream's start_offset to 120".
    """
    span = f"[{start}, {end})" if end is not None else f"{start} and later"
    if fail:
        raise DataLossError(
            f"Data loss on stream '{stream}': offsets {span} can no longer be read ({reason}). "
            f"{_FIX}",
            stream=stream, start=start, end=end,
        )
    log.warning("data loss on stream '%s': skipping offsets %s (%s); failOnDataLoss=false",
                stream, span, reason)
