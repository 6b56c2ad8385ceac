"""Stream lifecycle work: retention by age and delete-on-empty (docs/guides/lifecycle.md).

Each node runs one :class:`StreamLifecycle` loop. Every ``streams.lifecycle_interval`` it asks the
metadata store for the streams whose ``lifecycle_due_ms`` has come (:meth:`MetadataStore.due_streams`:
one index range, so a pass costs what is due, not what exists) and handles each one:

1. **Who acts.** The stream's owner when it is this node; a stream with no owner, or whose owner
   is down (lease expired, stopped or failed over), by any node; a stream another live node
   owns is that node's (skipped here). Several nodes acting on one stream do no harm: a trim is
   conditional on the stream's epoch and never moves the start backwards.
2. **Retention.** With ``retention_age_s`` R, the cutoff is ``now - R``. A read by timestamp
   finds the first record at or after the cutoff; the stream's start moves there, exactly as a
   trim does (never past an unexpired record: timestamps never decrease within a stream), and
   objects left holding only data below the start become MARK_DESTROYED and are deleted by
   the garbage collection that follows the pass. The next due time is that first unexpired
   record's expiry (its timestamp + R); with no record left, nothing is due until a commit
   brings one (the commit sets it, invariant 16).
3. **Config changes.** A reconfigure makes the stream due at once: the owner's pass takes the
   new config for its appends (timestamping) even when it was made through another node.
4. **Delete-on-empty.** With ``delete_on_empty_min_age_s`` M, a stream found empty (start =
   tail) is marked with the tail and the time (a key of the metadata store's key/value table,
   namespace :data:`KV_NAMESPACE`); once it has stayed empty at that tail for M it is deleted.
   An append in between changes the tail and starts over. A trim makes the check due at once.

The bound: a stream's work runs within one ``lifecycle_interval`` (1 s by default) of its due
time, plus the upload interval for records not yet committed, well within the guide's promise
of 1 minute or 1 % of the age. ``/metrics`` reports the passes and how late the most overdue
stream was (:class:`LifecycleStats`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from walstream.clock import Clock
from walstream.errors import (
    FencedError,
    OutOfRangeError,
    StreamNotFound,
    VersionMismatchError,
    WalstreamError,
)
from walstream.metadata.contract import MetadataStore, NodeInfo, NodeState, StreamInfo

if TYPE_CHECKING:
    from walstream.engine.client import Client, Stream

__all__ = ["DUE_BATCH", "KV_NAMESPACE", "LifecycleStats", "StreamLifecycle"]

log = logging.getLogger(__name__)

KV_NAMESPACE = "walstream.lifecycle"
"""Where delete-on-empty keeps, per stream (key ``empty/<id>``), the tail and time it was first
seen empty."""
DUE_BATCH = 100
"""Streams handled per metadata query; a pass takes batches until none is due."""


@dataclass
class LifecycleStats:
    """What ``/metrics`` reports of this node's lifecycle work."""

    passes: int = 0
    streams_handled: int = 0
    trims: int = 0
    records_expired: int = 0
    """Offsets the start moved past by retention."""
    objects_collected: int = 0
    streams_deleted: int = 0
    failures: int = 0
    last_due: int = 0
    """Streams found due by the last pass."""
    last_lag_s: float = 0.0
    """How late, at the last pass, the most overdue stream it handled was."""


