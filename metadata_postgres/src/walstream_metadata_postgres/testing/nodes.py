"""Node processes for the concurrency tests: real processes sharing one PostgreSQL catalogue.

``python -m walstream_metadata_postgres.testing.nodes worker DSN SCHEMA NODE_ID COMMITS`` registers
node ``NODE_ID``, races the other workers for the stream ``shared``, then commits ``COMMITS``
objects of 10 offsets to its own stream ``node-<id>``, trimming every 5th and compacting two
objects into one every 7th commit. It prints one JSON line: what it was acknowledged.

``... zombie DSN SCHEMA NODE_ID STREAM`` commits 10 offsets at a time to ``STREAM`` (which it
claims) and prints ``ACK <committed end>`` after each acknowledged commit, until a commit is
refused; then it prints ``FENCED <error class>`` and exits. A DSN ``sqlite:PATH`` runs it on a
SQLite file instead (SCHEMA ignored), to compare the two stores.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from walstream.errors import FencedError, PreconditionFailed, WalstreamError
from walstream.metadata import MetadataStore, ObjectCommit, ObjectKind, StreamRange
from walstream.metadata.sqlite import SqliteMetadataStore

from ..store import PostgresMetadataStore

__all__ = ["commit_of", "main", "open_store"]

SPAN = 10


def commit_of(object_id: int, stream_id: int, start: int, end: int, epoch: int) -> ObjectCommit:
    return ObjectCommit(
        object_id,
        f"objects/{object_id:012d}",
        ObjectKind.STREAM,
        1000 + end - start,
        64,
        (StreamRange(stream_id, start, end, epoch),),
    )


async def worker(dsn: str, schema: str, node_id: int, commits: int) -> dict[str, Any]:
    store = PostgresMetadataStore(dsn, schema=schema, retry_for_s=30.0)
    try:
        node = await store.register_node(node_id, {"type": "test"})
        epoch_of_node = node.node_epoch
        shared = await store.get_stream("shared")
        try:
            await store.claim_stream(shared.stream_id, node_id, epoch_of_node)
            won_shared = True
        except FencedError:
            won_shared = False
        stream = await store.create_stream(f"node-{node_id}")
        epoch = (await store.claim_stream(stream.stream_id, node_id, epoch_of_node)).epoch
        end = 0
        compactions = trims = 0
        for index in range(1, commits + 1):
            (object_id,) = await store.prepare_objects(1, 600_000)
            await store.commit_objects(
                node_id,
                epoch_of_node,
                [commit_of(object_id, stream.stream_id, end, end + SPAN, epoch)],
            )
            end += SPAN
            if index % 5 == 0:
                await store.trim_stream(stream.stream_id, epoch, end - 3 * SPAN)
                trims += 1
            if index % 7 == 0:
                start = (await store.get_streams([stream.stream_id]))[stream.stream_id].start_offset
                pair = await store.get_objects(stream.stream_id, start, limit=2)
                if len(pair) == 2:
                    first, second = pair[0].ranges[0], pair[1].ranges[0]
                    (new_id,) = await store.prepare_objects(1, 600_000)
                    merged = commit_of(
                        new_id, stream.stream_id, first.start_offset, second.end_offset, epoch
                    )
                    try:
                        await store.replace_objects(
                            [pair[0].object_id, pair[1].object_id], [merged]
                        )
                        compactions += 1
                    except PreconditionFailed:
                        pass  # a trim of ours raced it: compaction simply tries again later
        return {
            "node_id": node_id,
            "stream_id": stream.stream_id,
            "committed_end": end,
            "won_shared": won_shared,
            "trims": trims,
            "compactions": compactions,
        }
    finally:
        await store.close()


def open_store(dsn: str, schema: str) -> MetadataStore:
    if dsn.startswith("sqlite:"):
        return SqliteMetadataStore(dsn.removeprefix("sqlite:"))
    return PostgresMetadataStore(dsn, schema=schema, retry_for_s=30.0)


async def zombie(dsn: str, schema: str, node_id: int, stream_name: str) -> None:
    store = open_store(dsn, schema)
    try:
        node = await store.register_node(node_id, {"type": "test"})
        stream = await store.get_stream(stream_name)
        epoch = (await store.claim_stream(stream.stream_id, node_id, node.node_epoch)).epoch
        end = stream.committed_end
        print("CLAIMED", flush=True)
        while True:
            (object_id,) = await store.prepare_objects(1, 600_000)
            try:
                await store.commit_objects(
                    node_id,
                    node.node_epoch,
                    [commit_of(object_id, stream.stream_id, end, end + SPAN, epoch)],
                )
            except WalstreamError as error:
                print(f"FENCED {type(error).__name__} {error}", flush=True)
                return
            end += SPAN
            print(f"ACK {end}", flush=True)
            await asyncio.sleep(0.005)
    finally:
        await store.close()


def main(argv: list[str]) -> None:
    mode, dsn, schema, node_id = argv[0], argv[1], argv[2], int(argv[3])
    if mode == "worker":
        result = asyncio.run(worker(dsn, schema, node_id, int(argv[4])))
        print(json.dumps(result), flush=True)
    elif mode == "zombie":
        asyncio.run(zombie(dsn, schema, node_id, argv[4]))
    else:
        raise SystemExit(f"unknown mode {mode!r}: worker or zombie")


if __name__ == "__main__":
    main(sys.argv[1:])
