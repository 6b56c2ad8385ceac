"""Batch and streaming writes: rows land once, even when a task fails and is retried, and when
a micro-batch is re-run after a restart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import walstream.blocking
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType
from walstream import Record
from walstream_spark.writing import MARKER_WRITER, WRITER_NODE_BASE


def stream_values(config: Path, name: str) -> list[bytes]:
    with walstream.blocking.open(str(config)) as client:
        stream = client.open_stream(name)
        values: list[bytes] = []
        position = 0
        while True:
            result = stream.read(start=position, limit_records=10_000)
            if not result.records:
                return values
            values.extend(record.value for record in result.records)
            position = result.records[-1].offset + 1


def writer_nodes(config: Path) -> list[Any]:
    with walstream.blocking.open(str(config)) as client:
        nodes = client.run(client.async_client.metadata.list_nodes())
    return [node for node in nodes if node.node_id >= WRITER_NODE_BASE]


@pytest.mark.slow
def test_spark_write_appends_rows_with_key_headers_timestamp(spark: Any, deployment: Path) -> None:
    frame = spark.range(0, 3000, numPartitions=3).select(
        F.col("id").cast("string").alias("value"),
        F.lit(b"k").alias("key"),
        F.create_map(F.lit("origin"), F.lit(b"spark")).alias("headers"),
        F.timestamp_millis(F.lit(1_700_000_000_000) + F.col("id")).alias("timestamp"),
    )
    frame.write.format("walstream").option("config", str(deployment)).option(
        "stream", "written"
    ).option("batchRecords", "250").mode("append").save()
    back = (
        spark.read.format("walstream")
        .option("config", str(deployment))
        .option("streams", "written")
        .load()
    )
    rows = back.collect()
    assert sorted(int(row["value"]) for row in rows) == list(range(3000))
    assert {row["key"] for row in rows} == {b"k"}
    assert all(row["headers"]["origin"] == b"spark" for row in rows)
    # The three partitions append concurrently, and a stream's timestamps never decrease: in
    # offset order each record carries its own timestamp or, when a record ahead of it in the
    # stream was stamped later, that later one (docs/guides/lifecycle.md).
    ordered = sorted(rows, key=lambda row: row["offset"])
    stored = [round(row["timestamp"].timestamp() * 1000) for row in ordered]
    latest, expected = 0, []
    for row in ordered:
        latest = max(latest, 1_700_000_000_000 + int(row["value"]))
        expected.append(latest)
    assert stored == expected
    assert sum(MARKER_WRITER in row["headers"] for row in rows) == 3000 // 250


@pytest.mark.slow
def test_spark_write_task_retry_does_not_duplicate(spark: Any, deployment: Path) -> None:
    @F.udf(BinaryType())
    def value_or_fail_once(number: int) -> bytes | None:
        from pyspark import TaskContext

        # The first attempt of the task holding row 3500 yields a null value there: the writer
        # fails after appending (and, on close, committing) the earlier batches of its task.
        context = TaskContext.get()
        if number == 3500 and context is not None and context.attemptNumber() == 0:
            return None
        return str(number).encode()

    frame = spark.range(0, 5000, numPartitions=2).select(value_or_fail_once("id").alias("value"))
    frame.write.format("walstream").option("config", str(deployment)).option(
        "stream", "retried"
    ).option("batchRecords", "200").mode("append").save()

    values = stream_values(deployment, "retried")
    assert sorted(int(value) for value in values) == list(range(5000))
    # The failing task ran twice under the same node id: its second start fenced the first.
    assert max(node.node_epoch for node in writer_nodes(deployment)) >= 2


@pytest.mark.slow
def test_spark_write_stream_rerun_batch_is_not_duplicated(
    spark: Any, deployment: Path, tmp_path: Path
) -> None:
    with walstream.blocking.open(str(deployment)) as client:
        source = client.create_stream("source")
        for low in range(0, 2000, 500):
            source.append([Record(str(n).encode()) for n in range(low, low + 500)])
    checkpoint = tmp_path / "checkpoint"

    def run() -> None:
        frame = (
            spark.readStream.format("walstream")
            .option("config", str(deployment))
            .option("streams", "source")
            .option("startingOffsets", "earliest")
            .option("maxRecordsPerTrigger", "800")
            .load()
            .select("value")
        )
        query = (
            frame.writeStream.format("walstream")
            .option("config", str(deployment))
            .option("stream", "copy")
            .option("batchRecords", "100")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(180)
        assert query.exception() is None

    run()
    assert sorted(int(value) for value in stream_values(deployment, "copy")) == list(range(2000))
    # Forget that the last micro-batch committed: the restarted query runs it again.
    commits = sorted((checkpoint / "commits").glob("[0-9]*"), key=lambda path: int(path.name))
    last = commits[-1]
    last.unlink()
    (last.parent / f".{last.name}.crc").unlink(missing_ok=True)
    run()
    assert sorted(int(value) for value in stream_values(deployment, "copy")) == list(range(2000))
