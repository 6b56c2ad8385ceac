"""Outcome classes for corruption fuzzing: every damaged medium must end in a safe outcome.

A fuzz case writes acknowledged records, damages the medium (a flipped bit, a truncation, a
foreign file swapped in), reopens it and looks at what comes back. :func:`classify_recovery`
sorts the result into one :class:`Outcome`; :class:`FuzzReport` counts outcomes per target and
damage kind and prints the table the closing notes quote. Safe outcomes are ``INTACT``,
``DETECTED`` and ``TORN_TAIL``; ``WRONG_DATA`` and ``SILENT_LOSS`` are failures.
"""

from __future__ import annotations

import asyncio
import enum
import random
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from walstream.errors import CorruptionError, DataLossError, WalstreamError
from walstream.wal import WalMode, WalRecord, WriteAheadLog

__all__ = [
    "FuzzReport",
    "Outcome",
    "classify_recovery",
    "flip_bit",
    "overwrite",
    "recover_fresh",
    "write_rounds",
]


class Outcome(enum.Enum):
    INTACT = "intact"
    """Every acknowledged record came back with its bytes, in order, exactly once."""
    DETECTED = "detected"
    """A typed error names corruption, foreign identity or data loss, or recovery reported the
    damaged region (``damage_before``) where acknowledged records are missing."""
    TORN_TAIL = "torn_tail"
    """Only trailing records that no later durable write attests were dropped: what a crash in
    the middle of their write looks like (the medium cannot tell the two apart)."""
    WRONG_DATA = "wrong_data"
    """Bytes that were never appended (or a duplicate, or out of order) came back. A failure."""
    SILENT_LOSS = "silent_loss"
    """An acknowledged record is missing and nothing said so. A failure."""


SAFE = frozenset({Outcome.INTACT, Outcome.DETECTED, Outcome.TORN_TAIL})
DETECTING_ERRORS: tuple[type[WalstreamError], ...] = (CorruptionError, DataLossError)


def classify_recovery(
    acked: Sequence[tuple[int, bytes]],
    recovered: Sequence[WalRecord] | None,
    error: BaseException | None = None,
    *,
    torn_tail_allowance: int = 0,
) -> Outcome:
    """Classify a WAL recovery after damage.

    ``acked`` are ``(offset, data)`` of the acknowledged, untrimmed records in append order;
    ``recovered`` what :meth:`recover` yielded (``None`` when it raised ``error``).
    ``torn_tail_allowance`` is how many trailing acknowledged records the medium may drop as a
    torn tail (those written in the last group, which no later write attests).
    """
    if error is not None:
        if isinstance(error, DETECTING_ERRORS):
            return Outcome.DETECTED
        raise AssertionError(f"recovery failed with an error that names no corruption: {error!r}")
    assert recovered is not None
    expected = dict(acked)
    order = [offset for offset, _ in acked]
    position_of = {offset: index for index, offset in enumerate(order)}
    seen: set[int] = set()
    last_index = -1
    detected = False
    for record in recovered:
        if record.is_damage_report:
            detected = True
            continue
        data = expected.get(record.offset)
        if data is None or data != record.data or record.offset in seen:
            return Outcome.WRONG_DATA
        index = position_of[record.offset]
        if index < last_index:
            return Outcome.WRONG_DATA
        if index > last_index + 1:
            # Acknowledged records between the previous one and this one are missing.
            if record.damage_before is None:
                return Outcome.SILENT_LOSS
            detected = True
        seen.add(record.offset)
        last_index = index
    missing_tail = len(order) - 1 - last_index
    trailing_report = bool(recovered) and recovered[-1].is_damage_report
    if missing_tail and trailing_report:
        return Outcome.DETECTED
    if missing_tail > torn_tail_allowance:
        return Outcome.SILENT_LOSS
    if detected:
        return Outcome.DETECTED
    return Outcome.TORN_TAIL if missing_tail else Outcome.INTACT


async def write_rounds(
    wal: WriteAheadLog,
    rng: random.Random,
    *,
    rounds: tuple[int, int] = (3, 6),
    per_round: tuple[int, int] = (1, 6),
    sizes: tuple[int, int] = (8, 400),
) -> tuple[list[tuple[int, bytes]], int]:
    """Append rounds of concurrent records to a started, recovered ``wal``, awaiting each round.

    Returns the acknowledged ``(offset, data)`` in append order and how many records the last
    round wrote: the records no later write attests, i.e. the torn-tail allowance of a fuzz case.
    Each bound is an inclusive ``(low, high)`` drawn with ``rng``.
    """
    acked: list[tuple[int, bytes]] = []
    last_round = 0
    for _ in range(rng.randint(*rounds)):
        payloads = [rng.randbytes(rng.randint(*sizes)) for _ in range(rng.randint(*per_round))]
        offsets = await asyncio.gather(*(wal.append(payload) for payload in payloads))
        acked.extend(zip(offsets, payloads, strict=True))
        last_round = len(payloads)
    return acked, last_round


async def recover_fresh(
    wal: WriteAheadLog, node_id: int, node_epoch: int
) -> tuple[list[WalRecord] | None, WalstreamError | None]:
    """Start a new instance on a damaged medium (READ_WRITE) and recover it to the end.

    Returns the records, or the walstream error that start or recovery raised, in the shape
    :func:`classify_recovery` takes (an error naming no corruption fails the classification).
    The caller closes ``wal``.
    """
    try:
        await wal.start(node_id, node_epoch, WalMode.READ_WRITE)
        return [record async for record in wal.recover()], None
    except WalstreamError as exc:
        return None, exc


def flip_bit(path: Path, position: int, bit: int) -> None:
    """Flip bit ``bit`` (0 = lowest) of the byte at ``position`` of the file ``path``."""
    with open(path, "r+b") as file:
        file.seek(position)
        byte = file.read(1)[0]
        file.seek(position)
        file.write(bytes([byte ^ (1 << bit)]))


def overwrite(path: Path, position: int, data: bytes) -> None:
    """Write ``data`` over the file ``path`` at ``position``."""
    with open(path, "r+b") as file:
        file.seek(position)
        file.write(data)


@dataclass
class FuzzReport:
    """Counts of outcomes per ``(target, damage)``; :meth:`assert_safe` fails on any unsafe one."""

    title: str
    counts: Counter[tuple[str, str, Outcome]] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)

    def add(self, target: str, damage: str, outcome: Outcome, detail: str = "") -> None:
        self.counts[(target, damage, outcome)] += 1
        if outcome not in SAFE:
            self.failures.append(f"{target} / {damage}: {outcome.value} {detail}".rstrip())

    def rows(self) -> Iterable[tuple[str, str, dict[Outcome, int]]]:
        keys = sorted({(target, damage) for target, damage, _ in self.counts})
        for target, damage in keys:
            yield (
                target,
                damage,
                {outcome: self.counts[(target, damage, outcome)] for outcome in Outcome},
            )

    def table(self) -> str:
        header = ["target", "damage", *(outcome.value for outcome in Outcome)]
        lines = [self.title, " | ".join(header), " | ".join("---" for _ in header)]
        for target, damage, by_outcome in self.rows():
            lines.append(
                " | ".join([target, damage, *(str(by_outcome[outcome]) for outcome in Outcome)])
            )
        return "\n".join(lines)

    def assert_safe(self) -> None:
        print(self.table())
        assert not self.failures, "unsafe outcomes:\n" + "\n".join(self.failures[:20])
