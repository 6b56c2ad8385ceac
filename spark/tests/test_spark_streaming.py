"""readStream: availableNow runs stopped and restarted while records arrive process every record
exactly once; processing-time triggers follow new commits; maxRecordsPerTrigger bounds batches."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import walstream.blocking
from walstream import Record


def append_range(config: Path, stream: str, start: int, end: int, batch: int = 500) -> None:
    with walstream.blocking.open(str(config)) as client:
        try:
            handle = client.open_stream(stream)
        except walstream.errors.StreamNotFound:
            handle = client.create_stream(stream)
        for low in range(start, end, batch):
            handle.append([Record(str(n).encode()) for n in range(low, min(end, low + batch))])


def run_available_now(spark: Any, config: Path, output: Path, checkpoint: Path) -> list[Any]:
    frame = (
        spark.readStream.format("walstream")
        .option("config", str(config))
        .option("streams", "events")
        .option("startingOffsets", "earliest")
        .option("maxRecordsPerTrigger", "4000")
        .load()
        .selectExpr("offset", "cast(value as string) as value")
    )
    query = (
        frame.writeStream.format("parquet")
        .option("path", str(output))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(180)
    assert not query.isActive
    assert query.exception() is None
    return [progress for progress in query.recentProgress if progress["numInputRows"]]


@pytest.mark.slow
def test_spark_streaming_available_now_restarts_exactly_once(
    spark: Any, deployment: Path, tmp_path: Path
) -> None:
    output, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    append_range(deployment, "events", 0, 10_000)
    batches = run_available_now(spark, deployment, output, checkpoint)
    assert len(batches) >= 3  # 10,000 records at most 4,000 per micro-batch
    assert max(progress["numInputRows"] for progress in batches) <= 4000

    # Records keep arriving while the query runs; each restart picks up from its checkpoint.
    total = 10_000
    for _round in range(2):
        writer = threading.Thread(
            target=append_range, args=(deployment, "events", total, total + 6000)
        )
        writer.start()
        run_available_now(spark, deployment, output, checkpoint)
        writer.join()
        total += 6000
    run_available_now(spark, deployment, output, checkpoint)

    rows = spark.read.parquet(str(output)).collect()
    offsets = sorted(row["offset"] for row in rows)
    assert offsets == list(range(total))
    assert all(row["value"] == str(row["offset"]) for row in rows)


@pytest.mark.slow
def test_spark_streaming_processing_time_follows_commits(
    spark: Any, deployment: Path, tmp_path: Path
) -> None:
    append_range(deployment, "ticks", 0, 100)
    frame = (
        spark.readStream.format("walstream")
        .option("config", str(deployment))
        .option("streams", "ticks")
        .option("startingOffsets", '{"ticks": 40}')
        .load()
    )
    query = (
        frame.writeStream.format("memory")
        .queryName("ticks_seen")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    try:
        append_range(deployment, "ticks", 100, 300)
        while spark.sql("select count(*) from ticks_seen").collect()[0][0] < 260:
            time.sleep(0.5)  # bounded by the test's timeout
        offsets = sorted(row[0] for row in spark.sql("select offset from ticks_seen").collect())
        assert offsets == list(range(40, 300))
    finally:
        query.stop()
