"""Spark's automatic discovery of the walstream data source.

Spark 4 looks for Python data sources by itself: when a session first resolves a format it does
not know, a Python worker imports every top-level module whose name starts with ``pyspark_`` and
registers the ``DefaultSource`` class it exposes (``pyspark.sql.worker.lookup_data_sources``).
This module is that entry point, so ``spark.read.format("walstream")`` works in ``pyspark``,
``spark-submit`` and notebooks with no ``walstream_spark.register(spark)`` call, wherever the
walstream-spark dist is installed in the Python the workers run.
"""

from __future__ import annotations

from walstream_spark.source import WalstreamDataSource

__all__ = ["DefaultSource"]

#: The class Spark's data-source lookup registers, under its ``name()``: ``"walstream"``.
DefaultSource = WalstreamDataSource
