"""npstream's Spark data source, format ``"npstream"``.

Spark finds it without any call through the top-level module
``pyspark_npstream`` once npstream is installed (editable installs too: the
module's folder is a plain path entry). For sessions started before the
install, or to turn on filter pushdown for batch reads, call ``register(spark)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from npstream.spark.source import FORMAT, NpstreamDataSource

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["FORMAT", "NpstreamDataSource", "register"]

# Spark's switch for Python data source filter pushdown (default false).
PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


def register(spark: SparkSession, *, filter_pushdown: bool = True) -> None:
    """Register the ``npstream`` format on ``spark`` (safe to call more than once).

    With ``filter_pushdown`` (default) the session's
    ``spark.sql.python.filterPushdown.enabled`` is set to true, so batch reads
    fetch only the offsets that ``offset``/``timestamp``/``stream`` filters
    can match.
    """
    spark.dataSource.register(NpstreamDataSource)
    if filter_pushdown:
        spark.conf.set(PUSHDOWN_CONF, "true")