class StreamLifecycle:
    """The lifecycle loop of one node (see the module docstring)."""

    def __init__(self, client: Client, interval_s: float, clock: Clock) -> None:
        self._client = client
        self._metadata: MetadataStore = client.metadata
        self._interval_s = interval_s
        self._clock = clock
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._one_pass = asyncio.Lock()
        """Passes of this node run one at a time (the loop's and one asked for)."""
        self.stats = LifecycleStats()

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="stream-lifecycle")

    async def close(self) -> None:
        self._stop.set()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _loop(self) -> None:
        while not await self._clock.wait(self._stop, self._interval_s):
            try:
                await self.run_once()
            except WalstreamError as error:
                self.stats.failures += 1
                log.warning("stream lifecycle pass failed, will retry: %s", error)

    async def run_once(self) -> int:
        """One pass: every stream due now, in batches; returns how many were handled."""
        async with self._one_pass:
            return await self._pass()

    async def _pass(self) -> int:
        now_ms = self._clock.now_ms()
        handled = 0
        lag_ms = 0
        due_count = 0
        nodes: dict[int, NodeInfo | None] = {}
        store_now_ms = await self._metadata.store_time_ms()
        after: tuple[int, int] | None = None
        trimmed = False
        while True:
            # Keyset pages of the due index: streams left to their live owners do not hide
            # the ones after them.
            batch = await self._metadata.due_streams(now_ms, DUE_BATCH, after)
            if not batch:
                break
            last = batch[-1]
            after = (last.lifecycle_due_ms or 0, last.stream_id)
            due_count += len(batch)
            for info in batch:
                if not await self._acts_on(info, nodes, store_now_ms):
                    continue
                lag_ms = max(lag_ms, now_ms - (info.lifecycle_due_ms or now_ms))
                try:
                    trimmed |= await self._handle(info, now_ms)
                except (StreamNotFound, FencedError) as moved:
                    log.debug(
                        "stream %d changed under its lifecycle work: %s", info.stream_id, moved
                    )
                except WalstreamError as error:
                    self.stats.failures += 1
                    log.warning(
                        "lifecycle work of stream %d failed, will retry: %s", info.stream_id, error
                    )
                handled += 1
            if len(batch) < DUE_BATCH:
                break
        if trimmed:
            self.stats.objects_collected += await self._client.collect_garbage()
        self.stats.passes += 1
        self.stats.streams_handled += handled
        self.stats.last_due = due_count
        self.stats.last_lag_s = lag_ms / 1000
        return handled

    async def _acts_on(
        self, info: StreamInfo, nodes: dict[int, NodeInfo | None], store_now_ms: int
    ) -> bool:
        owner_id = info.owner_node_id
        if owner_id is None or owner_id == self._client.node_id:
            return True
        if owner_id not in nodes:
            nodes[owner_id] = await self._metadata.get_node(owner_id)
        owner = nodes[owner_id]
        if owner is None or owner.state in (NodeState.STOPPED, NodeState.FAILED_OVER):
            return True
        # A lease that ran out: the owner is down (a node without a lease is never judged so).
        return 0 < owner.lease_expires_ms < store_now_ms

    async def _handle(self, info: StreamInfo, now_ms: int) -> bool:
        """The stream's due work; True when it trimmed."""
        self._client._streams.update_config(info)
        stream = await self._client.open_stream(info.stream_id)
        config = info.config
        owned = stream.writing
        due_ms: int | None = None
        trimmed = False
        retention_ms = config.retention_ms
        if retention_ms is not None:
            cutoff_ms = now_ms - retention_ms
            start = await stream.start_offset()
            try:
                found = await stream.read(from_timestamp=cutoff_ms, limit_records=1, stored=True)
            except OutOfRangeError:
                found = None
            if found is not None:
                new_start = found.records[0].offset if found.records else found.tail
                if found.records:
                    due_ms = found.records[0].timestamp_ms + retention_ms
                current = max(start, info.start_offset)
                if new_start > current:
                    if owned:
                        await stream.trim(new_start)
                    else:
                        await self._metadata.trim_stream(info.stream_id, info.epoch, new_start)
                    self.stats.trims += 1
                    self.stats.records_expired += new_start - current
                    trimmed = True
        min_age_s = config.delete_on_empty_min_age_s
        if min_age_s:
            empty_due = await self._empty_check(info, stream, owned, now_ms, min_age_s * 1000)
            if empty_due == -1:
                return trimmed  # deleted
            if empty_due is not None:
                due_ms = empty_due if due_ms is None else min(due_ms, empty_due)
        elif retention_ms is None:
            due_ms = None
        await self._metadata.set_lifecycle_due(
            info.stream_id, due_ms, if_due_ms=info.lifecycle_due_ms
        )
        return trimmed

    async def _empty_check(
        self, info: StreamInfo, stream: Stream, owned: bool, now_ms: int, min_age_ms: int
    ) -> int | None:
        """Delete-on-empty: -1 when the stream was deleted, else when to look again (None: it
        holds records; a trim makes it due again)."""
        tail = await stream.check_tail()
        start = await stream.start_offset()
        key = f"empty/{info.stream_id}"
        marker = await self._metadata.kv_get(KV_NAMESPACE, key)
        if start < tail:
            if marker is not None:
                await self._forget_marker(key, marker.version)
            return None
        seen = None if marker is None else json.loads(marker.value)
        if seen is None or seen.get("tail") != tail:
            value = json.dumps({"tail": tail, "since_ms": now_ms}).encode()
            try:
                await self._metadata.kv_put(
                    KV_NAMESPACE, key, value, 0 if marker is None else marker.version
                )
            except VersionMismatchError:
                return now_ms  # another node marked it meanwhile: look again
            return now_ms + min_age_ms
        since_ms = int(seen["since_ms"])
        if now_ms < since_ms + min_age_ms:
            return since_ms + min_age_ms
        # Empty at the same tail since `since_ms`: delete, unless it changed at the last moment.
        latest = (await self._metadata.get_streams([info.stream_id])).get(info.stream_id)
        if latest is None or latest.committed_end != info.committed_end:
            return now_ms
        if not owned and latest.owner_node_id not in (None, info.owner_node_id):
            return now_ms  # claimed by a node meanwhile: that node looks again
        if owned and await stream.check_tail() != tail:
            return now_ms
        await self._client.delete_stream(info.stream_id)
        await self._forget_marker(key, marker.version if marker else None)
        self.stats.streams_deleted += 1
        log.info(
            "deleted stream %d (%r): empty for %d s (delete_on_empty)",
            info.stream_id,
            info.name,
            (now_ms - since_ms) // 1000,
        )
        return -1

    async def _forget_marker(self, key: str, version: int | None) -> None:
        try:
            await self._metadata.kv_delete(KV_NAMESPACE, key, version)
        except VersionMismatchError:
            pass  # changed by another node: its value stands
