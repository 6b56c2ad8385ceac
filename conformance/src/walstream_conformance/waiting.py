"""Waiting in tests for something that happens in another task, thread or process.

:func:`eventually` waits for a condition without a deadline of its own: a test's only bound is
its timeout (pytest-timeout, ``timeout`` in the root pyproject.toml), so a loaded machine makes a
test slower, never wrong. Wall-clock deadlines inside tests failed under load (one missed by
19 ms). While it waits it logs what it waits for every :data:`REPORT_EVERY_S` seconds, so a test
stopped by its timeout names the condition in its captured log; once a wait has lasted
:data:`STACKS_AFTER_S` seconds it also logs, once, the stack of every task of the running event
loop (what each one is awaiting), so a hang explains itself in CI's output: pytest-timeout
dumps the threads, which in an asyncio test are idle.
"""

from __future__ import annotations

import asyncio
import inspect
import io
import logging
import time
from collections.abc import Awaitable, Callable

__all__ = ["REPORT_EVERY_S", "STACKS_AFTER_S", "eventually", "task_stacks"]

log = logging.getLogger(__name__)

REPORT_EVERY_S = 30.0
"""How often a long wait logs that it still waits."""

STACKS_AFTER_S = 120.0
"""After how long a wait logs the stacks of the event loop's tasks (once)."""


async def eventually(
    check: Callable[[], bool | Awaitable[bool]],
    what: str,
    *,
    poll_s: float = 0.02,
    report_every_s: float = REPORT_EVERY_S,
    stacks_after_s: float = STACKS_AFTER_S,
) -> None:
    """Return once ``check()`` (a function or a coroutine function) is true, polling every
    ``poll_s`` seconds; log that it still waits every ``report_every_s`` seconds, and with the
    first such line after ``stacks_after_s`` seconds the stacks of the loop's tasks."""
    started = report_at = time.monotonic()
    stacks_logged = False
    while True:
        outcome = check()
        if inspect.isawaitable(outcome):
            outcome = await outcome
        if outcome:
            return
        now = time.monotonic()
        if now >= report_at + report_every_s:
            report_at = now
            log.warning("still waiting for %s after %.0f s", what, now - started)
            if not stacks_logged and now - started >= stacks_after_s:
                stacks_logged = True
                log.warning(
                    "still waiting for %s after %.0f s; the tasks of the event loop:\n%s",
                    what,
                    now - started,
                    task_stacks(),
                )
        await asyncio.sleep(poll_s)


def task_stacks() -> str:
    """The stack of every task of the running event loop, by task name, with what each one is
    suspended on (its coroutine's frames end at the ``await`` it waits in)."""
    out = io.StringIO()
    current = asyncio.current_task()
    tasks = sorted(asyncio.all_tasks(), key=lambda task: task.get_name())
    out.write(f"{len(tasks)} tasks\n")
    for task in tasks:
        if task is current:
            out.write(f"--- task {task.get_name()!r}: this wait\n")
            continue
        out.write(f"--- task {task.get_name()!r}: {task.get_coro()!r}\n")
        # The future the task is suspended on: asyncio keeps it in a private attribute.
        waiter = getattr(task, "_fut_waiter", None)
        if waiter is not None:
            out.write(f"    awaiting {waiter!r}\n")
        try:
            task.print_stack(file=out)
        except Exception as error:  # a stack is worth having, never worth failing a test for
            out.write(f"    (no stack: {type(error).__name__}: {error})\n")
    return out.getvalue()
