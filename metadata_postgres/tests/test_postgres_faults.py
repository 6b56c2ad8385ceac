"""PostgreSQL crashes (SIGKILL) or stops under an append workload on a file WAL: appends keep
succeeding into the WAL while the log cache has room, then fail with ``CapacityError`` (never
hang); commits resume when the server returns; nothing acknowledged is lost.

Bounded in CI (the server is down ~2 s); ``--soak`` keeps it down 10 s and runs longer."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import walstream
from walstream import CapacityError, Record
from walstream_metadata_postgres.testing import PostgresServer

RECORD = 1024
BATCH = 16
HANG_BOUND_S = 10.0  # an append that takes longer than this counts as a hang


def deployment(tmp_path: Path, dsn: str, schema: str) -> Path:
    deploy = tmp_path / "deploy.yaml"
    deploy.write_text(
        f"""node: {{id: 1}}
wal: {{type: ebs, path: {tmp_path / "wal.img"}, capacity: 64MiB, direct: false}}
object_store: {{type: local, root: {tmp_path / "objects"}}}
metadata:
  type: postgres
  dsn: '{dsn}'
  schema: {schema}
  connect_timeout: 1s
  command_timeout: 2s
  retry_for: 1s
cache: {{log_cache_bytes: 1MiB}}
upload: {{max_bytes: 128KiB, max_interval: 20ms}}
append_timeout: 500ms
"""
    )
    return deploy


def value(offset: int) -> bytes:
    return offset.to_bytes(8, "big") * (RECORD // 8)


class Workload:
    """One stream appended to in a loop; remembers every acknowledged offset."""

    def __init__(self, stream: walstream.Stream) -> None:
        self.stream = stream
        self.acked: list[tuple[int, int]] = []
        self.capacity_errors = 0

    async def append_once(self) -> bool:
        """One batch; True if acknowledged, False on CapacityError (never a hang)."""
        tail = self.acked[-1][1] if self.acked else 0
        records = [Record(value(o)) for o in range(tail, tail + BATCH)]
        started = time.monotonic()
        try:
            ack = await asyncio.wait_for(self.stream.append(records), HANG_BOUND_S)
        except CapacityError:
            self.capacity_errors += 1
            return False
        finally:
            assert time.monotonic() - started < HANG_BOUND_S
        assert ack.start == tail
        self.acked.append((ack.start, ack.start + BATCH))
        return True

    async def run_for(self, seconds: float) -> tuple[int, int]:
        """Append for ``seconds``; (acknowledged, refused) batches."""
        ok = refused = 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if await self.append_once():
                ok += 1
            else:
                refused += 1
                await asyncio.sleep(0.05)
        return ok, refused


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["sigkill", "stop"])
def test_appends_survive_postgres_going_away(
    tmp_path: Path,
    postgres_server: PostgresServer,
    postgres_dsn: str,
    postgres_schema: str,
    soak: bool,
    fault: str,
) -> None:
    down_s = 10.0 if soak else 2.0
    deploy = deployment(tmp_path, postgres_dsn, postgres_schema)
    asyncio.run(_scenario(deploy, postgres_server, fault, down_s))


async def _scenario(deploy: Path, server: PostgresServer, fault: str, down_s: float) -> None:
    async with walstream.open(deploy) as client:
        work = Workload(await client.create_stream("events"))
        ok, _ = await work.run_for(0.5)
        assert ok > 0
        if fault == "sigkill":
            server.kill()
        else:
            await asyncio.to_thread(server.stop)
        ok_while_down, refused_while_down = await work.run_for(down_s)
        # The WAL took appends while the log cache had room, then back-pressure turned into
        # CapacityError: bounded, never a hang.
        assert ok_while_down > 0
        assert refused_while_down > 0 and work.capacity_errors > 0
        await asyncio.to_thread(server.start)
        # Commits resume: the log cache drains and appends are acknowledged again.
        while not await work.append_once():  # bounded by the test's timeout
            await asyncio.sleep(0.1)
        await work.run_for(0.5)
        acked_end = work.acked[-1][1]
    # Nothing acknowledged is lost: reopen and read everything back.
    async with walstream.open(deploy) as client:
        stream = await client.open_stream("events")
        assert await stream.check_tail() == acked_end
        position = 0
        while position < acked_end:
            result = await stream.read(start=position, limit_records=4096, limit_bytes=8 << 20)
            assert result.records, f"no records at {position} of {acked_end}"
            for record in result.records:
                assert record.offset == position
                assert record.value == value(position)
                position += 1
        metadata_end = (await client.metadata.get_stream("events")).committed_end
        assert metadata_end == acked_end, "a clean close commits every acknowledged record"
