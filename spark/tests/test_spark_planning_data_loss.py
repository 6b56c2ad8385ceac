"""Partition planning meets a recorded data-loss gap: it fails by default, skips when asked.

Planning runs on the driver from metadata only, so these tests need no Spark session."""

from __future__ import annotations

import pytest
from walstream.errors import DataLossError
from walstream.metadata import DataLossGap, ObjectCommit, ObjectKind, StreamRange
from walstream.metadata.memory import MemoryMetadataStore
from walstream_spark.planning import StreamRequest, plan_slices


async def _stream_with_a_gap() -> tuple[MemoryMetadataStore, int]:
    """Objects hold [0, 10) and [15, 30); [10, 15) was recorded as lost."""
    store = MemoryMetadataStore()
    node = await store.register_node(1, {"type": "test"})
    stream = await store.create_stream("clicks")
    claimed = await store.claim_stream(stream.stream_id, 1, node.node_epoch)

    def commit(object_id: int, start: int, end: int) -> ObjectCommit:
        stream_range = StreamRange(stream.stream_id, start, end, claimed.epoch)
        return ObjectCommit(
            object_id, f"o/{object_id}", ObjectKind.STREAM, 100, 10, (stream_range,)
        )

    first, second = await store.prepare_objects(2, 60_000)
    await store.commit_objects(1, node.node_epoch, [commit(first, 0, 10)])
    gap = DataLossGap(stream.stream_id, 10, 15, "damaged WAL record")
    await store.record_data_loss(1, node.node_epoch, gap)
    await store.commit_objects(1, node.node_epoch, [commit(second, 15, 30)])
    return store, stream.stream_id


async def test_a_gap_in_the_request_fails_the_plan_naming_the_range() -> None:
    store, stream_id = await _stream_with_a_gap()
    request = StreamRequest("clicks", stream_id, 0, 30)
    with pytest.raises(DataLossError, match=r"\[10, 15\).*failOnDataLoss=false") as caught:
        await plan_slices(store, [request], 1 << 20, 1000)
    assert (caught.value.start_offset, caught.value.end_offset) == (10, 15)


async def test_failondataloss_false_skips_the_gap_and_keeps_the_rest() -> None:
    store, stream_id = await _stream_with_a_gap()
    request = StreamRequest("clicks", stream_id, 0, 30)
    slices = await plan_slices(store, [request], 1 << 20, 1000, fail_on_data_loss=False)
    covered = [offset for piece in slices for offset in range(piece.start, piece.end)]
    assert covered == [*range(0, 10), *range(15, 30)]


async def test_a_request_beside_the_gap_is_planned_as_before() -> None:
    store, stream_id = await _stream_with_a_gap()
    slices = await plan_slices(store, [StreamRequest("clicks", stream_id, 15, 30)], 1 << 20, 1000)
    assert [(piece.start, piece.end) for piece in slices] == [(15, 30)]
