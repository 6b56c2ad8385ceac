"""What ``walstream`` answers to a mistake: a mistyped command names the closest ones, a mistyped
option gets the usage of the command it was given to (not walstream's), and ``recover`` prints
text."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
from walstream.cli import main


def _fails(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as exited:
        main(list(argv))
    assert exited.value.code == 2
    return capsys.readouterr().err


def test_a_mistyped_command_names_the_closest_command(capsys: pytest.CaptureFixture[str]) -> None:
    err = _fails(capsys, "recorver")
    assert "unknown command 'recorver'; did you mean 'recover'" in err
    assert err.startswith("usage: walstream [")


def test_a_mistyped_subcommand_names_the_closest_one(capsys: pytest.CaptureFixture[str]) -> None:
    err = _fails(capsys, "streams", "lst")
    assert "did you mean 'list'?" in err
    assert err.startswith("usage: walstream streams ")


def test_a_word_close_to_nothing_gets_the_list_without_a_guess(
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = _fails(capsys, "xyzzy")
    assert "unknown command 'xyzzy' (choose from streams, append" in err
    assert "did you mean" not in err


def test_a_mistyped_option_gets_the_usage_of_its_own_command(
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = _fails(capsys, "tail", "orders", "--folow")
    assert err.startswith("usage: walstream tail "), err
    assert "walstream tail: error: unrecognized arguments: --folow" in err
    assert "did you mean '--follow'?" in err


def test_a_mistyped_option_of_a_nested_command_gets_that_command_s_usage(
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = _fails(capsys, "streams", "list", "--prefx", "a")
    assert err.startswith("usage: walstream streams list "), err
    assert "did you mean '--prefix'?" in err


def test_a_mistyped_choice_names_the_closest_choice(capsys: pytest.CaptureFixture[str]) -> None:
    err = _fails(capsys, "read", "orders", "--format", "jsn")
    assert "--format: unknown choice 'jsn'; did you mean 'json'?" in err


@pytest.mark.skipif(
    importlib.util.find_spec("walstream_wal_ebs") is None, reason="needs the embedded ebs WAL"
)
def test_recover_prints_the_wal_as_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["streams", "create", "s"]) == 0
    capsys.readouterr()
    assert main(["recover"]) == 0
    output = capsys.readouterr().out
    lines = output.splitlines()
    wal_path = os.path.join(tmp_path, "walstream-data", "wal.img")
    assert lines[0] == (
        f"node 1: recovered 0 records in 0 batches from its ebs WAL {wal_path} "
        "(0 batches already committed or stale)"
    )
    assert "WAL:" in lines
    assert any(line.split()[:1] == ["capacity_bytes"] for line in lines), output
    assert "{" not in output and "'" not in output, f"a Python dict or repr in:\n{output}"
