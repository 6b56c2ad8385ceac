"""Idempotent producers: InitProducerId, and the per-partition sequence checks that make a
retried batch be written once.

**Producer ids** are unique without a shared counter: ``node id << 48 | (node epoch mod 2**16)
<< 32 | n`` where ``n`` counts this process's grants. A node's epoch grows at every start, so
two processes never grant the same id (while a node restarts fewer than 65,536 times between
two grants of one producer's life).

**Sequences.** Each partition keeps, per producer, the last five batches stored (their base
sequence, record count and base offset) and the epoch. A batch is

- *next* when its base sequence follows the producer's last one (0 for a producer the partition
  has not seen): appended;
- a *duplicate* when it equals one of the last five (same base sequence and count): not written
  again, answered with the offset the first copy got (awaiting that copy when it is still in
  flight) — the retry of a batch whose answer was lost;
- *out of order* otherwise: ``OUT_OF_ORDER_SEQUENCE_NUMBER``; an older producer epoch is
  ``INVALID_PRODUCER_EPOCH``.

The table is soft state rebuilt from the stream itself: each idempotent batch's last record
carries ``p<id>:<epoch>:<base sequence>:<count>`` (:mod:`walstream_kafka.mapping`), and the node
that claims a partition reads the last :data:`RECOVERY_RECORDS` records of its stream and
replays those marks before it appends anything. So a leader change keeps the duplicate check
without a metadata write per batch: the mark is durable with the batch it describes, by the
same WAL acknowledgement. A producer whose last batch lies further back than that window is
treated as new on the next leader (accepted at any sequence).
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from walstream_kafka import codes
from walstream_kafka.mapping import read_producer_mark
from walstream_kafka.wire import DecodedRequest

__all__ = [
    "RECOVERY_RECORDS",
    "PartitionProducers",
    "SequenceVerdict",
    "handle_init_producer_id",
]

RECOVERY_RECORDS = 4096
_KEPT_BATCHES = 5
_I32 = 2**31


@dataclass
class _Sent:
    base_sequence: int
    count: int
    offset: asyncio.Future[int]


@dataclass
class _Producer:
    epoch: int
    last_sequence: int = -1
    recent: deque[_Sent] = field(default_factory=lambda: deque(maxlen=_KEPT_BATCHES))


@dataclass(frozen=True)
class SequenceVerdict:
    """What to do with a batch: ``append`` it, answer the ``duplicate`` offset, or ``error``."""

    append: bool
    error: int = codes.NONE
    duplicate: asyncio.Future[int] | None = None


class PartitionProducers:
    """The sequence table of one partition on the node that leads it."""

    def __init__(self) -> None:
        self._producers: dict[int, _Producer] = {}

    @classmethod
    async def recover(cls, stream: Any) -> PartitionProducers:
        """The table rebuilt from the marks in the stream's last records."""
        table = cls()
        tail = await stream.check_tail()
        start = max(await stream.start_offset(), tail - RECOVERY_RECORDS)
        loop = asyncio.get_running_loop()
        position = start
        while position < tail:
            result = await stream.read(start=position, limit_records=1000, limit_bytes=8 << 20)
            if not result.records:
                break
            for record in result.records:
                if record.offset < position:
                    continue
                mark = read_producer_mark(record)
                if mark is not None:
                    producer = table._producers.setdefault(
                        mark.producer_id, _Producer(mark.producer_epoch)
                    )
                    producer.epoch = max(producer.epoch, mark.producer_epoch)
                    offset: asyncio.Future[int] = loop.create_future()
                    offset.set_result(record.offset - mark.count + 1)
                    producer.recent.append(_Sent(mark.base_sequence, mark.count, offset))
                    producer.last_sequence = (mark.base_sequence + mark.count - 1) % _I32
            position = result.records[-1].offset + 1
        return table

    def check(
        self, producer_id: int, epoch: int, base_sequence: int, count: int
    ) -> SequenceVerdict:
        """The verdict on a batch (module docstring); an appended batch must then be
        :meth:`sent`, before any other batch of the partition is checked."""
        producer = self._producers.get(producer_id)
        if producer is None or epoch > producer.epoch:
            return SequenceVerdict(append=True)
        if epoch < producer.epoch:
            return SequenceVerdict(append=False, error=codes.INVALID_PRODUCER_EPOCH)
        for sent in producer.recent:
            if sent.base_sequence == base_sequence and sent.count == count:
                return SequenceVerdict(append=False, duplicate=sent.offset)
        if base_sequence == (producer.last_sequence + 1) % _I32:
            return SequenceVerdict(append=True)
        return SequenceVerdict(append=False, error=codes.OUT_OF_ORDER_SEQUENCE_NUMBER)

    def sent(
        self,
        producer_id: int,
        epoch: int,
        base_sequence: int,
        count: int,
        offset: asyncio.Future[int],
    ) -> None:
        """Record a batch submitted for append; ``offset`` resolves to its base offset (or
        fails, which forgets it so the producer's retry is appended)."""
        producer = self._producers.get(producer_id)
        if producer is None or epoch > producer.epoch:
            producer = self._producers[producer_id] = _Producer(epoch)
        before = producer.last_sequence
        sent = _Sent(base_sequence, count, offset)
        producer.recent.append(sent)
        producer.last_sequence = (base_sequence + count - 1) % _I32

        def forget(done: asyncio.Future[int]) -> None:
            if done.cancelled() or done.exception() is not None:
                if sent in producer.recent:
                    producer.recent.remove(sent)
                if producer.last_sequence == (base_sequence + count - 1) % _I32:
                    producer.last_sequence = before

        offset.add_done_callback(forget)


_grants = itertools.count()


async def handle_init_producer_id(session: Any, request: DecodedRequest) -> dict[str, Any]:
    body = request.body
    if body.transactional_id is not None:
        return {
            "throttle_time": 0,
            "error_code": codes.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
            "producer_id": -1,
            "producer_epoch": -1,
        }
    existing = getattr(body, "producer_id", -1)
    if existing is not None and existing >= 0:
        # A producer re-initialising after a fatal error keeps its id with the next epoch.
        epoch = getattr(body, "producer_epoch", 0)
        if epoch < 32767:
            return {
                "throttle_time": 0,
                "error_code": codes.NONE,
                "producer_id": existing,
                "producer_epoch": epoch + 1,
            }
    client = session.broker.client
    producer_id = (
        (client.node_id & 0x7FFF) << 48
        | (client.node_epoch & 0xFFFF) << 32
        | next(_grants) & 0xFFFFFFFF
    )
    return {
        "throttle_time": 0,
        "error_code": codes.NONE,
        "producer_id": producer_id,
        "producer_epoch": 0,
    }
