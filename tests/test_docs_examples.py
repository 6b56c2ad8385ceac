"""Every code block of README.md and of the documentation site (docs/**/*.md) runs as written.

The conventions are documented for authors in docs/contributing/docs.md; in short:

* ``sh`` runs with ``bash -e -o pipefail``; ``console`` likewise, where only lines starting with
  ``$ `` are commands (a line ending in ``\\`` continues on the next) and the other lines are
  the expected output; ``python`` runs with this interpreter (under pytest when its first line
  is ``# test_NAME.py``); ``ts`` is transpiled by clients/node's ``typescript`` and run under
  Node with clients/node's modules; ``yaml`` is loaded through the deployment loader of
  walstream_plugins (only parsed after ``<!-- yaml: not-a-deployment -->``) and, when its first
  line is ``# FILE``, saved as FILE for the page's later blocks; ``json`` and ``toml`` are
  parsed; ``text`` never runs.
* HTML comments on the lines right before a fence are markers: ``not-run: REASON`` (skipped,
  shown with its reason; a skip without one fails), ``background: ready=TEXT`` (started, run
  until its output shows TEXT, left running for the page's later blocks, then stopped: stdin
  closed, SIGINT; it must exit 0 or by the interrupt), ``exit: N`` (the exit status expected),
  ``needs: s3`` / ``needs: postgres`` (a moto S3 server / a throwaway PostgreSQL, in the
  environment as ``WALSTREAM_S3_ENDPOINT`` with test credentials / ``WALSTREAM_PG_DSN``),
  ``timeout: SECONDS``, and before a ``text`` block ``expect-output`` (its lines must appear in
  the previous runnable block's output).
* Expected output is matched line by line, in order, lines in between allowed; ``...`` inside a
  line matches any text; runs of whitespace compare equal. stdout and stderr are read together,
  as a terminal shows them.
* The blocks of one page run in order in one fresh temporary folder (so a page's files and its
  ``./walstream-data`` carry from block to block), with this environment's ``walstream`` first
  on PATH, ``WALSTREAM_TOKEN`` unset, and every ``7400`` of the page replaced by a free port.

A page is one test; a failure names the page, the block's line, its output and its stderr.
"""

from __future__ import annotations

import configparser
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest
import yaml
from walstream_conformance.harness.child import free_port

ROOT = Path(__file__).resolve().parents[1]
NODE_PROJECT = ROOT / "clients" / "node"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

