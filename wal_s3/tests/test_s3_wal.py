"""S3Wal against a moto S3 server: the WriteAheadLog invariants, fencing and failover."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from walstream.config import BuildContext
from walstream.errors import (
    BackendUnavailable,
    CapacityError,
    ConfigError,
    FencedError,
    InvalidArgument,
    WalstreamError,
)
from walstream.wal import WalMode, WalRecord
from walstream_wal_s3.factories import S3_WAL
from walstream_wal_s3.layout import WalKeys, encode_wal_object
from walstream_wal_s3.wal import S3Wal


async def start(
    wal: S3Wal, epoch: int, mode: WalMode = WalMode.READ_WRITE, node_id: int = 7
) -> list[WalRecord]:
    await wal.start(node_id, epoch, mode)
    return [record async for record in wal.recover()]


async def data_keys(wal: S3Wal, node_id: int = 7) -> list[str]:
    keys = WalKeys.for_node(node_id)
    return [meta.key async for meta in wal.store.list(keys.data)]


async def test_s3_wal_ack_order_and_recovery_exactly_once(make_wal: Any) -> None:
    wal = make_wal()
    assert await start(wal, 1) == []
    payloads = [f"record-{index}".encode() * (index % 5 + 1) for index in range(300)]
    completion_order: list[int] = []
    futures = [wal.append(payload) for payload in payloads]
    for index, future in enumerate(futures):
        future.add_done_callback(lambda _, index=index: completion_order.append(index))
    offsets = await asyncio.gather(*futures)
    assert completion_order == sorted(completion_order)
    assert offsets == list(range(300))  # offsets strictly increase, one per record
    assert wal.objects_written < 300  # grouped into fewer WAL objects
    more = await wal.append(b"alone")  # an idle WAL writes at once
    await wal.close()

    reopened = make_wal()
    recovered = await start(reopened, 2)
    assert [record.offset for record in recovered] == [*offsets, more]
    assert [record.data for record in recovered] == [*payloads, b"alone"]
    next_offset = await reopened.append(b"after restart")
    assert next_offset == more + 1  # offsets keep increasing across restarts
    await reopened.close()


async def test_s3_wal_trim_inclusive_persists_and_deletes_objects(make_wal: Any) -> None:
    wal = make_wal(max_batch_bytes=64)
    await start(wal, 1)
    offsets = [await wal.append(f"r{index}".encode() * 20) for index in range(20)]
    assert len(await data_keys(wal)) == 20  # one object per sequential append
    await wal.trim(offsets[9])
    await wal.trim(offsets[4])  # never goes backwards
    await wal.trim(offsets[9])  # idempotent
    assert len(await data_keys(wal)) == 10
    with pytest.raises(InvalidArgument):
        await wal.trim(offsets[-1] + 5)
    await wal.close()

    reopened = make_wal()
    recovered = await start(reopened, 2)
    assert [record.offset for record in recovered] == offsets[10:]
    trims = [meta.key async for meta in reopened.store.list(WalKeys.for_node(7).trims)]
    assert len(trims) == 1  # older trim points removed, the newest kept
    await reopened.close()


async def test_s3_wal_trim_inside_an_object(make_wal: Any) -> None:
    wal = make_wal()
    await start(wal, 1)
    offsets = await asyncio.gather(*(wal.append(bytes([index])) for index in range(10)))
    await wal.trim(offsets[0])
    await wal.close()
    reopened = make_wal()
    assert [record.offset for record in await start(reopened, 2)] == offsets[1:]
    await reopened.close()


async def test_s3_wal_reset(make_wal: Any) -> None:
    wal = make_wal()
    await start(wal, 1)
    last = max(await asyncio.gather(*(wal.append(b"x") for _ in range(5))))
    await wal.reset()
    assert await data_keys(wal) == []
    after_reset = await wal.append(b"new")
    assert after_reset > last
    await wal.close()
    reopened = make_wal()
    recovered = await start(reopened, 2)
    assert [(record.offset, record.data) for record in recovered] == [(after_reset, b"new")]
    await reopened.close()


async def test_s3_wal_capacity_and_lifecycle_errors(make_wal: Any) -> None:
    wal = make_wal(max_record_bytes=1000)
    with pytest.raises(InvalidArgument):
        wal.append(b"before start")
    await wal.start(7, 1, WalMode.READ_WRITE)
    with pytest.raises(InvalidArgument):
        wal.append(b"before recover")
    assert [record async for record in wal.recover()] == []
    with pytest.raises(CapacityError):
        wal.append(b"x" * 1001)
    pending = [wal.append(b"y" * 100) for _ in range(10)]
    await wal.close()  # waits for in-flight appends
    assert all(future.done() and not future.exception() for future in pending)
    with pytest.raises(InvalidArgument):
        wal.append(b"after close")


@pytest.mark.slow
async def test_s3_wal_failover_fences_zombie(make_wal: Any) -> None:
    owner = make_wal()
    await start(owner, 1)
    acked = await asyncio.gather(*(owner.append(f"a{index}".encode()) for index in range(10)))

    rescuer = make_wal()
    recovered = await start(rescuer, 2, WalMode.FAILOVER)
    assert [record.offset for record in recovered] == acked

    with pytest.raises(FencedError):
        await owner.append(b"zombie write")
    with pytest.raises(WalstreamError):
        await owner.append(b"and nothing after it")

    await rescuer.trim(acked[-1])
    await rescuer.close()
    await owner.close()

    restarted = make_wal()
    assert await start(restarted, 3) == []  # the zombie's write was never acknowledged
    await restarted.close()


@pytest.mark.slow
async def test_s3_wal_zombie_under_load_loses_no_ack(make_wal: Any) -> None:
    zombie = make_wal(max_inflight=4)
    await start(zombie, 1)
    acked: list[tuple[int, bytes]] = []
    fenced = asyncio.Event()

    async def writer(worker: int) -> None:
        sequence = 0
        while not fenced.is_set():
            data = f"w{worker}-{sequence}".encode()
            sequence += 1
            try:
                acked.append((await zombie.append(data), data))
            except WalstreamError:
                fenced.set()
            except InvalidArgument:
                fenced.set()

    workers = [asyncio.create_task(writer(worker)) for worker in range(8)]
    while len(acked) < 200:
        await asyncio.sleep(0.01)
    rescuer = make_wal()
    recovered = {record.offset: record.data for record in await start(rescuer, 2, WalMode.FAILOVER)}
    await asyncio.wait_for(fenced.wait(), 10)
    await asyncio.gather(*workers)
    for offset, data in acked:
        assert recovered.get(offset) == data
    assert isinstance(zombie.failed, FencedError)
    await zombie.close()
    await rescuer.close()


async def test_s3_wal_late_zombie_object_is_ignored(make_wal: Any) -> None:
    old = make_wal()
    await start(old, 1)
    acked = await asyncio.gather(*(old.append(b"acked") for _ in range(3)))
    await old.close()
    new_owner = make_wal()
    await start(new_owner, 2)
    # A PUT of epoch 1 that was in flight lands after epoch 2 recovered: never acknowledged.
    late = WalKeys.for_node(7).data_object(acked[-1] + 1, acked[-1] + 2, 1)
    await new_owner.store.put(late.key, encode_wal_object(7, 1, late.first, [b"ghost", b"boo"]))
    mine = await new_owner.append(b"epoch 2")
    await new_owner.close()
    third = make_wal()
    recovered = await start(third, 3)
    assert [record.data for record in recovered] == [b"acked"] * 3 + [b"epoch 2"]
    assert recovered[-1].offset == mine
    assert late.key not in await data_keys(third)  # garbage removed at start
    await third.close()


@pytest.mark.slow
async def test_s3_wal_older_epoch_and_read_only(make_wal: Any) -> None:
    wal = make_wal()
    await start(wal, 5)
    offset = await wal.append(b"kept")
    stale = make_wal()
    with pytest.raises(FencedError):
        await stale.start(7, 4, WalMode.READ_WRITE)
    await stale.close()
    same = make_wal()
    with pytest.raises(FencedError):
        await same.start(7, 5, WalMode.READ_WRITE)
    await same.close()
    reader = make_wal()
    records = await start(reader, 0, WalMode.READ_ONLY)
    assert [(record.offset, record.data) for record in records] == [(offset, b"kept")]
    with pytest.raises(InvalidArgument):
        reader.append(b"no")
    await reader.close()
    assert await wal.append(b"still the owner") == offset + 1  # READ_ONLY did not fence
    await wal.close()


async def test_s3_wal_nodes_are_separate(make_wal: Any) -> None:
    first, second = make_wal(), make_wal()
    await start(first, 1, node_id=1)
    await start(second, 1, node_id=2)
    await first.append(b"one")
    await second.append(b"two")
    await first.close()
    await second.close()
    again = make_wal()
    assert [record.data for record in await start(again, 2, node_id=2)] == [b"two"]
    await again.close()


async def test_s3_wal_refuses_store_without_conditional_writes(
    make_wal: Any, fault_proxy: Any
) -> None:
    fault_proxy.configure(ignore_conditional=True)
    wal = make_wal(fault_proxy.endpoint_url)
    with pytest.raises(ConfigError, match="conditional"):
        await wal.start(7, 1, WalMode.READ_WRITE)
    await wal.close()


async def test_s3_wal_unreachable_endpoint(make_wal: Any) -> None:
    from walstream_wal_s3.client import RetryPolicy

    wal = make_wal("http://127.0.0.1:9", settings={"retry": RetryPolicy(max_attempts=2)})
    with pytest.raises(BackendUnavailable):
        await wal.start(7, 1, WalMode.READ_WRITE)
    await wal.close()


async def test_s3_wal_factory(s3_bucket: Any) -> None:
    section = s3_bucket.options(
        max_batch_bytes="1MiB", max_batch_interval="5ms", max_inflight=3, prefix="cluster-a"
    )
    wal = S3_WAL.build(section, BuildContext(), "wal")
    assert (wal.max_group_bytes, wal.max_group_delay_s, wal.max_inflight) == (1 << 20, 0.005, 3)
    await start(wal, 1)
    assert await wal.append(b"via the factory") == 0
    await wal.close()
    from importlib.metadata import entry_points

    assert any(ep.name == "s3" for ep in entry_points(group="walstream.wal"))
    assert any(ep.name == "s3" for ep in entry_points(group="walstream.object_store"))


def hold_data_puts(wal: S3Wal, gate: asyncio.Event, started: asyncio.Event) -> None:
    """The WAL's data PUTs wait for ``gate`` (``started`` is set when one does)."""
    put = wal.store.put
    data = WalKeys.for_node(7).data

    async def held_put(key: str, body: bytes) -> None:
        if key.startswith(data) and not gate.is_set():
            started.set()
            await gate.wait()
        await put(key, body)

    wal.store.put = held_put  # type: ignore[method-assign]


