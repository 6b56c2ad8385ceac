"""Spark's Python workers run the interpreter that has walstream-spark installed.

PySpark starts its Python workers (among them the one that finds ``format("walstream")``) with
``$PYSPARK_PYTHON``, else whatever ``python3`` is first on ``PATH``. A virtual environment's
interpreter run by its path, without activating the environment (``.venv/bin/python app.py``,
an IDE, a cron job), therefore gets workers that run *another* Python, one without walstream-spark
installed, and Spark answers ``[DATA_SOURCE_NOT_FOUND] Failed to find the data source:
walstream``.

This module, imported at interpreter start by ``walstream-spark.pth`` (installed next to it by
the wheel) and by ``import walstream_spark``, closes that gap: in a virtual environment that is
not on ``PATH``, with ``PYSPARK_PYTHON`` unset, it sets ``PYSPARK_PYTHON`` to this interpreter
for this process and the processes it starts (Spark's JVM and its workers). It never overrides
a ``PYSPARK_PYTHON`` that is set, nor Spark's ``spark.pyspark.python``, which wins over it: set
either for a cluster whose executors run another Python. It imports nothing but ``os`` and
``sys``: every interpreter of the environment runs it at start.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

__all__ = ["point_spark_workers_here"]


def point_spark_workers_here(
    environ: MutableMapping[str, str] = os.environ,
    executable: str = sys.executable,
    prefix: str = sys.prefix,
    base_prefix: str = sys.base_prefix,
) -> str | None:
    """Set ``PYSPARK_PYTHON`` to ``executable`` when it runs a virtual environment that is not
    on ``PATH`` and ``PYSPARK_PYTHON`` is unset; return what was set (None: nothing)."""
    if environ.get("PYSPARK_PYTHON") or prefix == base_prefix or not executable:
        return None
    bin_dir = os.path.realpath(os.path.dirname(executable))
    for entry in environ.get("PATH", "").split(os.pathsep):
        if entry and os.path.realpath(entry) == bin_dir:
            return None  # activated: `python3` on PATH is this environment's
    environ["PYSPARK_PYTHON"] = executable
    return executable


point_spark_workers_here()
