"""Running one request on many replicas: per-request timeouts, retries with backoff until the
write timeout, quorum waits, and the bookkeeping of replicas that fell behind (``lagging``)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from walstream.clock import Clock
from walstream.errors import (
    AmbiguousError,
    BackendUnavailable,
    FencedError,
    IdentityMismatch,
    WalstreamError,
)
from walstream.wal._waits import wait_for, wait_tasks
from walstream.wal.quorum.replica import Replica

__all__ = ["Fanout", "ReplicaState"]

T = TypeVar("T")


@dataclass
class ReplicaState:
    replica: Replica
    lagging: bool = False
    """Something may be missing on this replica; the catch-up task will fix it."""
    generation: int = 0
    """Bumped at every failure, so catch-up knows whether it raced with a new one."""
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


class Fanout:
    """The replicas of one log and the way :class:`~walstream.wal.quorum.QuorumWal` talks to
    them. ``fenced`` latches the first :class:`FencedError` any replica answered (also from a
    request that finished in the background); ``background`` holds those stragglers."""

    def __init__(
        self,
        replicas: Sequence[Replica],
        *,
        log_id: str,
        request_timeout_s: float,
        write_timeout_s: float,
        clock: Clock,
    ) -> None:
        self.log_id = log_id
        self.request_timeout_s = request_timeout_s
        self.write_timeout_s = write_timeout_s
        self.clock = clock
        self.states = {replica.name: ReplicaState(replica) for replica in replicas}
        self.background: set[asyncio.Task[Any]] = set()
        self.fenced: FencedError | None = None

    async def bounded(self, call: Awaitable[T]) -> T:
        try:
            return await wait_for(self.clock, call, self.request_timeout_s)
        except TimeoutError:
            raise AmbiguousError(
                f"replica request timed out after {self.request_timeout_s:g}s; it may have "
                "been applied"
            ) from None

    def mark_lagging(self, name: str) -> None:
        state = self.states[name]
        state.generation += 1
        state.lagging = True
        state.wake.set()

    async def on_replicas(
        self,
        what: str,
        request: Callable[[Replica], Awaitable[T]],
        needed: int,
        *,
        names: Sequence[str] | None = None,
        wait_all: bool = True,
        on_success: Callable[[str], None] | None = None,
    ) -> dict[str, T]:
        """Run ``request`` on the replicas (all, or ``names``) until ``needed`` succeeded.

        Replicas that fail are retried with backoff until ``write_timeout_s``; a
        :class:`FencedError` from any replica ends it at once. With ``wait_all`` the call also
        waits (bounded by the request timeout) for the other replicas' first answers, so
        recovery sees as many listings as are available; otherwise it returns at the quorum and
        the stragglers finish in the background.
        """
        targets = list(names) if names is not None else list(self.states)
        if needed <= 0:
            return {}
        if len(targets) < needed:
            raise BackendUnavailable(
                f"quorum WAL {self.log_id}: {what} needs {needed} replicas but only "
                f"{len(targets)} can take it; bring the missing chunk servers back"
            )
        results: dict[str, T] = {}
        errors: dict[str, WalstreamError] = {}
        running: dict[asyncio.Task[T], str] = {}
        deadline = self.clock.monotonic() + self.write_timeout_s
        backoff_s = 0.02
        retry_at: dict[str, float] = {}

        def launch(name: str) -> None:
            task = asyncio.ensure_future(self.bounded(request(self.states[name].replica)))
            running[task] = name

        def settle(task: asyncio.Task[T], name: str) -> None:
            if task.cancelled():
                return
            exc = task.exception()
            if exc is None:
                results[name] = task.result()
                errors.pop(name, None)
                if on_success is not None:
                    on_success(name)
            elif isinstance(exc, WalstreamError):
                errors[name] = exc
                if not isinstance(exc, FencedError | IdentityMismatch):
                    self.mark_lagging(name)
            else:
                errors[name] = AmbiguousError(f"{type(exc).__name__}: {exc}")
                self.mark_lagging(name)

        def finish_in_background(task: asyncio.Task[T], name: str) -> None:
            self.background.add(task)

            def done(finished: asyncio.Future[T]) -> None:
                self.background.discard(task)
                settle(task, name)
                if isinstance(errors.get(name), FencedError):
                    self.fenced = errors[name]  # type: ignore[assignment]

            task.add_done_callback(done)

        for name in targets:
            launch(name)
        try:
            while True:
                mismatch = next(
                    (exc for exc in errors.values() if isinstance(exc, IdentityMismatch)), None
                )
                if mismatch is not None:
                    # Another deployment's replica: retrying cannot help and nothing of ours
                    # may be written there.
                    raise mismatch
                if len(results) >= needed and (not wait_all or not running):
                    break
                fenced = next(
                    (exc for exc in errors.values() if isinstance(exc, FencedError)), None
                )
                if fenced is not None:
                    self.fenced = fenced
                    raise FencedError(
                        f"quorum WAL {self.log_id}: {what} refused, a newer epoch owns the log "
                        f"({fenced}); this writer must stop"
                    )
                now = self.clock.monotonic()
                idle = [name for name in targets if name not in results and name in errors]
                for name in idle:
                    if name not in running.values() and retry_at.get(name, 0.0) <= now:
                        if len(results) >= needed:
                            continue
                        launch(name)
                if not running:
                    if now >= deadline or not idle:
                        break
                    pending_retries = [retry_at.get(name, now) for name in idle]
                    await self.clock.sleep(max(0.0, min([*pending_retries, deadline]) - now))
                    continue
                done, _ = await wait_tasks(self.clock, running, deadline - now, first=True)
                if not done and self.clock.monotonic() >= deadline:
                    break
                for task in done:
                    name = running.pop(task)
                    settle(task, name)
                    if name in errors:
                        retry_at[name] = self.clock.monotonic() + backoff_s
                        backoff_s = min(backoff_s * 2, 0.5)
        finally:
            for task, name in running.items():
                finish_in_background(task, name)
        if len(results) < needed:
            detail = "; ".join(f"{name}: {exc}" for name, exc in sorted(errors.items()))
            reached = sorted(results)
            message = (
                f"quorum WAL {self.log_id}: {what} reached {len(reached)} of the {needed} "
                f"replicas it needs within {self.write_timeout_s:g}s ({detail or 'no answer'}); "
                "check that enough chunk servers are up"
            )
            if results or any(isinstance(exc, AmbiguousError) for exc in errors.values()):
                raise AmbiguousError(message)
            raise BackendUnavailable(message)
        return results
