"""Claims batched like commits: the first appends to many streams share one metadata
transaction.

A node claims a stream (:meth:`~walstream.metadata.MetadataStore.claim_stream`: bump its epoch,
become its owner) before its first append, and again after a clean restart. One fsynced
transaction per stream made that the cost of touching many streams: 100,000 streams after a
restart were 100,000 transactions. :class:`ClaimBatcher` sends the first claim at once and
gathers every claim asked for while one is in flight into the next
:meth:`~walstream.metadata.MetadataStore.claim_streams` call (group commit, as the WAL does
for appends), so a burst of first appends costs a few transactions. Nothing is weakened: each
stream is still claimed, with its epoch bumped, in a committed transaction before its first
append; a stream the batch could not claim (deleted, owned by a running node) is claimed alone
again, which raises the error :meth:`claim_stream` gives.

:func:`adopt_owned` is the restart's side: a node restarted after a crash still owns the streams
it wrote, and takes them back in pages of :data:`ADOPT_PAGE` before it serves.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from walstream.metadata.contract import MAX_CLAIM_STREAMS, MetadataStore, StreamInfo

__all__ = ["ADOPT_PAGE", "ClaimBatcher", "adopt_owned"]

ADOPT_PAGE = 10_000
"""Streams a restarted node takes back per metadata transaction."""


class ClaimBatcher:
    """Claims for one node epoch, gathered while a claim transaction is in flight."""

    def __init__(
        self, metadata: MetadataStore, node_id: int, node_epoch: Callable[[], int]
    ) -> None:
        self._metadata = metadata
        self._node_id = node_id
        self._node_epoch = node_epoch
        self._pending: dict[int, list[asyncio.Future[StreamInfo]]] = {}
        self._task: asyncio.Task[None] | None = None
        self.transactions = 0
        """Claim transactions sent (for tests and benchmarks)."""

    async def claim(self, stream_id: int) -> StreamInfo:
        """The stream as claimed by this node (or the error :meth:`claim_stream` raises)."""
        future: asyncio.Future[StreamInfo] = asyncio.get_running_loop().create_future()
        self._pending.setdefault(stream_id, []).append(future)
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="walstream-claims")
        return await future

    async def _run(self) -> None:
        try:
            while self._pending:
                ids = list(self._pending)[:MAX_CLAIM_STREAMS]
                batch = {stream_id: self._pending.pop(stream_id) for stream_id in ids}
                await self._send(batch)
        finally:
            self._task = None

    async def _send(self, batch: dict[int, list[asyncio.Future[StreamInfo]]]) -> None:
        metadata = self._metadata
        epoch = self._node_epoch()
        claimed: dict[int, StreamInfo] = {}
        try:
            self.transactions += 1
            if len(batch) > 1:
                claimed = await metadata.claim_streams(list(batch), self._node_id, epoch)
        except BaseException as error:  # every waiter of the batch gets it, then it goes on
            for futures in batch.values():
                _settle(futures, error=error)
            if not isinstance(error, Exception):
                raise
            return
        for stream_id, futures in batch.items():
            info = claimed.get(stream_id)
            if info is None:
                # Alone: the one claim of a batch of one, or one the batch left as it was
                # (claim_stream raises why, or claims it if things changed meanwhile).
                try:
                    if len(batch) > 1:
                        self.transactions += 1
                    info = await metadata.claim_stream(stream_id, self._node_id, epoch)
                except Exception as error:
                    _settle(futures, error=error)
                    continue
            _settle(futures, info=info)


def _settle(
    futures: list[asyncio.Future[StreamInfo]],
    info: StreamInfo | None = None,
    error: BaseException | None = None,
) -> None:
    for future in futures:
        if future.done():
            continue  # its waiter was cancelled
        if isinstance(error, asyncio.CancelledError):
            future.cancel()  # the batch was cancelled (the loop is closing): so are its waiters
        elif error is not None:
            future.set_exception(error)
        else:
            assert info is not None
            future.set_result(info)


async def adopt_owned(metadata: MetadataStore, node_id: int, node_epoch: int) -> list[StreamInfo]:
    """Claim as ``node_epoch`` every active stream ``node_id`` still owns (it crashed, or was
    stopped without releasing them), :data:`ADOPT_PAGE` per transaction."""
    adopted: list[StreamInfo] = []
    after = 0
    while True:
        page = await metadata.adopt_streams(node_id, node_epoch, after, ADOPT_PAGE)
        adopted += page
        if len(page) < ADOPT_PAGE:
            return adopted
        after = page[-1].stream_id
