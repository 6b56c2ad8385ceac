"""Fixtures: one moto server process per availability zone, each with a directory bucket."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from walstream.config import BuildContext
from walstream.wal import WalMode, WalRecord
from walstream_wal_s3express import S3EXPRESS_WAL, S3ExpressWal
from walstream_wal_s3express.testing.zones import ZoneServer, zone_servers, zone_wal_options

_log_numbers = itertools.count(1)


@pytest.fixture(scope="session")
def shared_zones() -> Iterator[list[ZoneServer]]:
    """Three zones for the whole session; tests keep apart by log prefix and must leave every
    zone running."""
    with zone_servers() as servers:
        yield servers


@pytest.fixture
def zones() -> Iterator[list[ZoneServer]]:
    """Three zones of this test's own: it may kill, freeze and restart them."""
    with zone_servers() as servers:
        yield servers


# Generous for moto on a loaded 2-core machine (a session's zones also answer for earlier tests'
# chunks, and xdist workers run beside them): with 1 s / 3 s a healthy zone's listing timed out
# under load and a claim failed with "reached 0 of the 2 replicas". A test of a hung zone waits
# out these bounds (or sets its own).
REQUEST_TIMEOUT = "5s"
WRITE_TIMEOUT = "15s"


@pytest.fixture
def wal_options(zones: list[ZoneServer]) -> dict[str, Any]:
    return zone_wal_options(
        zones,
        prefix=f"t{next(_log_numbers)}",
        request_timeout=REQUEST_TIMEOUT,
        write_timeout=WRITE_TIMEOUT,
    )


@pytest.fixture
def shared_wal_options(shared_zones: list[ZoneServer]) -> dict[str, Any]:
    return zone_wal_options(
        shared_zones,
        prefix=f"shared{next(_log_numbers)}-{time.monotonic_ns()}",
        request_timeout=REQUEST_TIMEOUT,
        write_timeout=WRITE_TIMEOUT,
    )


WalOpener = Callable[..., Any]


def _opener_fixture(options_fixture: str) -> Any:
    @pytest.fixture
    async def opener(request: pytest.FixtureRequest) -> AsyncIterator[WalOpener]:
        """``await open_wal(epoch, mode=..., recover=True, **options)`` → (wal, records).

        Every WAL opened here is closed at the end of the test."""
        base: dict[str, Any] = request.getfixturevalue(options_fixture)
        opened: list[S3ExpressWal] = []

        async def open_wal(
            epoch: int,
            mode: WalMode = WalMode.READ_WRITE,
            recover: bool = True,
            **options: Any,
        ) -> tuple[S3ExpressWal, list[WalRecord]]:
            wal = S3EXPRESS_WAL.build({**base, **options}, BuildContext(node_id=1), "wal")
            opened.append(wal)
            await wal.start(1, epoch, mode)
            records = [record async for record in wal.recover()] if recover else []
            return wal, records

        yield open_wal
        for wal in opened:
            try:
                await wal.close()
            except Exception:
                pass

    return opener


open_wal = _opener_fixture("wal_options")
open_shared_wal = _opener_fixture("shared_wal_options")


async def eventually(predicate: Callable[[], Any], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        result = predicate()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.05)


@pytest.fixture
def wait_for() -> Callable[..., Any]:
    """``await wait_for(predicate, timeout_s)``: poll (a sync or async predicate) until true."""
    return eventually
