"""A click-stream pipeline on walstream and Spark, end to end, in one command::

    python examples/pipeline/run.py [--data ./pipeline-data] [--events 20000]

1. **Generate** click events (JSON values, event times spread over a few minutes) into the
   walstream stream ``clicks`` — in two waves, so the streaming job runs twice.
2. **Stream**: a Structured Streaming query reads ``clicks``, counts clicks per minute of event
   time and, for every micro-batch, writes the updated minutes both to Parquet
   (``<data>/per_minute/batch_id=N``) and to the walstream stream ``clicks_per_minute``
   (idempotently: a re-run micro-batch does not append twice). It runs with
   ``trigger(availableNow=True)`` after each wave and resumes from its checkpoint.
3. **Replay**: a batch job reads the full history of ``clicks`` and recomputes the per-minute
   counts; the script checks that the Parquet result and the ``clicks_per_minute`` stream both
   equal it, prints the table and exits non-zero on any difference.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import random
import shutil
import sys
from pathlib import Path
from typing import Any

import walstream
from walstream import Record

BASE_EVENT_MS = 1_699_999_980_000  # a whole minute
PAGES = ("/", "/search", "/item", "/cart", "/checkout")


def write_deployment(data: Path) -> Path:
    data.mkdir(parents=True, exist_ok=True)
    if importlib.util.find_spec("walstream_wal_ebs") is not None:
        wal = "{type: ebs, path: wal.img, capacity: 128MiB, direct: false}"
    else:
        wal = "{type: memory}"
    config = data / "deploy.yaml"
    config.write_text(
        "node: {id: 1}\n"
        f"wal: {wal}\n"
        "object_store: {type: local, root: objects}\n"
        "metadata: {type: sqlite, path: meta.db}\n"
        "upload: {max_interval: 100ms}\n"
    )
    return config


async def generate(config: Path, first: int, count: int, total: int, seed: int) -> None:
    """Append clicks ``first .. first+count`` of ``total``; event time grows with the index
    (about 10 minutes for the whole run), so later waves add to later minutes."""
    rng = random.Random(seed + first)
    async with walstream.open(str(config)) as client:
        try:
            stream = await client.open_stream("clicks")
        except walstream.errors.StreamNotFound:
            stream = await client.create_stream("clicks")
        batch: list[Record] = []
        for index in range(first, first + count):
            event_ms = BASE_EVENT_MS + index * 600_000 // total
            click = {"user": f"u{rng.randrange(500)}", "page": rng.choice(PAGES), "n": index}
            batch.append(
                Record(
                    json.dumps(click).encode(), key=click["user"].encode(), timestamp_ms=event_ms
                )
            )
            if len(batch) == 1000:
                await stream.append(batch)
                batch = []
        if batch:
            await stream.append(batch)
    # Closing the client uploaded and committed everything: Spark sees all of it now.


def run_streaming(spark: Any, config: Path, data: Path) -> None:
    from pyspark.sql import functions as F

    clicks = (
        spark.readStream.format("walstream")
        .option("config", str(config))
        .option("streams", "clicks")
        .option("startingOffsets", "earliest")
        .option("maxRecordsPerTrigger", "5000")
        .load()
    )
    per_minute = (
        clicks.groupBy(F.window("timestamp", "1 minute").alias("window"))
        .count()
        .select(F.col("window.start").alias("minute"), F.col("count").alias("clicks"))
    )
    query_id = "clicks-per-minute"

    def write_batch(frame: Any, batch_id: int) -> None:
        frame = frame.cache()
        frame.write.mode("overwrite").parquet(str(data / "per_minute" / f"batch_id={batch_id}"))
        (
            frame.select(
                F.to_json(
                    F.struct(
                        F.date_format("minute", "yyyy-MM-dd'T'HH:mm:ss").alias("minute"),
                        "clicks",
                        F.lit(batch_id).alias("batch"),
                    )
                ).alias("value"),
                F.col("minute").alias("timestamp"),
            )
            .write.format("walstream")
            .option("config", str(config))
            .option("stream", "clicks_per_minute")
            .option("queryId", query_id)
            .option("batchId", str(batch_id))
            .mode("append")
            .save()
        )
        frame.unpersist()

    query = (
        per_minute.writeStream.outputMode("update")
        .foreachBatch(write_batch)
        .option("checkpointLocation", str(data / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(f"streaming query failed: {query.exception()}")


def replay_counts(spark: Any, config: Path) -> dict[str, int]:
    from pyspark.sql import functions as F

    history = (
        spark.read.format("walstream")
        .option("config", str(config))
        .option("streams", "clicks")
        .load()
    )
    rows = (
        history.groupBy(
            F.date_format(F.window("timestamp", "1 minute").start, "yyyy-MM-dd'T'HH:mm:ss").alias(
                "minute"
            )
        )
        .count()
        .collect()
    )
    return {row["minute"]: row["count"] for row in rows}


def parquet_counts(spark: Any, data: Path) -> dict[str, int]:
    from pyspark.sql import functions as F

    rows = (
        spark.read.parquet(str(data / "per_minute"))
        .select(
            F.date_format("minute", "yyyy-MM-dd'T'HH:mm:ss").alias("minute"), "clicks", "batch_id"
        )
        .collect()
    )
    latest: dict[str, tuple[int, int]] = {}
    for row in rows:  # update mode: a minute's newest batch holds its final count
        if row["minute"] not in latest or row["batch_id"] > latest[row["minute"]][0]:
            latest[row["minute"]] = (row["batch_id"], row["clicks"])
    return {minute: clicks for minute, (_batch, clicks) in latest.items()}


def stream_counts(spark: Any, config: Path) -> dict[str, int]:
    rows = (
        spark.read.format("walstream")
        .option("config", str(config))
        .option("streams", "clicks_per_minute")
        .load()
        .select("offset", "value")
        .collect()
    )
    latest: dict[str, int] = {}
    for row in sorted(rows, key=lambda row: row["offset"]):  # later records supersede
        update = json.loads(row["value"])
        latest[update["minute"]] = update["clicks"]
    return latest


def main(argv: list[str] | None = None, spark: Any = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data",
        type=Path,
        default=Path("pipeline-data"),
        help="folder for the deployment, checkpoint and Parquet output (reset)",
    )
    parser.add_argument("--events", type=int, default=20_000, help="click events to generate")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    data: Path = args.data.absolute()
    shutil.rmtree(data, ignore_errors=True)
    config = write_deployment(data)

    if spark is None:
        from walstream_spark import local_session

        spark = local_session("local[2]", "walstream-pipeline")
    else:
        import walstream_spark

        walstream_spark.register(spark)

    first_wave = args.events * 3 // 5
    asyncio.run(generate(config, 0, first_wave, args.events, args.seed))
    run_streaming(spark, config, data)
    asyncio.run(generate(config, first_wave, args.events - first_wave, args.events, args.seed))
    run_streaming(spark, config, data)  # restarts from the checkpoint

    replay = replay_counts(spark, config)
    parquet = parquet_counts(spark, data)
    streamed = stream_counts(spark, config)
    print(f"{'minute':<22}{'replay':>8}{'parquet':>9}{'stream':>8}")
    for minute in sorted(set(replay) | set(parquet) | set(streamed)):
        print(
            f"{minute:<22}{replay.get(minute, '-'):>8}{parquet.get(minute, '-'):>9}"
            f"{streamed.get(minute, '-'):>8}"
        )
    total = sum(replay.values())
    ok = replay == parquet == streamed and total == args.events
    print(
        f"{total} clicks in {len(replay)} minutes; streaming result "
        f"{'equals' if ok else 'DIFFERS FROM'} the batch replay"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
