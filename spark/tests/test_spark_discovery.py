"""Spark finds ``format("walstream")`` by itself: no ``walstream_spark.register`` call."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

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
