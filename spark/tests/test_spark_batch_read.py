"""Batch reads of 3 streams × 100,000 records: exact, after trim, after compaction."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import walstream.blocking
from pyspark.sql import functions as F
from walstream import Record

# Every test reads the module's 300,000 records (filled once, ~15 s) through Spark.
pytestmark = pytest.mark.slow

STREAMS = ("alpha", "beta", "gamma")
RECORDS = 100_000
BATCH = 2_000


def expected_value(stream: str, offset: int) -> bytes:
    return (f"{stream}:{offset:08d}|" * 3).encode()


@pytest.fixture(scope="module")
def filled(module_deployment: Path) -> Path:
    with walstream.blocking.open(str(module_deployment)) as client:
        for name in STREAMS:
            stream = client.create_stream(name)
            for start in range(0, RECORDS, BATCH):
                stream.append(
                    [
                        Record(
                            expected_value(name, offset),
                            key=str(offset % 7).encode(),
                            headers=(("source", name.encode()),),
                        )
                        for offset in range(start, start + BATCH)
                    ]
                )
    return module_deployment


def load(spark: Any, config: Path, **options: str) -> Any:
    reader = spark.read.format("walstream").option("config", str(config))
    reader = reader.option("streams", ",".join(STREAMS)).option("partitionRecords", "40000")
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def check_exact(spark: Any, config: Path, starts: dict[str, int]) -> None:
    """Every stream holds exactly offsets [start, RECORDS), each once, with its value."""
    frame = load(spark, config).cache()
    try:
        wanted = F.repeat(
            F.concat(
                F.col("stream"),
                F.lit(":"),
                F.lpad(F.col("offset").cast("string"), 8, "0"),
                F.lit("|"),
            ),
            3,
        ).cast("binary")
        wrong = frame.filter(
            (F.col("value") != wanted)
            | (F.col("key") != F.expr("cast(cast(offset % 7 as string) as binary)"))
            | (F.col("headers")["source"] != F.col("stream").cast("binary"))
        ).count()
        assert wrong == 0
        summary = {
            row["stream"]: row
            for row in frame.groupBy("stream")
            .agg(
                F.count("*").alias("n"),
                F.countDistinct("offset").alias("distinct"),
                F.min("offset").alias("low"),
                F.max("offset").alias("high"),
            )
            .collect()
        }
        assert sorted(summary) == sorted(STREAMS)
        for name in STREAMS:
            row = summary[name]
            assert (row["low"], row["high"]) == (starts[name], RECORDS - 1)
            assert row["n"] == row["distinct"] == RECORDS - starts[name]
    finally:
        frame.unpersist()


def test_spark_batch_read_returns_every_record_once(spark: Any, filled: Path) -> None:
    frame = load(spark, filled)
    assert frame.rdd.getNumPartitions() >= 2 * len(STREAMS)  # 100k records / 40k per task
    check_exact(spark, filled, dict.fromkeys(STREAMS, 0))


def test_spark_batch_read_offsets_and_timestamps(spark: Any, filled: Path) -> None:
    frame = load(
        spark,
        filled,
        startingOffsets='{"alpha": 99990, "beta": "latest"}',
        endingOffsets='{"gamma": 5}',
    )
    rows = frame.select("stream", "offset").collect()
    assert sorted((row["stream"], row["offset"]) for row in rows) == (
        [("alpha", offset) for offset in range(99_990, RECORDS)]
        + [("gamma", offset) for offset in range(5)]
    )


def test_spark_batch_read_from_timestamp(spark: Any, filled: Path) -> None:
    everything = load(spark, filled)
    middle = everything.filter("stream = 'beta' and offset = 50000").collect()[0]["timestamp"]
    middle_ms = int(middle.timestamp() * 1000)
    later = load(spark, filled, fromTimestamp=str(middle_ms))
    expected = everything.filter(F.col("timestamp") >= F.lit(middle)).count()
    assert 0 < later.count() == expected
    assert later.filter(F.col("timestamp") < F.lit(middle)).count() == 0
    newest = everything.agg(F.max("timestamp")).collect()[0][0]
    assert load(spark, filled, fromTimestamp=str(int(newest.timestamp() * 1000) + 1)).count() == 0


def test_spark_batch_read_after_trim_skips_trimmed(spark: Any, filled: Path) -> None:
    with walstream.blocking.open(str(filled)) as client:
        client.open_stream("alpha").trim(30_000)
        client.open_stream("gamma").trim(99_999)
    check_exact(spark, filled, {"alpha": 30_000, "beta": 0, "gamma": 99_999})


def test_spark_batch_read_after_compaction_is_unchanged(spark: Any, filled: Path) -> None:
    with walstream.blocking.open(str(filled)) as client:
        metadata = client.async_client.metadata
        before = {info.key for info in client.run(metadata.list_objects())}
        assert client.run(client.async_client.compact())
        after = {info.key for info in client.run(metadata.list_objects())}
    assert after - before, "compaction wrote no new object"
    starts = {"alpha": 30_000, "beta": 0, "gamma": 99_999}
    check_exact(spark, filled, starts)
