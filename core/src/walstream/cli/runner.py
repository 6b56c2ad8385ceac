"""Running one command: exit statuses, logging, error lines, and the deadline (``--timeout``)
and Ctrl-C, both bounded even when the command's cleanup waits on a backend that never answers
(like a final upload to an object store that is down)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
import traceback
from collections.abc import Awaitable
from typing import Any

from walstream.cli.output import PROG
from walstream.errors import StreamNotFound

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "EXIT_CORRUPT",
    "EXIT_DEADLINE",
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "STOP_GRACE_S",
    "Stopped",
    "command_deadline",
    "configure_logging",
    "print_error",
    "report_stop",
    "run_command",
    "silence_stdout",
]

log = logging.getLogger("walstream.cli")

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_CORRUPT = 2
"""``inspect wal``: the medium is damaged or belongs to another deployment or node."""
EXIT_INTERRUPTED = 130
EXIT_DEADLINE = 124
"""The command did not finish within ``--timeout`` (the code of coreutils ``timeout``)."""

DEFAULT_TIMEOUT_S = 120.0
"""Deadline of a one-shot command unless ``--timeout`` says otherwise."""
# Long-running by nature: an append streams its input (a large file, a producer's pipe) for as
# long as the input lasts; Ctrl-C or an explicit --timeout stops it.
UNBOUNDED_COMMANDS = frozenset({"serve", "bench", "demo", "append"})
"""Commands that run until stopped: no deadline unless ``--timeout`` is given (also
``tail --follow``)."""
STOP_GRACE_S = 2.0
"""After Ctrl-C or the deadline, how long a command may take to close before it is abandoned
(each of two steps: the command's own cleanup, then every task left)."""
DURABILITY_NOTE = (
    "records acknowledged before are durable in the write-ahead log; the next start on this "
    "deployment uploads them"
)


def configure_logging(verbose: int) -> None:
    """No ``-v``: warnings only. ``-v``: debug logging of walstream and its plugins (loggers
    named ``walstream*``), other libraries at INFO (botocore alone logs thousands of DEBUG lines
    per S3 run). ``-vv``: everything at DEBUG."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if verbose == 1:
        for handler in logging.root.handlers:
            handler.addFilter(_own_debug_only)


def _own_debug_only(record: logging.LogRecord) -> bool:
    """A handler filter: DEBUG records only from walstream's own loggers (a filter on the
    handler also covers the loggers that plugins create after logging is configured)."""
    return record.levelno >= logging.INFO or record.name.startswith("walstream")


def print_error(exc: BaseException, verbose: int) -> None:
    if verbose:
        traceback.print_exception(exc, file=sys.stderr)
    message = str(exc).strip() or "(no message)"
    if isinstance(exc, StreamNotFound):
        # The message is written for the Python API; point a shell user at the command.
        message = message.replace("list_streams()", "`walstream streams list`")
    print(f"{PROG}: error: {type(exc).__name__}: {message}", file=sys.stderr)


class Stopped(Exception):
    """The command was stopped before it finished: Ctrl-C, or its deadline."""

    def __init__(self, *, interrupted: bool, deadline_s: float | None = None) -> None:
        super().__init__("interrupted" if interrupted else f"deadline {deadline_s} s")
        self.interrupted = interrupted
        self.deadline_s = deadline_s


def command_deadline(args: argparse.Namespace) -> float | None:
    """The command's deadline in seconds, None for none."""
    value: float | None = getattr(args, "timeout", None)
    if value is None:
        follows = args.command == "tail" and bool(getattr(args, "follow", False))
        return None if args.command in UNBOUNDED_COMMANDS or follows else DEFAULT_TIMEOUT_S
    return value or None


