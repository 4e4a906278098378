"""Spark's discovery hook for the ``npstream`` format.

At session start Spark imports every top-level ``pyspark_*`` module on the
Python path and registers its ``DefaultSource`` under ``DefaultSource.name()``,
so ``spark.readStream.format("npstream")`` works with no register call.
Keep this module light: Spark imports it in every session.
"""

from __future__ import annotations

from npstream.spark.source import NpstreamDataSource

__all__ = ["DefaultSource"]


class DefaultSource(NpstreamDataSource):
    """The ``npstream`` data source as found by Spark's discovery."""
