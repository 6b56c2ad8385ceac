"""S2's official Python SDK (``s2-sdk``, HTTP/2) across the SIGKILL of a stream's owner.

Three ``walstream serve`` processes on one throwaway PostgreSQL and one moto S3, each node with
its own s3 WAL (``walstream_metadata_postgres.testing.cluster``), default lease settings. The
SDK appends through node A to a stream node B owns (A forwards to B); B gets SIGKILL; the SDK's
appends through A fail until B's lease expires and a live node fails B over, then succeed
again. A read through the third node returns every acknowledged record exactly once, at the
seq num its acknowledgement named.

The SDK is configured with ``Retry(max_attempts=1)``: it never retries an append by itself, so
every attempt the test makes is one request and nothing it does not see can add a copy. Each
attempt carries a body of its own; an attempt that failed (a 503 while the owner is dead, a
timeout) is *ambiguous* — it may or may not have been applied — so it may appear at most once,
and an acknowledged one exactly once.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from datetime import timedelta

import pytest
from walstream.config.engine import ClusterConfig
from walstream.metadata.contract import NodeState
from walstream_metadata_postgres import PostgresMetadataStore
from walstream_metadata_postgres.testing.cluster import (
    Cluster,
    ClusterSettings,
    cluster_features_available,
)

s2_sdk = pytest.importorskip("s2_sdk")
from s2_sdk import (  # noqa: E402
    S2,
    AppendInput,
    Endpoints,
    ReadLimit,
    Record,
    Retry,
    S2Error,
    SeqNum,
    Timeout,
)

pytestmark = pytest.mark.skipif(
    not cluster_features_available(), reason="this walstream has no node leases"
)

ENTRY, OWNER, READER = 1, 2, 3
BASIN = "sdk-failover"
STREAM = "orders"
LEASE_S = ClusterConfig.lease_duration_s
HEARTBEAT_S = ClusterConfig.heartbeat_interval_s
RECOVERY_BOUND_S = 3 * LEASE_S + 10.0
"""Generous: B's lease runs out within ``LEASE_S`` of the kill, a watcher notices within a
heartbeat, the failover replays a WAL of a few records, and the entry node's owner cache
(1 s) and the client's pause between attempts add a little. On an idle machine it takes
about ``LEASE_S + 1`` s; the rest is room for a loaded CI machine."""


@dataclass
class History:
    """What the client saw: acknowledged bodies with their seq nums, and ambiguous bodies."""

    acknowledged: dict[bytes, int] = field(default_factory=dict)
    ambiguous: list[bytes] = field(default_factory=list)
    ack_times: list[tuple[float, float]] = field(default_factory=list)
    """(sent, acknowledged) monotonic times of each acknowledged attempt."""
    errors: list[str] = field(default_factory=list)


def sdk(url: str, token: str) -> S2:
    return S2(
        token,
        endpoints=Endpoints(account=url, basin=url),
        timeout=Timeout(request=timedelta(seconds=5)),
        retry=Retry(max_attempts=1),  # no retry inside the SDK: every attempt is ours
    )


async def append_once(stream: object, body: bytes, history: History) -> bool:
    """One append attempt of ``body``; True when acknowledged."""
    sent = time.monotonic()
    try:
        ack = await stream.append(AppendInput(records=[Record(body=body)]))  # type: ignore[attr-defined]
    except S2Error as error:
        history.ambiguous.append(body)
        history.errors.append(f"{type(error).__name__}: {error}")
        return False
    assert ack.end.seq_num == ack.start.seq_num + 1, ack
    history.acknowledged[body] = ack.start.seq_num
    history.ack_times.append((sent, time.monotonic()))
    return True


async def read_everything(
    stream: object, at_least: int, settle_s: float
) -> list[tuple[int, bytes]]:
    """Every record of the stream as (seq num, body), once the reader sees ``at_least`` records
    (a node that does not own the stream serves committed data, which may trail an upload
    interval), or whatever it sees after ``settle_s``."""
    deadline = time.monotonic() + settle_s
    while True:
        records: list[tuple[int, bytes]] = []
        while True:
            batch = await stream.read(start=SeqNum(len(records)), limit=ReadLimit(count=1000))  # type: ignore[attr-defined]
            records += [(record.seq_num, record.body) for record in batch.records]
            if not batch.records or (batch.tail is not None and len(records) >= batch.tail.seq_num):
                break
        if len(records) >= at_least or time.monotonic() > deadline:
            return records
        await asyncio.sleep(0.1)


@pytest.mark.slow
async def test_sdk_appends_through_a_survivor_resume_after_the_owner_is_killed() -> None:
    settings = ClusterSettings(nodes=3, extra={"upload": {"max_interval": "100ms"}})
    with Cluster(settings) as cluster:
        entry = sdk(cluster.url(ENTRY), settings.token)
        owner = sdk(cluster.url(OWNER), settings.token)
        reader = sdk(cluster.url(READER), settings.token)
        metadata = PostgresMetadataStore(cluster.postgres.dsn, schema="walstream", retry_for_s=10)
        try:
            await entry.create_basin(BASIN)
            await owner.basin(BASIN).create_stream(STREAM)
            history = History()
            # The first write claims the stream for the node that receives it: B.
            assert await append_once(owner.basin(BASIN).stream(STREAM), b"first", history)
            info = await metadata.get_stream(f"{BASIN}.{STREAM}")
            assert info.owner_node_id == OWNER

            through_entry = entry.basin(BASIN).stream(STREAM)
            attempt = 0

            async def append_next() -> bool:
                nonlocal attempt
                attempt += 1
                return await append_once(through_entry, b"a%05d" % attempt, history)

            for _ in range(10):  # forwarded by A to B, acknowledged by B
                assert await append_next(), history.errors
            assert history.errors == []

            alive = await metadata.get_node(OWNER)
            assert alive is not None and alive.live(await metadata.store_time_ms()), alive
            killed_at = time.monotonic()
            await asyncio.to_thread(cluster.kill, OWNER)
            dead = await metadata.get_node(OWNER)
            assert dead is not None
            # B's last lease: read after the kill, unless a starved B's lease had run out and
            # another node claimed it already (then its lease before the kill bounds it).
            lease_expires_ms = (dead if dead.state is NodeState.RUNNING else alive).lease_expires_ms
            recovered_at: float | None = None
            while time.monotonic() < killed_at + RECOVERY_BOUND_S:
                sent = time.monotonic()
                if await append_next() and sent > killed_at:
                    recovered_at = time.monotonic()
                    break
                await asyncio.sleep(0.05)
            store_now_ms = await metadata.store_time_ms()
            recovery_s = None if recovered_at is None else recovered_at - killed_at
            print(f"first append through node {ENTRY} acknowledged {recovery_s} s after the kill")
            assert recovery_s is not None, (
                f"no append through node {ENTRY} acknowledged within {RECOVERY_BOUND_S:g}s of "
                f"the SIGKILL of the owner (last errors: {history.errors[-3:]}); node logs: "
                f"{cluster.node_logs()}"
            )
            # Nobody may take B's streams over before its lease expired on the store's clock:
            # the first acknowledgement after the kill came after that expiry.
            assert store_now_ms >= lease_expires_ms, (store_now_ms, dead)
            failed_over = await metadata.get_node(OWNER)
            assert failed_over is not None and failed_over.state is NodeState.FAILED_OVER, (
                failed_over
            )

            for _ in range(10):  # A (or whoever claimed it) writes the stream now
                assert await append_next(), history.errors[-3:]

            read = await read_everything(
                reader.basin(BASIN).stream(STREAM), len(history.acknowledged), 15.0
            )
        finally:
            await metadata.close()
            for client in (entry, owner, reader):
                await client.close()

    bodies = [body for _, body in read]
    assert [seq for seq, _ in read] == list(range(len(read))), read
    for body, seq_num in history.acknowledged.items():
        assert bodies.count(body) == 1, f"acknowledged {body!r} appears {bodies.count(body)}x"
        assert read[seq_num] == (seq_num, body), (seq_num, body, read[seq_num])
    for body in history.ambiguous:
        assert bodies.count(body) <= 1, f"ambiguous {body!r} appears {bodies.count(body)}x"
    unknown = set(bodies) - set(history.acknowledged) - set(history.ambiguous)
    assert not unknown, f"records nobody appended: {sorted(unknown)}"
