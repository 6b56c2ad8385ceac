"""Extra ``walstream`` commands come from the ``walstream.cli`` entry-point group: core runs
whatever the entry point names, lists a documented command with its install hint when its
distribution is missing, and never lets an extension replace one of its own commands."""

from __future__ import annotations

import importlib.metadata
import textwrap
from pathlib import Path

import pytest
from walstream import cli
from walstream.cli import extensions

FAKE_COMMANDS = """
import argparse

CALLS = []


class Command:
    description = "a stand-in for the conformance suite"

    def add_arguments(self, parser):
        parser.add_argument("--wal")
        parser.add_argument("--config", "-c", default=argparse.SUPPRESS)

    def run(self, args):
        CALLS.append(vars(args))
        return 7


COMMAND = Command()
"""


def _entry_point(name: str, value: str) -> importlib.metadata.EntryPoint:
    return importlib.metadata.EntryPoint(name=name, value=value, group=extensions.COMMANDS_GROUP)


def _install(monkeypatch: pytest.MonkeyPatch, *entry_points: importlib.metadata.EntryPoint) -> None:
    """Make the ``walstream.cli`` group hold exactly ``entry_points``."""
    monkeypatch.setattr(extensions, "_entry_points", lambda: list(entry_points))


@pytest.fixture
def fake_commands(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> object:
    (tmp_path / "fake_walstream_commands.py").write_text(textwrap.dedent(FAKE_COMMANDS))
    monkeypatch.syspath_prepend(str(tmp_path))
    import fake_walstream_commands  # type: ignore[import-not-found]

    fake_walstream_commands.CALLS.clear()
    return fake_walstream_commands


def test_conformance_is_registered_by_the_conformance_dist() -> None:
    registered = {
        entry_point.name: entry_point
        for entry_point in importlib.metadata.entry_points(group="walstream.cli")
    }
    conformance = registered["conformance"]
    assert conformance.value == "walstream_conformance.cli:COMMAND"
    assert conformance.dist is not None
    assert conformance.dist.metadata["Name"] == "walstream-conformance"


def test_without_the_entry_point_conformance_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _install(monkeypatch)
    monkeypatch.setenv("COLUMNS", "250")  # one line per command in --help
    assert cli.main(["conformance", "--wal", "memory"]) == 2
    assert capsys.readouterr().err == (
        "walstream: error: the conformance suite is not installed; "
        "run: pip install walstream-conformance\n"
    )
    with pytest.raises(SystemExit) as shown:
        cli.main(["--help"])
    assert shown.value.code == 0
    listing = capsys.readouterr().out
    assert "run the conformance suite (needs walstream-conformance)" in listing


def test_conformance_runs_whatever_its_entry_point_names(
    monkeypatch: pytest.MonkeyPatch, fake_commands: object
) -> None:
    _install(monkeypatch, _entry_point("conformance", "fake_walstream_commands:COMMAND"))
    assert cli.main(["-c", "deploy.yaml", "-v", "conformance", "--wal", "memory"]) == 7
    assert fake_commands.CALLS == [  # type: ignore[attr-defined]
        {"wal": "memory", "config": "deploy.yaml", "verbose": 1}
    ]


def test_another_dist_adds_a_command_but_cannot_replace_a_builtin(
    monkeypatch: pytest.MonkeyPatch,
    fake_commands: object,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _install(
        monkeypatch,
        _entry_point("hello", "fake_walstream_commands:COMMAND"),
        _entry_point("read", "fake_walstream_commands:COMMAND"),
    )
    monkeypatch.setenv("COLUMNS", "250")  # one line per command in --help
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    listing = capsys.readouterr().out
    assert "hello" in listing and "'walstream hello --help' lists its options" in listing
    assert cli.main(["hello", "--wal", "x"]) == 7
    with pytest.raises(SystemExit) as usage:
        cli.main(["read", "--wal", "x"])  # still walstream's read: it wants a stream
    assert usage.value.code == 2
    assert len(fake_commands.CALLS) == 1  # type: ignore[attr-defined]


def test_an_extension_that_fails_to_load_is_named(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _install(monkeypatch, _entry_point("conformance", "no_such_walstream_module:COMMAND"))
    assert cli.main(["conformance"]) == 2
    error = capsys.readouterr().err
    assert "the command 'conformance' from an unknown distribution failed to load" in error
    assert "ModuleNotFoundError" in error and "upgrade walstream-conformance" in error