@pytest.mark.slow
async def test_s3_wal_under_its_fence_lease_acknowledges_without_a_list_per_group(
    make_wal: Any,
) -> None:
    leased = make_wal(fence_lease_s=30)
    await start(leased, 1)
    checks = leased.describe()["fence_checks"]
    offsets = [await leased.append(f"r{index}".encode()) for index in range(20)]
    assert leased.objects_written == 20
    assert leased.describe()["fence_checks"] == checks  # all within the lease of the start's
    await leased.close()
    unleased = make_wal(fence_lease_s=0)
    assert [record.offset for record in await start(unleased, 2)] == offsets
    checks = unleased.describe()["fence_checks"]
    for index in range(5):
        await unleased.append(f"s{index}".encode())
    assert unleased.describe()["fence_checks"] == checks + 5  # a LIST after every group
    await unleased.close()


@pytest.mark.slow
async def test_s3_wal_new_owner_waits_out_the_lease_of_a_zombie_acknowledging_under_it(
    make_wal: Any,
) -> None:
    # The zombie's lease comes from a LIST that ran before the new owner's marker existed; its
    # PUT completes after that marker exists and is acknowledged under the lease. The new owner
    # must list the data objects only after that lease ran out, or it loses an acknowledged
    # record.
    zombie = make_wal(fence_lease_s=3.0)
    await start(zombie, 1)
    gate, put_started = asyncio.Event(), asyncio.Event()
    hold_data_puts(zombie, gate, put_started)
    write = asyncio.ensure_future(zombie.append(b"acknowledged under the lease"))
    await asyncio.wait_for(put_started.wait(), 10)
    rescuer = make_wal()
    takeover = asyncio.create_task(start(rescuer, 2, WalMode.FAILOVER))
    marker = WalKeys.for_node(7).epoch(2)
    while not [meta async for meta in rescuer.store.list(marker)]:
        assert not takeover.done()
        await asyncio.sleep(0.005)
    # The zombie's PUT completes well after the new marker exists (when a new owner that did
    # not wait would have listed the data objects already), within the zombie's lease.
    await asyncio.sleep(0.5)
    gate.set()
    offset = await write
    recovered = await takeover
    assert [(record.offset, record.data) for record in recovered] == [
        (offset, b"acknowledged under the lease")
    ]
    await rescuer.close()
    await zombie.close()


