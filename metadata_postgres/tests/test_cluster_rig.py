"""The multi-node rig itself: two ``walstream serve`` processes on one PostgreSQL and one moto
S3 survive what the failover benchmark and the nemesis test do to them — SIGKILL and a restart
on the same port, SIGSTOP/SIGCONT, a PostgreSQL crash, an S3 endpoint restart — and every
acknowledged record reads back exactly once, in order, through either node."""

from __future__ import annotations

import asyncio
import time

import pytest
from walstream_metadata_postgres.testing.cluster import Cluster, ClusterSettings
from walstream_metadata_postgres.testing.s2client import S2Http


@pytest.mark.slow
async def test_nodes_survive_kill_pause_and_service_restarts() -> None:
    # A lease longer than any outage this test makes (a paused node, a PostgreSQL restart on a
    # loaded machine): the rig is under test here, not failover, so no node may lose its lease.
    settings = ClusterSettings(
        nodes=2, lease_duration="20s", extra={"upload": {"max_interval": "50ms"}}
    )
    with Cluster(settings) as cluster:
        assert {cluster.health(1)["node_id"], cluster.health(2)["node_id"]} == {1, 2}
        home = cluster.url(1)
        acknowledged: list[str] = []
        async with S2Http(settings.token, "rig-basin", timeout_s=2.0) as client:
            await client.ensure_basin(home)
            await client.ensure_stream(home, "events")

            async def append(value: str) -> None:
                # The first attempt after a restart may meet a dropped keep-alive connection.
                answer = await client.append_retrying(home, "events", value, len(acknowledged))
                assert (answer.status, answer.start) == ("ok", len(acknowledged)), answer
                acknowledged.append(value)

            await append("before-kill")
            port = cluster.nodes[1].port
            cluster.kill(1)  # with connections of ours in TIME_WAIT on its port
            assert cluster.health(1) is None
            cluster.start_node(1)
            assert cluster.nodes[1].port == port
            await append("after-restart")

            cluster.pause(1)
            paused = await client.append(home, "events", ["while-paused"], len(acknowledged))
            cluster.resume(1)
            assert paused.status == "ambiguous"  # the request timed out against a stopped node
            await append("while-paused")  # retried with match_seq_num: lands exactly once

            started = time.monotonic()
            await asyncio.to_thread(cluster.restart_postgres)
            assert time.monotonic() - started < 30
            await append("after-postgres-crash")
            await asyncio.to_thread(cluster.restart_s3, 0.5)
            await append("after-s3-restart")

            assert await client.read_all(home, "events") == acknowledged
            # The other node reads what is committed to object storage: within an upload interval.
            while (seen := await client.read_all(cluster.url(2), "events")) != acknowledged:
                assert seen == acknowledged[: len(seen)], seen  # a prefix until it catches up
                await asyncio.sleep(0.1)
