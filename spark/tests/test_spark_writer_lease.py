"""Spark writer nodes hold leases: a killed writer's stream is released after its lease, not
after ``ownershipTimeout``."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from walstream.errors import FencedError
from walstream.metadata import NodeState
from walstream.records import Record
from walstream_spark.runtime import backends_for, run
from walstream_spark.writing import _append_owned, _open_client


@pytest.mark.slow
def test_a_killed_writers_stream_is_released_after_one_lease(tmp_path: Path) -> None:
    config = tmp_path / "deploy.yaml"
    config.write_text(
        "node: {id: 1}\n"
        "wal: {type: memory}\n"
        "object_store: {type: local, root: objects}\n"
        "metadata: {type: sqlite, path: meta.db}\n"
        "cluster: {lease_duration: 600ms, heartbeat_interval: 100ms}\n"
    )
    backends = backends_for(str(config))
    dead = run(_open_client(backends, 900_001))
    stream = run(dead.create_stream("leased"))
    run(stream.append([Record(b"from the dead writer")]))
    run(dead.flush())  # committed, as a task's batches are before it can fail
    assert dead.cluster is not None
    run(dead.cluster.stop())  # the executor is killed: no more renewals, no close
    survivor = run(_open_client(backends, 900_002))
    try:
        mine = run(survivor.open_stream("leased"))
        started = time.monotonic()
        ack = run(_append_owned(survivor, mine, [Record(b"survivor")], started + 5))
        waited = time.monotonic() - started
        assert waited < 5, f"the stream was released after {waited:.1f}s, not after one lease"
        assert ack.start == 1
        info = run(backends.metadata.get_node(900_001))
        assert info is not None and info.state is NodeState.FAILED_OVER
        with pytest.raises(FencedError):
            run(stream.append([Record(b"zombie")]))
        run(survivor.flush())
        result = run(mine.read(start=0))
        assert [r.value for r in result.records] == [b"from the dead writer", b"survivor"]
    finally:
        run(survivor.close())
        run(dead.close())


@pytest.mark.slow
def test_a_writers_failover_left_halfway_is_finished_by_the_next_writer(tmp_path: Path) -> None:
    """A writer that claimed a dead writer's failover is killed before it released the streams:
    once its failover lease expires, the next writer claims the failover again and finishes it."""
    config = tmp_path / "deploy.yaml"
    config.write_text(
        "node: {id: 1}\n"
        "wal: {type: memory}\n"
        "object_store: {type: local, root: objects}\n"
        "metadata: {type: sqlite, path: meta.db}\n"
        "cluster: {lease_duration: 600ms, heartbeat_interval: 100ms}\n"
    )
    backends = backends_for(str(config))
    dead = run(_open_client(backends, 900_011))
    stream = run(dead.create_stream("halfway"))
    run(stream.append([Record(b"from the dead writer")]))
    run(dead.flush())
    assert dead.cluster is not None
    run(dead.cluster.stop())
    node = run(backends.metadata.get_node(900_011))
    assert node is not None
    while run(backends.metadata.store_time_ms()) <= node.lease_expires_ms:
        time.sleep(0.02)
    # Another writer wins the claim and is killed before it marks the node or releases a stream.
    halfway = run(backends.metadata.claim_failover(900_011, node.node_epoch, 900_012, 600))
    assert halfway is not None and halfway.state is NodeState.FAILING_OVER
    survivor = run(_open_client(backends, 900_013))
    try:
        mine = run(survivor.open_stream("halfway"))
        started = time.monotonic()
        ack = run(_append_owned(survivor, mine, [Record(b"survivor")], started + 5))
        assert ack.start == 1
        info = run(backends.metadata.get_node(900_011))
        assert info is not None and info.state is NodeState.FAILED_OVER
        assert info.node_epoch == halfway.node_epoch + 1, "the halfway claim was not fenced"
        run(survivor.flush())
        result = run(mine.read(start=0))
        assert [r.value for r in result.records] == [b"from the dead writer", b"survivor"]
    finally:
        run(survivor.close())
        run(dead.close())