@pytest.mark.slow
async def test_s3_wal_a_clean_close_gives_the_lease_back(make_wal: Any) -> None:
    from walstream.clock import ManualClock

    clock = ManualClock()
    closed = make_wal(fence_lease_s=10, clock=clock)
    await start(closed, 1)
    await closed.append(b"a")
    await closed.close()
    before = clock.monotonic()
    crashed = make_wal(fence_lease_s=10, clock=clock)
    assert [record.data for record in await start(crashed, 2)] == [b"a"]
    assert clock.monotonic() == before  # closed cleanly: nothing to wait out
    await crashed.append(b"b")  # and then it is not closed: a crash as far as the WAL knows
    before = clock.monotonic()
    taker = make_wal(clock=clock)
    assert [record.data for record in await start(taker, 3, WalMode.FAILOVER)] == [b"a", b"b"]
    assert clock.monotonic() - before >= 10 * 1.25  # the crashed writer's lease, with margin
    await taker.close()
    await crashed.store.close()


@pytest.mark.parametrize("lease_s", [-1.0, 61.0])
def test_s3_wal_refuses_an_out_of_range_fence_lease(lease_s: float) -> None:
    with pytest.raises(InvalidArgument, match=r"wal.fence_lease: between 0 and 60 s"):
        S3Wal(cast(Any, None), fence_lease_s=lease_s)
