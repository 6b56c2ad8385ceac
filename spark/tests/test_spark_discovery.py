"""Spark finds ``format("walstream")`` by itself: no ``walstream_spark.register`` call."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

SPARK_DIST = Path(__file__).resolve().parents[1]

# A fresh driver process: its session never saw register(), unlike the tests' shared session.
FRESH_SESSION_READ = textwrap.dedent(
    """
    import sys
    import walstream.blocking
    from walstream import Record
    from walstream_spark import local_session

    config = sys.argv[1]
    with walstream.blocking.open(config) as client:
        stream = client.create_stream("clicks")
        stream.append([Record(b"one"), Record(b"two"), Record(b"three")])
    spark = local_session("local[1]", "walstream-discovery", register_source=False)
    rows = (
        spark.read.format("walstream").option("config", config).option("streams", "clicks")
        .option("startingOffsets", "earliest").load().orderBy("offset").collect()
    )
    print("ROWS", [(row.stream, row.offset, bytes(row.value)) for row in rows])
    spark.stop()
    """
)


def test_the_dist_ships_the_module_spark_scans_for() -> None:
    """Spark 4 imports top-level modules named pyspark_* and registers their DefaultSource."""
    project = tomllib.loads((SPARK_DIST / "pyproject.toml").read_text())
    assert "pyspark_walstream" in project["tool"]["setuptools"]["py-modules"]
    assert (SPARK_DIST / "src" / "pyspark_walstream.py").is_file()

    import pyspark_walstream
    from pyspark.sql.datasource import DataSource

    assert issubclass(pyspark_walstream.DefaultSource, DataSource)
    assert pyspark_walstream.DefaultSource.name() == "walstream"


@pytest.mark.slow
def test_a_fresh_session_reads_the_format_without_register(deployment: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", FRESH_SESSION_READ, str(deployment)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    assert "ROWS [('clicks', 0, b'one'), ('clicks', 1, b'two'), ('clicks', 2, b'three')]" in (
        done.stdout
    )


# Spark's own builder, no local_session (which sets PYSPARK_PYTHON itself).
PLAIN_BUILDER_READ = textwrap.dedent(
    """
    import sys
    import walstream.blocking
    import walstream_spark  # noqa: F401  (an installed wheel's walstream-spark.pth does this)
    from pyspark.sql import SparkSession
    from walstream import Record

    config = sys.argv[1]
    with walstream.blocking.open(config) as client:
        client.create_stream("clicks").append([Record(b"one"), Record(b"two")])
    spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
    rows = (
        spark.read.format("walstream").option("config", config).option("streams", "clicks")
        .load().orderBy("offset").collect()
    )
    print("ROWS", [bytes(row.value) for row in rows])
    spark.stop()
    """
)


@pytest.mark.slow
def test_the_environment_s_python_run_without_activation_finds_the_format(
    deployment: Path,
) -> None:
    """The venv's interpreter run by its path, with the venv off PATH and PYSPARK_PYTHON unset:
    Spark would start its workers with another python3 and answer DATA_SOURCE_NOT_FOUND; the
    workers run this interpreter instead."""
    import os

    environment = {
        key: value
        for key, value in os.environ.items()
        if key not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV", "PATH")
    }
    environment["PATH"] = "/usr/local/bin:/usr/bin:/bin"
    done = subprocess.run(
        [sys.executable, "-c", PLAIN_BUILDER_READ, str(deployment)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=environment,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    assert "ROWS [b'one', b'two']" in done.stdout
    assert "DATA_SOURCE_NOT_FOUND" not in done.stderr
