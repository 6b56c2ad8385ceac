"""Waiting in tests for something that happens in another task, thread or process.

:func:`eventually` waits for a condition without a deadline of its own: a test's only bound is
its timeout (pytest-timeout, ``timeout`` in the root pyproject.toml), so a loaded machine makes a
test slower, never wrong. Wall-clock deadlines inside tests failed under load (one missed by
19 ms). While it waits it logs what it waits for every :data:`REPORT_EVERY_S` seconds, so a test
stopped by its timeout names the condition in its captured log.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable

__all__ = ["REPORT_EVERY_S", "eventually"]

log = logging.getLogger(__name__)

REPORT_EVERY_S = 30.0


async def eventually(
    check: Callable[[], bool | Awaitable[bool]], what: str, *, poll_s: float = 0.02
) -> None:
    """Return once ``check()`` (a function or a coroutine function) is true, polling every
    ``poll_s`` seconds."""
    started = report_at = time.monotonic()
    while True:
        outcome = check()
        if inspect.isawaitable(outcome):
            outcome = await outcome
        if outcome:
            return
        now = time.monotonic()
        if now >= report_at + REPORT_EVERY_S:
            report_at = now
            log.warning("still waiting for %s after %.0f s", what, now - started)
        await asyncio.sleep(poll_s)
