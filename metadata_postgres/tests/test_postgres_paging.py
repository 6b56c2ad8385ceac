"""Reads are bounded by what they return: a stream with 100,000 objects is read page by page,
and a read from a late offset starts its index scan there instead of at offset 0."""

from __future__ import annotations

import json
from typing import Any

import asyncpg
import pytest
from walstream.metadata import ObjectCommit, ObjectKind, StreamRange
from walstream.metadata.sql.store import GET_OBJECTS_SQL

OBJECTS = 100_000
CHUNK = 10_000
RECORDS_PER_OBJECT = 10


def _scan_nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """Every node of an EXPLAIN plan that reads the ranges table."""
    found = [plan] if plan.get("Relation Name") == "ranges" else []
    for child in plan.get("Plans", []):
        found.extend(_scan_nodes(child))
    return found


@pytest.mark.slow
async def test_late_offset_read_does_not_scan_from_zero(
    make_store: Any, postgres_dsn: str, postgres_schema: str
) -> None:
    store = make_store(command_timeout_s=120.0)
    node = await store.register_node(1, {"type": "test"})
    stream = await store.create_stream("big")
    epoch = (await store.claim_stream(stream.stream_id, 1, node.node_epoch)).epoch
    ids = await store.prepare_objects(OBJECTS, 3_600_000)
    for first in range(0, OBJECTS, CHUNK):
        await store.commit_objects(
            1,
            node.node_epoch,
            [
                ObjectCommit(
                    object_id,
                    f"o/{object_id}",
                    ObjectKind.STREAM,
                    1000,
                    64,
                    (
                        StreamRange(
                            stream.stream_id,
                            index * RECORDS_PER_OBJECT,
                            (index + 1) * RECORDS_PER_OBJECT,
                            epoch,
                        ),
                    ),
                )
                for index, object_id in enumerate(ids[first : first + CHUNK], start=first)
            ],
        )

    # Paged: a page holds `limit` objects in offset order, from wherever the read starts.
    late = (OBJECTS - 50) * RECORDS_PER_OBJECT + 3
    page = await store.get_objects(stream.stream_id, late, limit=20)
    assert [o.ranges[0].start_offset for o in page] == [
        (OBJECTS - 50 + i) * RECORDS_PER_OBJECT for i in range(20)
    ]
    assert [o.object_id for o in page] == ids[OBJECTS - 50 : OBJECTS - 30]
    tail = await store.get_objects(stream.stream_id, late, limit=1000)
    assert len(tail) == 50 and tail[-1].object_id == ids[-1]

    # The plan: an index scan of ranges that starts at the offset and reads `limit` rows.
    connection = await asyncpg.connect(
        postgres_dsn, server_settings={"search_path": f'"{postgres_schema}"'}
    )
    try:
        await connection.execute("ANALYZE ranges; ANALYZE objects")
        for start in (0, OBJECTS // 2 * RECORDS_PER_OBJECT, late):
            raw = await connection.fetchval(
                f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {GET_OBJECTS_SQL}",
                stream.stream_id,
                start,
                (1 << 63) - 1,
                20,
            )
            plan = json.loads(raw)[0]["Plan"]
            (scan,) = _scan_nodes(plan)
            assert scan["Node Type"] == "Index Scan", scan
            assert scan["Index Name"] == "ranges_stream_end"
            assert "end_offset >" in scan["Index Cond"]
            # Rows read from the index: the page (at most 20), never the 100,000 before it.
            assert scan["Actual Rows"] <= 20, scan
            assert scan["Shared Hit Blocks"] + scan.get("Shared Read Blocks", 0) < 50, scan
    finally:
        await connection.close()


def _streams_scans(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan] if plan.get("Relation Name") == "streams" else []
    for child in plan.get("Plans", []):
        found.extend(_streams_scans(child))
    return found


@pytest.mark.slow
async def test_a_page_of_streams_is_an_index_range_scan(
    make_store: Any, postgres_dsn: str, postgres_schema: str
) -> None:
    """list_streams pages in byte order through the index of active names in "C" order: a
    prefix is a range of it, and a page reads its `limit` rows, not the 20,000 streams."""
    from walstream.metadata.sql.store import UNNAMED_PAGE_SQL, named_page_sql
    from walstream_metadata_postgres.dialect import PostgresDialect

    store = make_store()
    for first in range(0, 20_000, 10_000):
        await store.create_streams(
            [f"tenant-{n % 7}.s{n:06d}" for n in range(first, first + 10_000)]
        )
    await store.create_stream(None)
    page = await store.list_streams("tenant-3.", "tenant-3.s000500", 100)
    assert [s.name for s in page][:2] == ["tenant-3.s000507", "tenant-3.s000514"]
    assert len(page) == 100
    connection = await asyncpg.connect(
        postgres_dsn, server_settings={"search_path": f'"{postgres_schema}"'}
    )
    try:
        await connection.execute("ANALYZE streams")
        name = PostgresDialect.name_bytes
        for sql, args in (
            (named_page_sql(name, True, True), ("tenant-3.s000500", "tenant-3.", "tenant-3/", 100)),
            (named_page_sql(name, False, True), ("", "", 100)),
            (UNNAMED_PAGE_SQL + " LIMIT $2", (0, 100)),
        ):
            raw = await connection.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", *args)
            (scan,) = _streams_scans(json.loads(raw)[0]["Plan"])
            assert scan["Node Type"] in ("Index Scan", "Index Only Scan"), scan
            assert scan["Index Name"] in ("streams_active_name_bytes", "streams_unnamed"), scan
            assert scan["Actual Rows"] <= 100, scan
    finally:
        await connection.close()
