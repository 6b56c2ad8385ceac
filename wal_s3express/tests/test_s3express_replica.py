"""The Replica rules (walstream.wal.quorum.Replica) kept by one zonal bucket on a real moto server."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from typing import Any

import pytest
from walstream.errors import FencedError, NotFound, PreconditionFailed
from walstream.wal.quorum import Seal, encode_chunk
from walstream_wal_s3express import build_replicas
from walstream_wal_s3express.replica import ZonalBucketReplica
from walstream_wal_s3express.testing.zones import ZoneServer, zone_wal_options

_logs = itertools.count(1)


@pytest.fixture
async def replicas(shared_zones: list[ZoneServer]) -> AsyncIterator[Any]:
    """``make()`` → a new client (as another process would have) of zone 0."""
    made: list[ZonalBucketReplica] = []

    def make() -> ZonalBucketReplica:
        options = zone_wal_options(shared_zones[:1], request_timeout=2.0, prefix="rules")
        replica = build_replicas(options, node_id=7)[0]
        made.append(replica)
        return replica

    yield make
    for replica in made:
        await replica.close()


@pytest.fixture
def log_id() -> str:
    return f"log-{next(_logs)}"


def chunk(tag: str) -> bytes:
    return encode_chunk([tag.encode()])


@pytest.mark.slow
async def test_claim_fences_older_epochs(replicas: Any, log_id: str) -> None:
    first, second = replicas(), replicas()
    await first.claim(log_id, 3)
    await first.write_chunk(log_id, 3, 1, chunk("a"))
    listing = await second.claim(log_id, 5)
    assert listing.claimed_epoch == 5
    assert sorted(listing.chunks) == [1]
    # the old writer: its claim, seal, trim and chunk writes are refused from now on
    for attempt in (
        first.claim(log_id, 4),
        first.seal(log_id, 3, 1),
        first.trim(log_id, 3, 1, 0),
        first.write_chunk(log_id, 3, 2, chunk("b")),
    ):
        with pytest.raises(FencedError):
            await attempt
    # ... and nothing changed: the listing is the one the new owner saw, plus the refused chunk
    # (written before its check failed), which the next seal invalidates
    await second.seal(log_id, 5, 1)
    listing = await replicas().list_chunks(log_id)
    assert sorted(listing.chunks) == [1]
    assert listing.seals == (Seal(5, 1),)
    assert listing.trim_seq == 0


@pytest.mark.slow
async def test_write_is_idempotent_and_conditional(replicas: Any, log_id: str) -> None:
    replica = replicas()
    await replica.claim(log_id, 1)
    await replica.write_chunk(log_id, 1, 1, chunk("a"))
    await replica.write_chunk(log_id, 1, 1, chunk("a"))
    with pytest.raises(PreconditionFailed):
        await replica.write_chunk(log_id, 1, 1, chunk("other"))
    assert await replicas().read_chunk(log_id, 1) == (1, chunk("a"))
    # a newer epoch replaces the chunk at that seq
    await replica.claim(log_id, 2)
    await replica.write_chunk(log_id, 2, 1, chunk("b"))
    assert await replicas().read_chunk(log_id, 1) == (2, chunk("b"))
    assert (await replicas().list_chunks(log_id)).chunks[1].epoch == 2
    with pytest.raises(NotFound):
        await replica.read_chunk(log_id, 9)


@pytest.mark.slow
async def test_seal_invalidates_older_chunks_beyond_its_end(replicas: Any, log_id: str) -> None:
    replica = replicas()
    await replica.claim(log_id, 1)
    for seq in (1, 2, 3):
        await replica.write_chunk(log_id, 1, seq, chunk(f"c{seq}"))
    await replica.claim(log_id, 2)
    await replica.seal(log_id, 2, 1)
    await replica.write_chunk(log_id, 2, 2, chunk("new2"))
    listing = await replicas().list_chunks(log_id)
    assert {seq: info.epoch for seq, info in listing.chunks.items()} == {1: 1, 2: 2}
    with pytest.raises(NotFound):
        await replicas().read_chunk(log_id, 3)


async def test_trim_only_moves_forward_and_deletes(replicas: Any, log_id: str) -> None:
    replica = replicas()
    await replica.claim(log_id, 1)
    for seq in range(1, 6):
        await replica.write_chunk(log_id, 1, seq, chunk(f"c{seq}"))
    await replica.trim(log_id, 1, 3, 100)
    await replica.trim(log_id, 1, 2, 50)
    listing = await replicas().list_chunks(log_id)
    assert (listing.trim_seq, listing.trim_offset) == (3, 100)
    assert sorted(listing.chunks) == [4, 5]
    with pytest.raises(NotFound):
        await replicas().read_chunk(log_id, 2)
    # a write at or below the trim point is accepted and dropped
    await replica.write_chunk(log_id, 1, 3, chunk("late"))
    assert sorted((await replicas().list_chunks(log_id)).chunks) == [4, 5]


@pytest.mark.slow
async def test_concurrent_claims_leave_the_newest_epoch(replicas: Any, log_id: str) -> None:
    """Control-state updates are atomic: of racing claims, the newest epoch wins and an older
    one either happened before it or was fenced."""
    claimants = [replicas() for _ in range(6)]
    results = await asyncio.gather(
        *(claimant.claim(log_id, epoch) for epoch, claimant in enumerate(claimants, start=1)),
        return_exceptions=True,
    )
    for result in results:
        assert not isinstance(result, BaseException) or isinstance(result, FencedError), result
    assert not isinstance(results[-1], BaseException)
    assert (await replicas().list_chunks(log_id)).claimed_epoch == 6
    many_updates = [replicas().trim(log_id, 6, seq, seq * 10) for seq in range(1, 12)]
    await asyncio.gather(*many_updates)
    listing = await replicas().list_chunks(log_id)
    assert (listing.claimed_epoch, listing.trim_seq, listing.trim_offset) == (6, 11, 110)


@pytest.mark.slow
async def test_dead_zone_fails_fast_and_typed(zones: list[ZoneServer]) -> None:
    replica = build_replicas(zone_wal_options(zones[:1], request_timeout=1.0), node_id=1)[0]
    try:
        await replica.claim("log", 1)
        assert replica.healthy()
        zones[0].kill()
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(Exception) as failure:
            await replica.write_chunk("log", 1, 1, chunk("a"))
        assert loop.time() - started < 1.0
        from walstream.errors import AmbiguousError, BackendUnavailable

        assert isinstance(failure.value, (BackendUnavailable, AmbiguousError)), failure.value
        assert not replica.healthy()
    finally:
        await replica.close()


async def test_updates_after_a_claim_keep_checking_the_claimed_identity(
    replicas: Any, log_id: str
) -> None:
    """A seal, trim or catch-up write after our claim never changes another deployment's state,
    even when that state landed after our claim was checked (a late request of its own)."""
    import dataclasses

    from walstream.errors import IdentityMismatch
    from walstream.wal.quorum import LogIdentity

    ours, theirs = LogIdentity(b"1" * 16, 7), LogIdentity(b"2" * 16, 7)
    writer = replicas()
    await writer.claim(log_id, 5, ours)
    raw = replicas()
    state = await raw._current_state(log_id)
    foreign = dataclasses.replace(state, identity=theirs, version=state.version + 1)
    assert await raw._create(raw._state_key(log_id, foreign.version), foreign.encode())
    for attempt in (writer.seal(log_id, 5, 0), writer.trim(log_id, 5, 0, -1)):
        with pytest.raises(IdentityMismatch):
            await attempt
    after = await raw._current_state(log_id)
    assert (after.version, after.identity) == (foreign.version, theirs)
