"""A small local SparkSession for examples, benchmarks and tests."""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["local_session"]


def local_session(
    master: str = "local[2]", app_name: str = "walstream", register_source: bool = True, **conf: str
) -> Any:
    """A SparkSession on this machine with the walstream source registered.

    Spark finds the source by itself where walstream-spark is installed (the top-level module
    ``pyspark_walstream``); ``register_source`` also registers it explicitly, which covers a
    source tree put on the path at run time instead of installed. Pass False to rely on
    discovery alone.

    Python workers run this interpreter (so they import walstream from the same environment);
    the web UI and the console progress bar are off and shuffles use few partitions.
    ``conf`` adds Spark settings (``{"spark.sql.shuffle.partitions": "4"}``).
    """
    from pyspark.sql import SparkSession

    from . import register

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "1g")
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    if register_source:
        register(spark)
    return spark
