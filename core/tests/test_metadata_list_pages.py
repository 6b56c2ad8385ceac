"""SQLite serves a page of list_streams from an index: the prefix is a range of the index of
active names (BINARY: byte order) and streams without a name have an index of their own, so a
page's cost follows its size, not the number of streams."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from walstream.metadata.sql.store import UNNAMED_PAGE_SQL, named_page_sql
from walstream.metadata.sqlite import SqliteMetadataStore


async def test_a_page_is_an_index_range_scan(tmp_path: Path) -> None:
    store = SqliteMetadataStore(tmp_path / "meta.db")
    await store.create_streams([f"tenant-{n % 7}.s{n:05d}" for n in range(5_000)])
    await store.create_stream(None)
    page = await store.list_streams("tenant-3.", "tenant-3.s00500", 3)
    assert [s.name for s in page] == ["tenant-3.s00507", "tenant-3.s00514", "tenant-3.s00521"]
    await store.close()
    connection = sqlite3.connect(tmp_path / "meta.db")
    try:
        connection.execute("ANALYZE")
        for sql, args in (
            (named_page_sql("name", True, True), ("tenant-3.s00500", "tenant-3.", "tenant-3/", 3)),
            (named_page_sql("name", False, True), ("", "", 3)),
            (named_page_sql("name", False, False), ("", "")),
            (UNNAMED_PAGE_SQL + " LIMIT $2", (0, 3)),
        ):
            numbered = sql
            for index in range(len(args), 0, -1):
                numbered = numbered.replace(f"${index}", f"?{index}")
            plan = " ".join(
                row[3] for row in connection.execute(f"EXPLAIN QUERY PLAN {numbered}", args)
            )
            assert (
                "USING INDEX streams_active_name" in plan or "USING INDEX streams_unnamed" in plan
            ), plan
            assert "SCAN streams" not in plan and "TEMP B-TREE" not in plan, plan
    finally:
        connection.close()
