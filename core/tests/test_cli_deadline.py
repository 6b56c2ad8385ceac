"""The CLI's command runner: a per-command deadline (``--timeout``) and Ctrl-C, both bounded even
when the command's cleanup waits on a backend that never answers (like a final upload to an
object store that is down)."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from walstream import cli
from walstream.cli import runner, streams

STUCK_S = 20.0
"""How long the stuck command's cleanup waits; a runner that is not bounded takes this long."""


def stuck_command(interrupt_after_s: float | None = None) -> object:
    """A command whose body waits forever and whose cleanup, once cancelled, waits (shielded,
    like the final upload in ``Client.close``) for :data:`STUCK_S`."""

    async def command(args: argparse.Namespace) -> int:
        loop = asyncio.get_running_loop()
        if interrupt_after_s is not None:
            loop.call_later(interrupt_after_s, os.kill, os.getpid(), signal.SIGINT)
        try:
            await asyncio.Event().wait()
        finally:
            upload = asyncio.ensure_future(asyncio.sleep(STUCK_S))
            await asyncio.shield(upload)
        return runner.EXIT_OK

    return command


@pytest.mark.slow
def test_deadline_stops_a_command_whose_cleanup_hangs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(streams, "cmd_streams_list", stuck_command())
    started = time.monotonic()
    status = cli.main(["--timeout", "0.5", "streams", "list"])
    took = time.monotonic() - started
    assert status == runner.EXIT_DEADLINE == 124
    assert took < 0.5 + 2 * runner.STOP_GRACE_S + 1.5, took
    stderr = capsys.readouterr().err
    assert "walstream: error: streams did not finish within 0.5 s (--timeout" in stderr
    assert "durable in the write-ahead log" in stderr


@pytest.mark.slow
def test_ctrl_c_stops_a_command_whose_cleanup_hangs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(streams, "cmd_streams_list", stuck_command(interrupt_after_s=0.3))
    # Python's own handler, or one another library put there before (a SparkSession started
    # earlier in the same pytest worker installs its own).
    before = signal.getsignal(signal.SIGINT)
    started = time.monotonic()
    status = cli.main(["streams", "list"])
    took = time.monotonic() - started
    assert status == runner.EXIT_INTERRUPTED == 130
    assert took < 0.3 + 2 * runner.STOP_GRACE_S + 1.5, took
    stderr = capsys.readouterr().err
    assert stderr.startswith("walstream: interrupted; records acknowledged before are durable")
    # The SIGINT handler is gone afterwards: the process's Ctrl-C works as before.
    assert signal.getsignal(signal.SIGINT) is before


@pytest.mark.parametrize(
    ("argv", "deadline"),
    [
        (["read", "s"], runner.DEFAULT_TIMEOUT_S),
        (["append", "s"], None),
        (["--timeout", "30", "append", "s"], 30.0),
        (["tail", "s"], runner.DEFAULT_TIMEOUT_S),
        (["tail", "s", "--follow"], None),
        (["serve"], None),
        (["demo"], None),
        (["bench"], None),
        (["--timeout", "7", "read", "s"], 7.0),
        (["read", "s", "--timeout", "7"], 7.0),
        (["read", "s", "--timeout", "0"], None),
        (["serve", "--timeout", "9"], 9.0),
    ],
)
def test_every_one_shot_command_has_a_deadline_by_default(
    argv: list[str], deadline: float | None
) -> None:
    args = cli.build_parser().parse_args(argv)
    assert runner.command_deadline(args) == deadline


@pytest.mark.parametrize("value", ["-1", "soon", "inf", "nan"])
def test_a_bad_timeout_is_a_usage_error(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--timeout", value, "streams", "list"])
    assert exit_info.value.code == runner.EXIT_USAGE
    assert "--timeout" in capsys.readouterr().err


@pytest.mark.slow
def test_ctrl_c_stops_an_append_waiting_for_input(tmp_path: Path) -> None:
    # An append waiting for its next input line (a terminal, an idle pipe) stops at Ctrl-C,
    # says that what it acknowledged is durable, and the next command reads it.
    command = [sys.executable, "-m", "walstream.cli"]
    created = subprocess.run(
        [*command, "streams", "create", "orders"], cwd=tmp_path, capture_output=True, text=True
    )
    assert created.returncode == 0, created.stderr
    append = subprocess.Popen(
        [*command, "append", "orders", "--batch", "1"],
        cwd=tmp_path,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert append.stdin is not None and append.stdout is not None
    append.stdin.write("acknowledged\n")
    append.stdin.flush()
    assert append.stdout.readline() == "offsets 0..0\n"
    time.sleep(0.5)  # now blocked reading the next line
    append.send_signal(signal.SIGINT)
    interrupted = time.monotonic()
    try:
        _, stderr = append.communicate(timeout=STUCK_S)
    except subprocess.TimeoutExpired:
        append.kill()
        append.communicate()
        pytest.fail(f"append waiting for input ignored Ctrl-C for {STUCK_S} s")
    took = time.monotonic() - interrupted
    assert append.returncode == runner.EXIT_INTERRUPTED, stderr
    assert took < 2 * runner.STOP_GRACE_S + 1 + 3, took
    assert "walstream: interrupted; records acknowledged before are durable" in stderr
    read = subprocess.run(
        [*command, "read", "orders"], cwd=tmp_path, capture_output=True, text=True
    )
    assert read.returncode == 0, read.stderr
    assert read.stdout == "0\tacknowledged\n"
