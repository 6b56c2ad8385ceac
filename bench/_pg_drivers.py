"""Which PostgreSQL driver the metadata store uses: asyncpg against psycopg 3 (+ psycopg_pool)
on the shape of ``commit_objects`` (lock the node row, lock a stream row, lock a prepared object,
update both, insert a range, commit), on a throwaway server with fsync on.

    python bench/_pg_drivers.py [--commits 2000] [--runs 3]

Prints p50/p99 of one committer and commits/s of 16 concurrent ones, per driver (median of runs).
"""

from __future__ import annotations

import argparse
import asyncio
import time

import asyncpg
import psycopg
import psycopg_pool
from _report import median_of, percentile
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


async def run_asyncpg(dsn: str, commits: int, workers: int) -> list[float]:
    pool = await asyncpg.create_pool(dsn, min_size=workers, max_size=workers)
    latencies: list[float] = []

    async def worker(index: int) -> None:
        for _ in range(commits // workers):
            start = time.perf_counter()
            async with pool.acquire() as conn:
                await asyncpg_commit(conn, index + 1)
            latencies.append(time.perf_counter() - start)

    await asyncio.gather(*(worker(i) for i in range(workers)))
    await pool.close()
    return latencies


async def run_psycopg(dsn: str, commits: int, workers: int) -> list[float]:
    pool = psycopg_pool.AsyncConnectionPool(dsn, min_size=workers, max_size=workers, open=False)
    await pool.open()
    latencies: list[float] = []

    async def worker(index: int) -> None:
        for _ in range(commits // workers):
            start = time.perf_counter()
            async with pool.connection() as conn:
                await psycopg_commit(conn, index + 1)
            latencies.append(time.perf_counter() - start)

    await asyncio.gather(*(worker(i) for i in range(workers)))
    await pool.close()
    return latencies


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--commits", type=int, default=1600)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with PostgresServer() as server:
        conn = await asyncpg.connect(server.dsn)
        await conn.execute(SCHEMA)
        await conn.close()
        results: dict[tuple[str, int], list[dict[str, float]]] = {}
        for _ in range(args.runs):
            for name, runner in (("asyncpg", run_asyncpg), ("psycopg", run_psycopg)):
                for workers in (1, 16):
                    started = time.perf_counter()
                    latencies = await runner(server.dsn, args.commits, workers)
                    rate = len(latencies) / (time.perf_counter() - started)
                    results.setdefault((name, workers), []).append(
                        {
                            "p50_ms": percentile(latencies, 0.5) * 1e3,
                            "p99_ms": percentile(latencies, 0.99) * 1e3,
                            "commits_per_s": rate,
                        }
                    )
        commit_table("driver").print(
            {"driver": name, "committers": workers, **median_of(runs)}
            for (name, workers), runs in sorted(results.items())
        )


if __name__ == "__main__":
    asyncio.run(main())
