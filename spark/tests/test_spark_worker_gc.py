"""A Python worker's first read or write task freezes what the process holds (``gc.freeze``)
after a collection, once per process: PySpark runs a full ``gc.collect()`` after every task,
which would otherwise walk every module's objects each time.

Each check runs in a fresh interpreter (freezing is for the whole process, pytest's included),
through the data source's own reader as a Spark task calls it, without Spark."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import asyncio, gc, os, sys, weakref

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
    reader = WalstreamReader({"config": config, "streams": "events"})
    (partition,) = reader.partitions()

    class Node:
        pass

    garbage = Node()
    garbage.self = garbage  # a cycle: only the collector frees it
    alive = weakref.ref(garbage)
    del garbage
    gc.disable()  # no automatic collection: only the task's own may free the cycle

    before = gc.get_freeze_count()
    rows = sum(batch.num_rows for batch in reader.read(partition))
    first = gc.get_freeze_count()
    kept = [Node() for _ in range(1000)]  # objects of a second task
    rows += sum(batch.num_rows for batch in reader.read(partition))
    second = gc.get_freeze_count()
    print("rows", rows)
    print("before", before, "first", first, "second", second)
    print("garbage frozen", alive() is not None)

    child = os.fork()
    if child == 0:  # a worker forked from one that froze: its own first task freezes again
        more = [Node() for _ in range(1000)]
        rows = sum(batch.num_rows for batch in reader.read(partition))
        os._exit(0 if gc.get_freeze_count() >= second + 1000 and rows == 500 else 3)
    _, status = os.waitpid(child, 0)
    print("child", os.waitstatus_to_exitcode(status))
    """
)


def test_a_worker_freezes_what_it_holds_once_at_its_first_task(
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
    assert lines["rows"] == "1000"
    counts = lines["before"].split()
    before, first, second = int(counts[0]), int(counts[2]), int(counts[4])
    assert before == 0
    assert first > 10_000, "the first task froze what the process holds"
    assert second == first, "later tasks do not freeze again"
    assert lines["garbage"] == "frozen False", "garbage was collected before the freeze"
    assert lines["child"] == "0", "a forked worker freezes at its own first task"