RUNNABLE = {"sh", "bash", "console", "python", "ts", "yaml", "json", "toml", "ini"}
NEVER_RUN = {"text"}
MARKERS = {"not-run", "background", "exit", "needs", "timeout", "expect-output", "yaml"}
SERVICES = {"s3", "postgres"}
DEFAULT_TIMEOUT_S = 300.0
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`\n]*)$")
MARKER = re.compile(r"^\s*<!--\s*(?P<key>[\w-]+)\s*(?::\s*(?P<value>.*?))?\s*-->\s*$")
SNIPPET = re.compile(r'^--8<--\s+"(?P<path>[^"]+)"\s*$', re.M)
UNSET_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class DocsError(Exception):
    """A block the harness cannot understand: the page must be fixed."""


@dataclass
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    markers: dict[str, str] = field(default_factory=dict)

    @property
    def where(self) -> str:
        page = self.page.relative_to(ROOT) if self.page.is_relative_to(ROOT) else self.page
        return f"{page}:{self.line}"

    @property
    def file_name(self) -> str | None:
        """``FILE`` of a first line ``# FILE`` or ``# FILE: ...``."""
        first = self.text.splitlines()[0] if self.text else ""
        found = re.fullmatch(r"# ([\w.-]+\.\w+)(:.*)?", first)
        return found.group(1) if found else None


def parse_page(page: Path) -> list[Block]:
    """The fenced code blocks of ``page`` with their markers; raises :class:`DocsError` for a
    block without a language, an unknown language or marker, or a marker without its value."""
    lines = page.read_text(encoding="utf-8").split("\n")
    blocks: list[Block] = []
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        indent, fence = opening.group("indent"), opening.group("fence")
        lang = opening.group("info").strip().split(" ")[0].split("{")[0].strip()
        body: list[str] = []
        end = index + 1
        while end < len(lines):
            closing = lines[end].strip()
            if closing.startswith(fence) and set(closing) == {fence[0]}:
                break
            body.append(lines[end][len(indent) :] if lines[end].startswith(indent) else lines[end])
            end += 1
        block = Block(page, index + 1, lang, "\n".join(body) + "\n", markers_before(lines, index))
        check_block(block)
        blocks.append(block)
        index = end + 1
    return blocks


def markers_before(lines: list[str], index: int) -> dict[str, str]:
    markers: dict[str, str] = {}
    above = index - 1
    while above >= 0 and (not lines[above].strip() or MARKER.match(lines[above])):
        found = MARKER.match(lines[above])
        if found is not None:
            markers.setdefault(found.group("key"), found.group("value") or "")
        elif markers:
            break  # a blank line above the markers ends them
        above -= 1
    return markers


def check_block(block: Block) -> None:
    where = block.where
    unknown = set(block.markers) - MARKERS
    if unknown:
        raise DocsError(f"{where}: unknown marker(s) {sorted(unknown)}; known: {sorted(MARKERS)}")
    if "not-run" in block.markers and not block.markers["not-run"].strip():
        raise DocsError(f"{where}: <!-- not-run: REASON --> needs a reason")
    if not block.lang:
        raise DocsError(f"{where}: a code block needs a language (text for output samples)")
    if "not-run" in block.markers:
        return
    if block.lang not in RUNNABLE | NEVER_RUN:
        raise DocsError(
            f"{where}: blocks of language {block.lang!r} cannot be run; use one of "
            f"{sorted(RUNNABLE | NEVER_RUN)}, or mark it <!-- not-run: REASON -->"
        )
    if "expect-output" in block.markers and block.lang != "text":
        raise DocsError(f"{where}: expect-output goes before a text block")
    background = block.markers.get("background")
    if background is not None and not background.startswith("ready="):
        raise DocsError(f"{where}: write <!-- background: ready=TEXT -->")
    if background is not None and block.lang not in ("sh", "bash", "console"):
        raise DocsError(f"{where}: only sh and console blocks run in the background")
    for service in filter(None, block.markers.get("needs", "").replace(",", " ").split()):
        if service not in SERVICES:
            raise DocsError(f"{where}: needs {service!r}: known services {sorted(SERVICES)}")
    if "yaml" in block.markers and block.markers["yaml"] != "not-a-deployment":
        raise DocsError(f"{where}: the yaml marker is <!-- yaml: not-a-deployment -->")


def all_blocks() -> list[Block]:
    return [block for page in PAGES for block in parsed(page)]


def parsed(page: Path) -> list[Block]:
    """The page's blocks, or none when it has a block the harness cannot understand (then
    ``test_every_block_of_the_page_is_understood`` fails for it, naming the block)."""
    try:
        return parse_page(page)
    except DocsError:
        return []


# -- output matching --------------------------------------------------------------------------


def _normal(line: str) -> str:
    return " ".join(line.split())


def missing_output(expected: str, actual: str) -> str | None:
    """The first expected line not found, in order, in ``actual`` (None: all found)."""
    lines = [_normal(line) for line in actual.splitlines()]
    position = 0
    for wanted in expected.splitlines():
        wanted = _normal(wanted)
        if not wanted or wanted == "...":
            continue
        pattern = re.compile(".*?".join(re.escape(part) for part in wanted.split("...")))
        while position < len(lines) and not pattern.fullmatch(lines[position]):
            position += 1
        if position == len(lines):
            return wanted
        position += 1
    return None


def console_script(text: str) -> tuple[str, str]:
    """The commands (a script) and the expected output of a console block."""
    commands: list[str] = []
    expected: list[str] = []
    continuing = False
    for line in text.splitlines():
        if continuing:
            commands.append(line)
            continuing = line.endswith("\\")
        elif line.startswith("$ "):
            commands.append(line[2:])
            continuing = line.endswith("\\")
        else:
            expected.append(line)
    return "\n".join(commands) + "\n", "\n".join(expected)


# -- services ---------------------------------------------------------------------------------


class Services:
    """Servers blocks ask for with ``needs:``, started once for the module."""

    def __init__(self) -> None:
        self._stack: list[Any] = []
        self.environ: dict[str, dict[str, str]] = {}

    def environment(self, names: set[str]) -> dict[str, str]:
        env: dict[str, str] = {}
        for name in sorted(names):
            if name not in self.environ:
                self.environ[name] = self._start(name)
            env.update(self.environ[name])
        return env

    def _start(self, name: str) -> dict[str, str]:
        if name == "s3":
            from walstream_wal_s3.testing import MotoServer

            server = MotoServer().__enter__()
            self._stack.append(server)
            return {
                "WALSTREAM_S3_ENDPOINT": server.endpoint_url,
                "AWS_ACCESS_KEY_ID": "walstream-test",
                "AWS_SECRET_ACCESS_KEY": "walstream-test",
                "AWS_DEFAULT_REGION": "us-east-1",
            }
        from walstream_metadata_postgres.testing.server import PostgresServer

        postgres = PostgresServer().__enter__()
        self._stack.append(postgres)
        return {"WALSTREAM_PG_DSN": postgres.dsn}

    def close(self) -> None:
        while self._stack:
            self._stack.pop().__exit__(None, None, None)


@pytest.fixture(scope="module")
def services() -> Iterator[Services]:
    started = Services()
    try:
        yield started
    finally:
        started.close()


# -- running a page ---------------------------------------------------------------------------


@dataclass
class Background:
    block: Block
    process: subprocess.Popen[bytes]
    output: Path
    log: IO[bytes]

    def text(self) -> str:
        return self.output.read_text(errors="replace")


class PageRun:
    """The blocks of one page, run in order in one folder."""

    def __init__(self, page: Path, folder: Path, services: Services) -> None:
        self.page = page
        self.folder = folder
        self.services = services
        self.port = str(free_port())
        self.env = {
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "PYTHONUNBUFFERED": "1",
        }
        self.env.pop("WALSTREAM_TOKEN", None)
        self.backgrounds: list[Background] = []
        self.last_output = ""
        self.last_block: Block | None = None
        self.counter = 0

    def localize(self, text: str) -> str:
        text = SNIPPET.sub(lambda found: (ROOT / found.group("path")).read_text(), text)
        return text.replace("7400", self.port)

    def environment(self, block: Block) -> dict[str, str]:
        needs = set(filter(None, block.markers.get("needs", "").replace(",", " ").split()))
        return {**self.env, **self.services.environment(needs)}

    def run(self, blocks: list[Block]) -> None:
        try:
            for block in blocks:
                if "not-run" in block.markers:
                    continue
                if block.lang == "text":
                    if "expect-output" in block.markers:
                        self.check_expected(block)
                    continue
                self.run_block(block)
        finally:
            self.stop_backgrounds()

    def check_expected(self, block: Block) -> None:
        if self.last_block is None:
            pytest.fail(f"{block.where}: expect-output follows no runnable block")
        output = self.last_output
        for background in self.backgrounds:
            if background.block is self.last_block:
                output = background.text()
        missing = missing_output(self.localize(block.text), output)
        if missing is not None:
            pytest.fail(
                f"{block.where}: the output of {self.last_block.where} lacks {missing!r}\n"
                f"output:\n{output[-4000:]}"
            )

    def run_block(self, block: Block) -> None:
        text = self.localize(block.text)
        if block.lang in ("yaml", "json", "toml", "ini"):
            self.check_data(block, text)
            return
        expected = ""
        if block.lang == "console":
            text, expected = console_script(text)
        self.counter += 1
        command = self.command(block, text, self.counter)
        env = self.environment(block)
        timeout_s = float(block.markers.get("timeout", DEFAULT_TIMEOUT_S))
        if "background" in block.markers:
            self.start_background(block, command, env, timeout_s)
            return
        try:
            done = subprocess.run(
                command,
                cwd=self.folder,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                timeout=timeout_s,
                start_new_session=True,
            )
        except subprocess.TimeoutExpired as exc:
            output = (exc.stdout or b"").decode(errors="replace")
            pytest.fail(f"{block.where}: did not finish within {timeout_s:g} s\n{output[-4000:]}")
        output = done.stdout.decode(errors="replace")
        self.last_output, self.last_block = output, block
        wanted = int(block.markers.get("exit", "0"))
        if done.returncode != wanted:
            pytest.fail(
                f"{block.where}: the {block.lang} block exited {done.returncode}, "
                f"expected {wanted}\noutput:\n{output[-4000:]}"
            )
        missing = missing_output(expected, output)
        if missing is not None:
            pytest.fail(f"{block.where}: the output lacks {missing!r}\noutput:\n{output[-4000:]}")

    def command(self, block: Block, text: str, number: int) -> list[str]:
        if block.lang in ("sh", "bash", "console"):
            script = self.folder / f".block-{number}.sh"
            script.write_text(text)
            return ["bash", "-e", "-o", "pipefail", str(script)]
        if block.lang == "ts":
            modules = self.folder / "node_modules"
            if not modules.exists():
                modules.symlink_to(NODE_PROJECT / "node_modules", target_is_directory=True)
            script = self.folder / f".block-{number}.ts"
            script.write_text(text)
            return ["node", str(NODE_PROJECT / "run-ts.mjs"), str(script)]
        if block.file_name and block.file_name.startswith("test_"):
            script = self.folder / block.file_name
            script.write_text(text)
            return [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", script.name]
        script = self.folder / f".block-{number}.py"
        script.write_text(text)
        return [sys.executable, str(script)]

    def check_data(self, block: Block, text: str) -> None:
        name = block.file_name
        if name is not None:
            (self.folder / name).write_text(text)
        try:
            if block.lang == "json":
                json.loads(text)
            elif block.lang == "toml":
                tomllib.loads(text)
            elif block.lang == "ini":
                configparser.ConfigParser().read_string(text)
            elif block.markers.get("yaml") == "not-a-deployment":
                yaml.safe_load(text)
            else:
                self.load_deployment(block, text, name)
        except Exception as error:
            pytest.fail(f"{block.where}: the {block.lang} block does not load: {error}")

    def load_deployment(self, block: Block, text: str, name: str | None) -> None:
        """Load a YAML block as walstream does; variables the page leaves to the reader
        (``${PGPASSWORD}``) get a placeholder value."""
        from walstream_plugins.deployment import load_deployment

        environ = self.environment(block)
        placeholders = {
            variable: "docs-example"
            for variable in UNSET_VARIABLE.findall(text)
            if variable not in environ
        }
        saved = {key: os.environ.get(key) for key in {**environ, **placeholders}}
        os.environ.update({**environ, **placeholders})
        try:
            path = self.folder / (name or f".block-{block.line}.yaml")
            if name is None:
                path.write_text(text)
            load_deployment(path)
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    def start_background(
        self, block: Block, command: list[str], env: dict[str, str], timeout_s: float
    ) -> None:
        ready = block.markers["background"].removeprefix("ready=").strip()
        output = self.folder / f".background-{block.line}.log"
        log = output.open("wb")
        process = subprocess.Popen(
            command,
            cwd=self.folder,
            env=env,
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        background = Background(block, process, output, log)
        self.backgrounds.append(background)
        self.last_block = block
        deadline = time.monotonic() + timeout_s
        while ready not in background.text():
            if process.poll() is not None:
                pytest.fail(
                    f"{block.where}: the background block exited {process.returncode} before "
                    f"printing {ready!r}\noutput:\n{background.text()[-4000:]}"
                )
            if time.monotonic() > deadline:
                pytest.fail(
                    f"{block.where}: no {ready!r} within {timeout_s:g} s\n"
                    f"output:\n{background.text()[-4000:]}"
                )
            time.sleep(0.1)

    def stop_backgrounds(self) -> None:
        failures = []
        for background in reversed(self.backgrounds):
            process = background.process
            if process.stdin is not None:
                process.stdin.close()  # Ctrl-D
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGINT)  # Ctrl-C
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
                    failures.append(f"{background.block.where}: did not stop on Ctrl-C")
            background.log.close()
            if process.returncode not in (0, 130, -signal.SIGINT):
                failures.append(
                    f"{background.block.where}: exited {process.returncode} when stopped\n"
                    f"{background.text()[-2000:]}"
                )
        self.backgrounds.clear()
        if failures:
            pytest.fail("\n".join(failures))


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


# -- tests ------------------------------------------------------------------------------------


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_block_of_the_page_is_understood(page: Path) -> None:
    # Fast: a block without a language, with an unknown one or an unknown marker fails here,
    # before anything runs.
    parse_page(page)


@pytest.mark.slow
@pytest.mark.parametrize(
    "page",
    [page for page in PAGES if any(b.lang not in NEVER_RUN for b in parsed(page))],
    ids=page_id,
)
def test_the_blocks_of_the_page_run_as_written(
    page: Path, tmp_path: Path, services: Services
) -> None:
    PageRun(page, tmp_path, services).run(parse_page(page))
    # A page that passed leaves nothing to look at, and its deployment's WAL file is
    # preallocated (512 MiB by default): the suite's pages together would hold gigabytes
    # until the session ends.
    for child in tmp_path.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


@pytest.mark.parametrize(
    "block",
    [block for block in all_blocks() if "not-run" in block.markers],
    ids=lambda block: block.where,
)
def test_a_block_that_does_not_run_says_why(block: Block) -> None:
    pytest.skip(f"{block.where}: not run: {block.markers['not-run']}")


def test_the_docs_use_every_convention_this_harness_offers() -> None:
    # A convention nobody uses is untested; one that vanished from the pages would leave its
    # code here unexercised.
    blocks = all_blocks()
    langs = {block.lang for block in blocks}
    assert {"sh", "console", "python", "ts", "yaml", "text"} <= langs, langs
    used = {key for block in blocks for key in block.markers}
    assert MARKERS <= used, MARKERS - used
    needs = {block.markers["needs"] for block in blocks if "needs" in block.markers}
    assert "s3" in needs


def test_markers_and_matching(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "text\n\n<!-- exit: 2 -->\n<!-- timeout: 5 -->\n```sh\nexit 2\n```\n\n"
        "<!-- not-run: because -->\n```rust\nfn main() {}\n```\n"
    )
    first, second = parse_page(page)
    assert first.markers == {"exit": "2", "timeout": "5"} and first.line == 5
    assert second.markers == {"not-run": "because"}
    for bad in (
        "```\nplain\n```\n",
        "```rust\nfn main() {}\n```\n",
        "<!-- not-run: -->\n```sh\ntrue\n```\n",
        "<!-- nonsense -->\n```sh\ntrue\n```\n",
        "<!-- background -->\n```sh\ntrue\n```\n",
    ):
        page.write_text(bad)
        with pytest.raises(DocsError):
            parse_page(page)
    assert missing_output("a ... c\n...\nlast", "x\na b c\ny\nlast\n") is None
    assert missing_output("last\na b c", "a b c\nlast\n") == "a b c"  # order matters
    assert missing_output("0 first", "0\tfirst") is None
    assert console_script("$ echo a \\\n  b\na b\n$ true\n") == ("echo a \\\n  b\ntrue\n", "a b")


@pytest.mark.slow
def test_python_in_ten_lines_runs_again_on_the_same_data(tmp_path: Path) -> None:
    (block,) = [
        block
        for block in parse_page(ROOT / "README.md")
        if block.lang == "python" and "walstream.open(None)" in block.text
    ]
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
