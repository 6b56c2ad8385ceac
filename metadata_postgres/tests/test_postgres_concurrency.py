"""Several node processes on one PostgreSQL catalogue: concurrent commits, claims, trims and
compactions keep every invariant, and epochs fence a zombie exactly as with SQLite."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from walstream.metadata import NodeState, ObjectState
from walstream_metadata_postgres.testing.nodes import SPAN, commit_of, open_store

NODES = 4
COMMITS = 40


def _spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "walstream_metadata_postgres.testing.nodes", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow
async def test_node_processes_commit_claim_trim_and_compact_concurrently(
    make_store: Any, postgres_dsn: str, postgres_schema: str
) -> None:
    store = make_store()
    await store.create_stream("shared")
    workers = [
        _spawn("worker", postgres_dsn, postgres_schema, str(100 + i), str(COMMITS))
        for i in range(NODES)
    ]
    results = []
    for process in workers:
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))

    # Exactly one node won the race for the shared stream, and it owns it.
    winners = [r["node_id"] for r in results if r["won_shared"]]
    assert len(winners) == 1
    assert (await store.get_stream("shared")).owner_node_id == winners[0]

    destroyed = {o.object_id for o in await store.list_objects(ObjectState.MARK_DESTROYED)}
    for result in results:
        stream = (await store.get_streams([result["stream_id"]]))[result["stream_id"]]
        assert stream.committed_end == result["committed_end"] == COMMITS * SPAN
        assert stream.start_offset == COMMITS * SPAN - 3 * SPAN
        # What a reader sees: contiguous, non-overlapping ranges from the start to the end.
        page = await store.get_objects(stream.stream_id, stream.start_offset, limit=1000)
        position = page[0].ranges[0].start_offset
        assert position <= stream.start_offset
        for info in page:
            assert info.ranges[0].start_offset == position
            assert info.object_id not in destroyed
            position = info.ranges[0].end_offset
        assert position == stream.committed_end
        assert result["trims"] == COMMITS // 5
        assert result["compactions"] >= 1
    # Trimmed and compacted-away objects are garbage, and nothing live is.
    assert len(destroyed) >= NODES * 2


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
async def test_epochs_fence_a_zombie_process(
    make_store: Any, postgres_dsn: str, postgres_schema: str, tmp_path: Path, backend: str
) -> None:
    """The same zombie, the same failover, the same outcome on PostgreSQL and on SQLite."""
    if backend == "postgres":
        store, dsn = make_store(), postgres_dsn
    else:
        dsn = f"sqlite:{tmp_path / 'meta.db'}"
        store = open_store(dsn, "")
    stream = await store.create_stream("fenced")
    zombie = _spawn("zombie", dsn, postgres_schema, "500", "fenced")
    assert zombie.stdout is not None
    acknowledged = 0
    assert zombie.stdout.readline().strip() == "CLAIMED"
    while acknowledged < 5 * SPAN:  # let it commit a while
        line = zombie.stdout.readline().strip()
        assert line.startswith("ACK "), line
        acknowledged = int(line.split()[1])

    # Fail the node over while it keeps committing; a new node takes the stream.
    failing = await store.begin_failover(500)
    await store.set_node_state(500, failing.node_epoch, NodeState.FAILED_OVER)
    rescuer = await store.register_node(501, {"type": "test"})
    claimed = await store.claim_stream(stream.stream_id, 501, rescuer.node_epoch)

    fenced = ""
    for line in zombie.stdout:
        if line.startswith("ACK "):
            acknowledged = int(line.split()[1])
        else:
            fenced = line.strip()
            break
    zombie.wait(timeout=30)
    assert fenced.startswith("FENCED FencedError"), fenced

    # Everything the zombie was acknowledged is committed, nothing more; the new owner
    # continues exactly at its end.
    after = (await store.get_streams([stream.stream_id]))[stream.stream_id]
    assert after.committed_end == acknowledged
    assert after.owner_node_id == 501
    (object_id,) = await store.prepare_objects(1, 600_000)
    await store.commit_objects(
        501,
        rescuer.node_epoch,
        [commit_of(object_id, stream.stream_id, acknowledged, acknowledged + SPAN, claimed.epoch)],
    )
    assert (await store.get_streams([stream.stream_id]))[stream.stream_id].committed_end == (
        acknowledged + SPAN
    )
    if backend == "sqlite":
        await store.close()
