"""The CLI against a frozen S3 endpoint (moto stopped with SIGSTOP: it accepts connections and
never answers): every command ends within its bound with a message naming the endpoint, Ctrl-C
stops a stuck command promptly, and nothing acknowledged is lost.

Real processes: a moto server per test (it is frozen) and ``walstream`` as a subprocess on the
shipped ``examples/s3.yaml``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from walstream_wal_s3.testing.moto import MotoServer

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "s3.yaml"
STUCK_LIMIT_S = 60.0
"""How long a test waits for a command before calling it stuck (and killing it)."""


@pytest.fixture
def server() -> Iterator[MotoServer]:
    with MotoServer() as moto:
        yield moto


class Deployment:
    """``examples/s3.yaml`` in a temporary folder, pointed at ``server``; ``s3_options`` are
    added to both S3 sections (wal and object_store)."""

    def __init__(self, folder: Path, server: MotoServer, **s3_options: str) -> None:
        self.folder = folder
        self.server = server
        text = EXAMPLE.read_text()
        for section in ("wal:\n", "object_store:\n"):
            extra = "".join(f"  {key}: {value}\n" for key, value in s3_options.items())
            text = text.replace(section, section + extra, 1)
        (folder / "s3.yaml").write_text(text)
        self.env = {
            **os.environ,
            "WALSTREAM_S3_ENDPOINT": server.endpoint_url,
            "PYTHONUNBUFFERED": "1",
        }

    def command(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "walstream.cli", "-c", "s3.yaml", *args]

    def run(self, *args: str, stdin: str = "") -> tuple[int, str, str, float]:
        """Run one command to its end: exit status, stdout, stderr, seconds taken."""
        started = time.monotonic()
        try:
            done = subprocess.run(
                self.command(*args),
                input=stdin,
                cwd=self.folder,
                env=self.env,
                capture_output=True,
                text=True,
                timeout=STUCK_LIMIT_S,
            )
        except subprocess.TimeoutExpired as stuck:
            pytest.fail(f"walstream {' '.join(args)} still running after {stuck.timeout} s")
        return done.returncode, done.stdout, done.stderr, time.monotonic() - started

    def start(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.command(*args),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=self.folder,
            env=self.env,
            text=True,
        )


def populate(deployment: Deployment, values: list[str]) -> None:
    status, _, stderr, _ = deployment.run("streams", "create", "orders")
    assert status == 0, stderr
    status, stdout, stderr, _ = deployment.run(
        "append", "orders", stdin="".join(value + "\n" for value in values)
    )
    assert status == 0, stderr
    assert stdout.splitlines() == [f"offsets 0..{len(values) - 1}"]


@pytest.mark.slow
def test_frozen_endpoint_fails_each_command_within_request_timeout(
    tmp_path: Path, server: MotoServer
) -> None:
    # request_timeout bounds one S3 operation (all attempts); the first one a command needs
    # fails it, naming the endpoint, the bucket and the operation.
    deployment = Deployment(tmp_path, server, request_timeout="2s", slow_warning="1s")
    populate(deployment, ["a", "b"])
    server.freeze()
    try:
        for args, stdin in ((("read", "orders"), ""), (("append", "orders"), "c\n")):
            status, stdout, stderr, took = deployment.run(*args, stdin=stdin)
            assert status == 1, (args, stderr)
            assert stdout == ""
            # One bounded operation plus the start-up and close around it (a few seconds on
            # a loaded machine); today's unbounded client took 45-90 s.
            assert took < 15, (args, took, stderr)
            error = stderr.strip().splitlines()[-1]
            assert error.startswith("walstream: error: BackendUnavailable: S3 "), stderr
            assert server.endpoint_url in error and "no success within request_timeout 2 s" in (
                error
            ), error
            assert "bucket 'walstream-" in error, error
            # While waiting, a WARNING said what it waited for.
            assert "WARNING walstream_wal_s3.client: waiting for S3 " in stderr, stderr
    finally:
        server.thaw()
    status, stdout, stderr, _ = deployment.run("read", "orders")
    assert status == 0, stderr
    assert stdout.splitlines() == ["0\ta", "1\tb"]


@pytest.mark.slow
def test_command_deadline_stops_a_command_waiting_on_a_frozen_endpoint(
    tmp_path: Path, server: MotoServer
) -> None:
    # The default request_timeout (30 s) is longer than this deadline: --timeout ends it. The
    # deadline counts from the command's start: it must leave the start-up (imports, opening
    # the deployment; over 3 s on a loaded machine) time to reach the frozen endpoint.
    deadline_s = 10
    deployment = Deployment(tmp_path, server, slow_warning="1s")
    populate(deployment, ["a"])
    server.freeze()
    try:
        status, stdout, stderr, took = deployment.run(
            "--timeout", str(deadline_s), "read", "orders"
        )
    finally:
        server.thaw()
    assert status == 124, stderr
    assert stdout == ""
    # the deadline, plus start-up and the bounded stop
    assert took < deadline_s + 10, (took, stderr)
    assert f"walstream: error: read did not finish within {deadline_s} s (--timeout" in stderr, (
        stderr
    )
    assert f"at {server.endpoint_url} (bucket 'walstream-" in stderr, stderr


@pytest.mark.slow
def test_ctrl_c_stops_a_stuck_append_promptly_and_acknowledged_records_survive(
    tmp_path: Path, server: MotoServer
) -> None:
    deployment = Deployment(tmp_path, server)
    status, _, stderr, _ = deployment.run("streams", "create", "orders")
    assert status == 0, stderr
    append = deployment.start("append", "orders", "--batch", "1")
    assert append.stdin is not None and append.stdout is not None and append.stderr is not None
    acknowledged = [f"record-{number}" for number in range(5)]
    for offset, value in enumerate(acknowledged):
        append.stdin.write(value + "\n")
        append.stdin.flush()
        assert append.stdout.readline() == f"offsets {offset}..{offset}\n"
    server.freeze()
    try:
        # This append cannot be acknowledged: its WAL write waits on the frozen endpoint.
        append.stdin.write("never-acknowledged\n")
        append.stdin.close()
        time.sleep(1.5)
        append.send_signal(signal.SIGINT)
        interrupted = time.monotonic()
        try:
            status = append.wait(timeout=STUCK_LIMIT_S)
        except subprocess.TimeoutExpired:
            append.kill()
            append.wait()
            pytest.fail(f"append ignored Ctrl-C for {STUCK_LIMIT_S} s")
        took = time.monotonic() - interrupted
        stderr = append.stderr.read()
        append.stdout.close()
        append.stderr.close()
    finally:
        server.thaw()
    assert status == 130, stderr
    assert took < 10, (took, stderr)  # the stop grace is 2 + 2 s
    assert "walstream: interrupted; records acknowledged before are durable" in stderr, stderr
    # The next start (endpoint healthy) recovers them from the WAL.
    status, stdout, stderr, _ = deployment.run("read", "orders")
    assert status == 0, stderr
    values = [line.split("\t", 1)[1] for line in stdout.splitlines()]
    assert values[: len(acknowledged)] == acknowledged
    assert values[len(acknowledged) :] in ([], ["never-acknowledged"])


@pytest.mark.slow
def test_append_whose_final_upload_cannot_reach_the_object_store_ends_at_its_deadline(
    tmp_path: Path, server: MotoServer
) -> None:
    # The records are acknowledged (in the S3 WAL), then the endpoint freezes: the final upload
    # retries without end, so only the command's deadline ends it; nothing is lost.
    deployment = Deployment(tmp_path, server, slow_warning="1s")
    status, _, stderr, _ = deployment.run("streams", "create", "orders")
    assert status == 0, stderr
    append = deployment.start("--timeout", "4", "append", "orders", "--batch", "1")
    assert append.stdin is not None and append.stdout is not None and append.stderr is not None
    started = time.monotonic()
    for offset, value in enumerate(["a", "b", "c"]):
        append.stdin.write(value + "\n")
        append.stdin.flush()
        assert append.stdout.readline() == f"offsets {offset}..{offset}\n"
    server.freeze()
    try:
        append.stdin.close()
        try:
            status = append.wait(timeout=STUCK_LIMIT_S)
        except subprocess.TimeoutExpired:
            append.kill()
            append.wait()
            pytest.fail(f"append still running {STUCK_LIMIT_S} s after its input ended")
        took = time.monotonic() - started
        stderr = append.stderr.read()
        append.stdout.close()
        append.stderr.close()
    finally:
        server.thaw()
    assert status == 124, stderr
    assert took < 4 + 10, (took, stderr)
    assert "walstream: error: append did not finish within 4 s (--timeout" in stderr, stderr
    assert "records acknowledged before are durable in the write-ahead log" in stderr, stderr
    status, stdout, stderr, _ = deployment.run("read", "orders")
    assert status == 0, stderr
    assert stdout.splitlines() == ["0\ta", "1\tb", "2\tc"]
