"""The quorum WAL's shared options, its write-quorum rule, its catch-up parallelism and its
injected clock."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from walstream.clock import ManualClock
from walstream.config import validate_options
from walstream.config.factory import BackendFactory
from walstream.errors import AmbiguousError, ConfigError
from walstream.wal import WalMode
from walstream.wal.quorum import (
    GROUP_DELAY_DOC,
    MemoryReplica,
    QuorumWal,
    offset_seq,
    quorum_option_set,
    quorum_wal_options,
    write_quorum_of,
)
from walstream_conformance.waiting import eventually

LOG = "node-1"


def test_write_quorum_defaults_to_a_majority() -> None:
    assert [write_quorum_of(None, count) for count in (1, 2, 3, 4, 5)] == [1, 2, 2, 3, 3]
    assert write_quorum_of(3, 3) == 3


@pytest.mark.parametrize("requested", [0, 4])
def test_write_quorum_outside_one_to_n_is_a_config_error(requested: int) -> None:
    with pytest.raises(ConfigError) as caught:
        write_quorum_of(requested, 3)
    assert (
        str(caught.value) == f"write_quorum: must be between 1 and the 3 replicas, got {requested}"
    )
    with pytest.raises(ConfigError) as caught:
        write_quorum_of(requested, 3, key="wal.write_quorum", among="the 3 buckets")
    assert (
        str(caught.value)
        == f"wal.write_quorum: must be between 1 and the 3 buckets, got {requested}"
    )
    with pytest.raises(ConfigError, match=r"between 1 and the 3 replicas"):
        QuorumWal([MemoryReplica(f"r{index}") for index in range(3)], log_id=LOG, write_quorum=4)


def test_option_set_words_the_medium_and_feeds_the_wal(tmp_path: Path) -> None:
    quorum = quorum_option_set(
        replica="zone",
        log_place="in the buckets",
        acknowledged_by="zones",
        max_chunk_bytes="512KiB",
        max_chunk_delay="5ms",
    )
    docs = {
        option.name: option.doc for option in (quorum.write_quorum, quorum.log_id, *quorum.tuning)
    }
    assert docs["write_quorum"] == "W: zones a chunk needs (default: majority)"
    assert docs["log_id"] == "name of this node's log in the buckets (default node-{id})"
    assert docs["request_timeout"] == "bound of one request to one zone"
    assert docs["max_chunk_delay"] == GROUP_DELAY_DOC
    factory: BackendFactory[QuorumWal] = BackendFactory(
        kind="wal",
        name="quorum-test",
        description="options of a quorum WAL",
        options=(quorum.write_quorum, quorum.log_id, *quorum.tuning),
        create=lambda options, context: QuorumWal([MemoryReplica("r0")], log_id=LOG),
    )
    options = validate_options(factory, {"max_inflight": 3}, tmp_path, "wal")
    assert quorum_wal_options(options) == {
        "request_timeout_s": 2.0,
        "write_timeout_s": 10.0,
        "max_chunk_bytes": 512 << 10,
        "max_chunk_delay_s": 0.005,
        "max_inflight": 3,
        "max_record_bytes": 8 << 20,
    }
    with pytest.raises(ConfigError, match=r"wal\.write_quorum: must be at least 1"):
        validate_options(factory, {"write_quorum": 0}, tmp_path, "wal")


class CountingReplica(MemoryReplica):
    """A replica that records how many chunk writes it serves at once."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.writing = 0
        self.most_at_once = 0

    async def write_chunk(self, log_id: str, epoch: int, seq: int, data: bytes) -> None:
        if not self.available:
            return await super().write_chunk(log_id, epoch, seq, data)  # fails at once
        self.writing += 1
        self.most_at_once = max(self.most_at_once, self.writing)
        try:
            await asyncio.sleep(0.005)
            await super().write_chunk(log_id, epoch, seq, data)
        finally:
            self.writing -= 1



@pytest.mark.parametrize("parallelism", [1, 4])
async def test_catch_up_copies_as_many_chunks_at_once_as_configured(parallelism: int) -> None:
    replicas = [MemoryReplica("r0"), MemoryReplica("r1"), CountingReplica("r2")]
    wal = QuorumWal(
        replicas,
        log_id=LOG,
        request_timeout_s=1.0,
        write_timeout_s=2.0,
        catch_up_parallelism=parallelism,
    )
    await wal.start(1, 1, WalMode.READ_WRITE)
    assert [record async for record in wal.recover()] == []
    replicas[2].available = False
    offsets = [await wal.append(f"v{index}".encode()) for index in range(24)]
    returning = replicas[2]
    assert isinstance(returning, CountingReplica)
    # the failed writes are noticed
    await eventually(lambda: "r2" in wal.lagging_replicas(), "the replica that was down to lag")
    returning.available = True
    await eventually(lambda: not wal.lagging_replicas(), "the catch-up to finish")
    assert {offset_seq(offset) for offset in offsets} <= set(returning.logs[LOG].chunks)
    assert returning.most_at_once == parallelism
    await wal.close()


def test_catch_up_parallelism_below_one_is_refused() -> None:
    with pytest.raises(ConfigError, match="catch_up_parallelism must be at least 1, got 0"):
        QuorumWal([MemoryReplica("r0")], log_id=LOG, catch_up_parallelism=0)


class SilentReplica(MemoryReplica):
    """A replica whose writes never answer."""

    async def write_chunk(self, log_id: str, epoch: int, seq: int, data: bytes) -> None:
        await asyncio.Event().wait()


async def test_request_and_write_timeouts_run_on_the_injected_clock() -> None:
    clock = ManualClock()
    replicas = [SilentReplica("r0"), SilentReplica("r1"), MemoryReplica("r2")]
    wal = QuorumWal(
        replicas, log_id=LOG, request_timeout_s=30.0, write_timeout_s=600.0, clock=clock
    )
    await wal.start(1, 1, WalMode.READ_WRITE)
    assert [record async for record in wal.recover()] == []
    started = time.monotonic()
    with pytest.raises(AmbiguousError, match=r"write chunk 1 reached 1 of the 2 replicas"):
        await wal.append(b"x")
    # Ten minutes of retries on the test clock, a moment on the wall clock.
    assert clock.monotonic() >= 600.0
    assert time.monotonic() - started < 5.0
    await wal.close()
