"""Which PostgreSQL driver the metadata store uses: asyncpg against psycopg 3 (+ psycopg_pool)
on the shape of ``commit_objects`` (lock the node row, lock a stream row, lock a prepared object,
update both, insert a range, commit), on a throwaway server with fsync on.

    .venv/bin/python bench/_pg_drivers.py [--commits 1600] [--runs 3]

Prints p50/p99 and commits/s of 1 and of 16 concurrent committers, per driver (medians of the
runs; the committers are clients of the shared closed loop, ``bench/common/loadgen.py``, sharing
``--commits``). A one-off comparison (the choice is made): ``bench/run_all.py`` does not run it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import asyncpg
import psycopg
import psycopg_pool
from common import cli
from common.loadgen import LoopResult, closed_loop
from common.report import median_of, write_results
from metadata import commit_table
from walstream_metadata_postgres.testing.server import PostgresServer

SCHEMA = """
DROP TABLE IF EXISTS b_nodes, b_streams, b_objects, b_ranges;
CREATE TABLE b_nodes (node_id bigint PRIMARY KEY, node_epoch bigint NOT NULL);
CREATE TABLE b_streams (stream_id bigint PRIMARY KEY, committed_end bigint NOT NULL);
CREATE TABLE b_objects (object_id bigserial PRIMARY KEY, state text NOT NULL);
CREATE TABLE b_ranges (object_id bigint, stream_id bigint, start_offset bigint, end_offset bigint);
INSERT INTO b_nodes SELECT g, 1 FROM generate_series(1, 16) g;
INSERT INTO b_streams SELECT g, 0 FROM generate_series(1, 16) g;
"""


async def asyncpg_commit(conn: asyncpg.Connection, worker: int) -> None:
    object_id = await conn.fetchval(
        "INSERT INTO b_objects (state) VALUES ('p') RETURNING object_id"
    )
    async with conn.transaction():
        await conn.fetchval("SELECT node_epoch FROM b_nodes WHERE node_id = $1 FOR SHARE", worker)
        end = await conn.fetchval(
            "SELECT committed_end FROM b_streams WHERE stream_id = $1 FOR UPDATE", worker
        )
        await conn.fetch("SELECT state FROM b_objects WHERE object_id = $1 FOR UPDATE", object_id)
        await conn.execute(
            "UPDATE b_streams SET committed_end = $1 WHERE stream_id = $2", end + 10, worker
        )
        await conn.execute("UPDATE b_objects SET state = 'c' WHERE object_id = $1", object_id)
        await conn.execute(
            "INSERT INTO b_ranges VALUES ($1, $2, $3, $4)", object_id, worker, end, end + 10
        )


async def psycopg_commit(conn: psycopg.AsyncConnection, worker: int) -> None:
    cur = await conn.execute(
        "INSERT INTO b_objects (state) VALUES ('p') RETURNING object_id", prepare=True
    )
    row = await cur.fetchone()
    assert row is not None
    object_id = row[0]
    await conn.commit()
    async with conn.transaction():
        await conn.execute(
            "SELECT node_epoch FROM b_nodes WHERE node_id = %s FOR SHARE", (worker,), prepare=True
        )
        cur = await conn.execute(
            "SELECT committed_end FROM b_streams WHERE stream_id = %s FOR UPDATE",
            (worker,),
            prepare=True,
        )
        row = await cur.fetchone()
        assert row is not None
        end = row[0]
        await conn.execute(
            "SELECT state FROM b_objects WHERE object_id = %s FOR UPDATE",
            (object_id,),
            prepare=True,
        )
        await conn.execute(
            "UPDATE b_streams SET committed_end = %s WHERE stream_id = %s",
            (end + 10, worker),
            prepare=True,
        )
        await conn.execute(
            "UPDATE b_objects SET state = 'c' WHERE object_id = %s", (object_id,), prepare=True
        )
        await conn.execute(
            "INSERT INTO b_ranges VALUES (%s, %s, %s, %s)",
            (object_id, worker, end, end + 10),
            prepare=True,
        )


Commit = Callable[[Any, int], Awaitable[None]]
"""One commit of worker ``i`` (its node and stream ``i + 1``) on a pooled connection."""


async def committed(
    connection: Callable[[], AbstractAsyncContextManager[Any]],
    commit: Commit,
    commits: int,
    workers: int,
) -> LoopResult:
    """``workers`` closed loops sharing ``commits`` (rounded down to a multiple of workers),
    each taking a connection from the pool per commit."""

    async def one(index: int) -> int:
        async with connection() as conn:
            await commit(conn, index + 1)
        return 1

    return await closed_loop(one, workers, operations=commits // workers * workers)


async def run_asyncpg(dsn: str, commits: int, workers: int) -> LoopResult:
    pool = await asyncpg.create_pool(dsn, min_size=workers, max_size=workers)
    try:
        return await committed(pool.acquire, asyncpg_commit, commits, workers)
    finally:
        await pool.close()


async def run_psycopg(dsn: str, commits: int, workers: int) -> LoopResult:
    pool = psycopg_pool.AsyncConnectionPool(dsn, min_size=workers, max_size=workers, open=False)
    await pool.open()
    try:
        return await committed(pool.connection, psycopg_commit, commits, workers)
    finally:
        await pool.close()


async def measure(
    dsn: str, commits: int, runs: int
) -> dict[tuple[str, int], list[dict[str, float]]]:
    """Per driver and committer count, every run's p50/p99 and commits/s."""
    results: dict[tuple[str, int], list[dict[str, float]]] = {}
    for _ in range(runs):
        for name, runner in (("asyncpg", run_asyncpg), ("psycopg", run_psycopg)):
            for workers in (1, 16):
                result = await runner(dsn, commits, workers)
                results.setdefault((name, workers), []).append(
                    {
                        "p50_ms": result.latency(0.5, 1e3),
                        "p99_ms": result.latency(0.99, 1e3),
                        "commits_per_s": result.operations_per_s,
                    }
                )
    return results


async def main(argv: list[str] | None = None) -> None:
    parser = cli.parser(__doc__, "_pg_drivers", quick="3 runs of 400 commits")
    parser.add_argument("--commits", type=int, default=None, help="per run (default 1600)")
    parser.add_argument("--runs", type=int, default=None, help="default 3")
    args = parser.parse_args(argv)
    commits = cli.sized(args, args.commits, full=1600, quick=400, smoke=32)
    runs = cli.sized(args, args.runs, full=3, quick=3, smoke=1)
    with PostgresServer() as server:
        conn = await asyncpg.connect(server.dsn)
        await conn.execute(SCHEMA)
        await conn.close()
        results = await measure(server.dsn, commits, runs)
    rows = [
        {"driver": name, "committers": workers, **median_of(samples)}
        for (name, workers), samples in sorted(results.items())
    ]
    commit_table("driver").print(rows)
    write_results(
        args.json, {"benchmark": "pg_drivers", "commits": commits, "runs": runs, "rows": rows}
    )


if __name__ == "__main__":
    asyncio.run(main())
