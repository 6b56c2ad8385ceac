"""A Python worker's task freezes what the process holds (``gc.freeze``) after a collection when
the collector's oldest generation has grown large: PySpark runs a full ``gc.collect()`` after
every task, which would otherwise walk every module's objects each time.

The check runs in a fresh interpreter (freezing is for the whole process, pytest's included),
through the data source's own reader as a Spark task calls it, without Spark."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent(
    """
    import asyncio, gc, sys, weakref

    import walstream
    from walstream import Record
    from walstream_spark.source import WalstreamReader

    config = sys.argv[1]

    async def fill() -> None:
        async with walstream.open(config) as client:
            stream = await client.create_stream("events")
            await stream.append([Record(b"v%d" % n) for n in range(500)])
            await client.flush()

    asyncio.run(fill())
    gc.collect()  # what a worker holds before its first task sits in the oldest generation

    class Node:
        pass

    garbage = Node()
    garbage.self = garbage  # a cycle: only the collector frees it
    alive = weakref.ref(garbage)
    del garbage
    gc.disable()  # no automatic collection: only the task's own may free the cycle

    def task() -> int:  # what a Spark read task calls
        reader = WalstreamReader({"config": config, "streams": "events"})
        (partition,) = reader.partitions()
        return sum(batch.num_rows for batch in reader.read(partition))

    counts = [gc.get_freeze_count()]
    rows = task()
    counts.append(gc.get_freeze_count())
    print("garbage frozen", alive() is not None)
    # Later tasks, after PySpark's collection each: the second freezes what the first one
    # imported, the third finds nothing new to freeze.
    for _ in range(2):
        gc.collect()
        rows += task()
        counts.append(gc.get_freeze_count())
    # A task that imported a lot (PySpark's serializers import pandas): frozen at the next one.
    imported = [Node() for _ in range(20_000)]
    gc.collect()
    rows += task()
    counts.append(gc.get_freeze_count())
    print("rows", rows)
    print("counts", *counts)
    """
)


@pytest.mark.slow
def test_a_task_freezes_what_the_worker_holds_when_the_oldest_generation_grew(
    deployment: Path, tmp_path: Path
) -> None:
    script = tmp_path / "task.py"
    script.write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script), str(deployment)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert lines["rows"] == "2000"
    before, first, second, third, fourth = (int(count) for count in lines["counts"].split())
    assert before == 0
    assert first > 10_000, "the first task froze what the process holds"
    assert lines["garbage"] == "frozen False", "garbage was collected before the freeze"
    assert third == second, "a task finding little new in the oldest generation does not freeze"
    assert fourth >= third + 20_000, "what a task left behind is frozen at the next one"