def report_stop(stop: Stopped, command: str) -> int:
    """Say why ``command`` stopped (and that nothing acknowledged is lost); the exit status."""
    if stop.interrupted:
        if command == "tail":
            return EXIT_OK
        print(f"{PROG}: interrupted; {DURABILITY_NOTE}", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(
        f"{PROG}: error: {command} did not finish within {stop.deadline_s:g} s "
        f"(--timeout; 0 for no deadline); the log lines above say what it was waiting for; "
        f"{DURABILITY_NOTE}",
        file=sys.stderr,
    )
    return EXIT_DEADLINE


def run_command(outcome: Awaitable[Any], command: str, deadline_s: float | None) -> Any:
    """Run a command's coroutine on a new event loop, bounded by ``deadline_s``; Ctrl-C stops it.

    Unlike :func:`asyncio.run`, stopping is bounded: the command gets :data:`STOP_GRACE_S` to
    close (a final upload that cannot reach the object store is abandoned — the records are
    durable in the WAL), then the tasks left get as long again. A process that still does not
    end — its tasks ignore cancellation, or the loop is blocked in a synchronous call such as
    reading standard input — is ended by a watchdog thread with :func:`os._exit` (acknowledged
    data is durable, so this loses nothing). A second Ctrl-C raises KeyboardInterrupt at once.
    """
    loop = _new_loop(command)
    asyncio.set_event_loop(loop)
    interrupted: asyncio.Future[None] = loop.create_future()
    watchdog = _Watchdog()
    limit_s = 2 * STOP_GRACE_S + 1.0
    if deadline_s is not None:
        watchdog.arm(
            deadline_s + limit_s, Stopped(interrupted=False, deadline_s=deadline_s), command
        )

    def on_sigint(signum: int, frame: object) -> None:
        if interrupted.done() or watchdog.interrupt_armed:
            raise KeyboardInterrupt
        watchdog.arm(limit_s, Stopped(interrupted=True), command)
        loop.call_soon_threadsafe(_set_once, interrupted)

    # serve handles SIGINT itself (a graceful stop); a handler can only be set in the main
    # thread.
    previous: Any = None
    watch_signal = command != "serve" and threading.current_thread() is threading.main_thread()
    if watch_signal:
        previous = signal.signal(signal.SIGINT, on_sigint)
    stopped = False
    try:
        return loop.run_until_complete(_run(outcome, command, deadline_s, interrupted))
    except (Stopped, KeyboardInterrupt):
        stopped = True
        raise
    finally:
        clean = _close_loop(loop)
        if stopped and not clean:
            _leave(Stopped(interrupted=True), command, "its tasks did not end")
        watchdog.disarm()
        if watch_signal:
            signal.signal(signal.SIGINT, previous)


def _new_loop(command: str) -> asyncio.AbstractEventLoop:
    """uvloop for ``walstream serve`` when it is installed (the ``server`` extra): its
    sockets and callbacks cost less per request; every other command uses asyncio's loop."""
    if command == "serve":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def _set_once(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class _Watchdog:
    """Timers that end the process from another thread when the event loop cannot stop the
    command in time (see :func:`run_command`)."""

    def __init__(self) -> None:
        self._timers: list[threading.Timer] = []
        self.interrupt_armed = False

    def arm(self, after_s: float, stop: Stopped, command: str) -> None:
        self.interrupt_armed = self.interrupt_armed or stop.interrupted
        timer = threading.Timer(
            after_s, _leave, (stop, command, f"not stopped after {after_s:g} s")
        )
        timer.daemon = True
        timer.start()
        self._timers.append(timer)

    def disarm(self) -> None:
        for timer in self._timers:
            timer.cancel()


def _leave(stop: Stopped, command: str, why: str) -> None:
    """Report ``stop`` and end the process now (``why``: why it could not end normally)."""
    code = report_stop(stop, command)
    print(f"{PROG}: {command}: {why}; leaving it", file=sys.stderr)
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    os._exit(code)


async def _run(
    outcome: Awaitable[Any],
    command: str,
    deadline_s: float | None,
    interrupted: asyncio.Future[None],
) -> Any:
    """Await ``outcome``; when ``interrupted`` is set (Ctrl-C) or at the deadline cancel it,
    give it :data:`STOP_GRACE_S` to close and raise :class:`Stopped`."""
    task = asyncio.ensure_future(outcome)
    await asyncio.wait({task, interrupted}, timeout=deadline_s, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        return task.result()
    task.cancel()
    await asyncio.wait({task}, timeout=STOP_GRACE_S)
    if task.done() and not task.cancelled() and task.exception() is not None:
        log.debug("%s failed while stopping: %s", command, task.exception())
    raise Stopped(interrupted=interrupted.done(), deadline_s=deadline_s)


def _close_loop(loop: asyncio.AbstractEventLoop) -> bool:
    """Cancel the tasks left, wait at most :data:`STOP_GRACE_S` for them, close the loop;
    False if some did not end (the loop is then left open)."""
    pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in pending:
        task.cancel()
    if pending:
        loop.run_until_complete(asyncio.wait(pending, timeout=STOP_GRACE_S))
        if any(not task.done() for task in pending):
            return False
        for task in pending:
            if not task.cancelled() and task.exception() is not None:
                log.debug("task failed while stopping: %s", task.exception())
    try:
        loop.run_until_complete(asyncio.wait_for(loop.shutdown_asyncgens(), STOP_GRACE_S))
        loop.run_until_complete(asyncio.wait_for(loop.shutdown_default_executor(), STOP_GRACE_S))
    except TimeoutError:
        return False
    finally:
        asyncio.set_event_loop(None)
    loop.close()
    return True


def silence_stdout() -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
