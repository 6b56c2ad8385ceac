"""Every ``sh`` and ``python`` block of README.md runs as written.

Each block runs in a fresh temporary folder with the ``walstream`` command of this interpreter's
environment first on PATH: a ``python`` block with this interpreter (under pytest when its first
line says so), an ``sh`` block with ``bash -e -o pipefail`` (a failing command fails the block).
A ``yaml`` block whose first line is ``# FILE`` is written to FILE in the folder of every block
that mentions FILE. Blocks without a language are output samples and are not run.

The only changes the test makes: the ``endpoint_url:`` line of ``wal-s3.yaml`` is rewritten to a
moto server's endpoint (the conformance command reads its ``--config`` file without ``${VAR}``
expansion, so the README shows a literal endpoint), with test credentials in the environment;
and when port 7400 is taken, the HTTP example's ``7400`` is replaced by a free port. A failing block
is reported with its README line, its output and its stderr.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from walstream_conformance.harness.child import free_port

README = Path(__file__).resolve().parents[1] / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.S | re.M)


@dataclass(frozen=True)
class Block:
    lang: str
    line: int  # of the opening fence, 1-based
    text: str

    @property
    def file_name(self) -> str | None:
        """``FILE`` of a first line ``# FILE`` or ``# FILE: ...``."""
        first = self.text.splitlines()[0] if self.text else ""
        found = re.fullmatch(r"# ([\w.-]+\.\w+)(:.*)?", first)
        return found.group(1) if found else None


def readme_blocks() -> list[Block]:
    text = README.read_text()
    return [
        Block(found.group(1), text.count("\n", 0, found.start()) + 1, found.group(2))
        for found in FENCE.finditer(text)
    ]


@dataclass(frozen=True)
class Expect:
    """What a block must do, found by a piece of its text."""

    marker: str
    stdout: tuple[str, ...] = ()
    returncode: int = 0
    timeout: float = 180
    skip: str = ""
    needs_s3: bool = False
    port: bool = field(default=False)


EXPECTED = [
    Expect("make run\nmake test", skip="runs as the CI job itself"),
    Expect("walstream.open(None)", stdout=("[(0, b'first'), (1, b'second')] tail 2",)),
    Expect(
        "stream.tail(start=0)",
        stdout=("0 b'one'\n1 b'two'\ntail 0 b'one'\ntail 1 b'two'\n",),
    ),
    Expect(
        "walstream streams create orders",
        stdout=("created stream 'orders'", "offsets 0..99", "crc ok", "OK (4,000 records)"),
        timeout=300,
    ),
    Expect("--accept-loss", stdout=("nothing to accept",), returncode=2),
    Expect(
        "walstream serve",
        stdout=(
            '"status":"ok"',
            '"end":{"seq_num":2,',
            '{"seq_num_mismatch":2}',
            '"name":"my-basin-1.orders"',
        ),
        port=True,
    ),
    Expect("walstream bench", stdout=("verification: OK (5,000 records read back)",)),
    Expect("SparkSession", stdout=("clicks", "copy"), timeout=420),
    Expect("walstream conformance --wal", stdout=("PASS",), needs_s3=True, timeout=420),
    Expect("class TestMyWal(WalSuite)", timeout=300),
]


def expectation(block: Block) -> Expect:
    found = [expect for expect in EXPECTED if expect.marker in block.text]
    assert len(found) <= 1, f"README.md:{block.line}: several expectations match"
    return found[0] if found else Expect("")


RUNNABLE = [block for block in readme_blocks() if block.lang in ("sh", "python")]
FILES = {block.file_name: block.text for block in readme_blocks() if block.lang == "yaml"}


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    from walstream_wal_s3.testing import MotoServer

    with MotoServer() as server:
        yield server.endpoint_url


def port_taken(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def test_readme_has_the_blocks_this_test_knows() -> None:
    # A renamed or dropped example must not silently stop being checked.
    texts = [block.text for block in RUNNABLE]
    for expect in EXPECTED:
        assert any(expect.marker in text for text in texts), expect.marker
    assert {"deploy.yaml", "wal-s3.yaml"} <= set(FILES)


@pytest.mark.parametrize(
    "block", RUNNABLE, ids=lambda block: f"README.md:{block.line}-{block.lang}"
)
def test_readme_block_runs_as_written(
    block: Block, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    expect = expectation(block)
    if expect.skip:
        pytest.skip(expect.skip)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("WALSTREAM_TOKEN", None)
    text = block.text
    files = {name: content for name, content in FILES.items() if name and name in text}
    if expect.needs_s3:
        endpoint = request.getfixturevalue("s3_endpoint")
        # Only the endpoint line changes: the README's file points at a local S3 store.
        files["wal-s3.yaml"] = re.sub(
            r"^endpoint_url: .*$", f"endpoint_url: {endpoint}", files["wal-s3.yaml"], flags=re.M
        )
        env.update(AWS_ACCESS_KEY_ID="walstream-test", AWS_SECRET_ACCESS_KEY="walstream-test")
        env["AWS_DEFAULT_REGION"] = "us-east-1"
    if expect.port and port_taken(7400):
        text = text.replace("7400", str(free_port()))
    for name, content in files.items():
        (tmp_path / name).write_text(content)
    if block.lang == "sh":
        script = tmp_path / "block.sh"
        command = ["bash", "-e", "-o", "pipefail", str(script)]
    elif block.file_name and block.file_name.startswith("test_"):
        script = tmp_path / block.file_name
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", script.name]
    else:
        script = tmp_path / "block.py"
        command = [sys.executable, str(script)]
    script.write_text(text)
    try:
        done = subprocess.run(
            command,
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=expect.timeout,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(
            f"README.md:{block.line}: the {block.lang} block did not finish within "
            f"{expect.timeout} s\nstdout:\n{exc.stdout!r}\nstderr:\n{exc.stderr!r}"
        )
    where = f"README.md:{block.line}: the {block.lang} block"
    report = f"\nstdout:\n{done.stdout[-4000:]}\nstderr:\n{done.stderr[-4000:]}"
    assert done.returncode == expect.returncode, f"{where} exited {done.returncode}{report}"
    for wanted in expect.stdout:
        assert wanted in done.stdout, f"{where} did not print {wanted!r}{report}"


def test_python_in_ten_lines_runs_again_on_the_same_data(tmp_path: Path) -> None:
    (block,) = [block for block in RUNNABLE if "walstream.open(None)" in block.text]
    script = tmp_path / "example.py"
    script.write_text(block.text)
    outputs = []
    for _ in range(2):  # a second run finds the stream it created
        done = subprocess.run(
            [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout.strip())
    assert outputs == [
        "[(0, b'first'), (1, b'second')] tail 2",
        "[(2, b'first'), (3, b'second')] tail 4",
    ]
