"""walstream for Apache Spark: ``format("walstream")`` for batch and streaming reads and writes.

::

    import walstream_spark
    walstream_spark.register(spark)
    df = spark.read.format("walstream").option("config", "deploy.yaml").option("streams", "clicks").load()

See :mod:`walstream_spark.source` (reads) and :mod:`walstream_spark.writing` (writes) for the
options and guarantees.
"""

from __future__ import annotations

from typing import Any

import walstream_spark_python  # noqa: F401 - Spark's Python workers run this interpreter

from .session import local_session
from .source import WalstreamDataSource

__all__ = ["WalstreamDataSource", "local_session", "register"]


def register(spark: Any) -> None:
    """Make ``format("walstream")`` available in ``spark`` (a SparkSession)."""
    spark.dataSource.register(WalstreamDataSource)
