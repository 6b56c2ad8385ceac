"""Core reaches the plugin host only through the ``walstream.host`` entry-point group: without
an entry point there is no host (a ConfigError saying what to install), and whatever object the
entry point names is the host ``walstream.open`` and the CLI use."""

from __future__ import annotations

import importlib.metadata
import textwrap
from pathlib import Path

import pytest
import walstream
from walstream import cli
from walstream.config import host as host_seam
from walstream.errors import ConfigError

MEMORY_DEPLOYMENT = {
    "wal": {"type": "memory"},
    "object_store": {"type": "memory"},
    "metadata": {"type": "memory"},
}


def _entry_point(name: str, value: str) -> importlib.metadata.EntryPoint:
    return importlib.metadata.EntryPoint(name=name, value=value, group=host_seam.HOST_GROUP)


def _install(monkeypatch: pytest.MonkeyPatch, *entry_points: importlib.metadata.EntryPoint) -> None:
    """Make the ``walstream.host`` group hold exactly ``entry_points``."""
    monkeypatch.setattr(host_seam, "_host_entry_points", lambda: list(entry_points))


async def test_without_a_host_entry_point_open_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import walstream_plugins  # importable: only the entry point is missing

    assert walstream_plugins.HOST is not None
    _install(monkeypatch)
    deployment = tmp_path / "x.yaml"
    deployment.write_text("wal: {type: memory}\n")
    with pytest.raises(ConfigError) as refused:
        await walstream.open(str(deployment))
    assert str(refused.value) == (
        "walstream.open(config) assembles backends through the plugin host: "
        "pip install walstream-plugins (or build a walstream.Client from backends directly)"
    )
    with pytest.raises(ConfigError, match="pip install walstream-plugins"):
        await walstream.open(None)


def test_without_a_host_entry_point_a_command_exits_2_with_the_install_hint(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _install(monkeypatch)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["streams", "list"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("walstream: error: ConfigError: ")
    assert "pip install walstream-plugins" in error
    assert not (tmp_path / "walstream-data").exists()


async def test_the_host_is_whatever_the_entry_point_names(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A host of another dist, found only by its entry point, assembles the node."""
    (tmp_path / "other_host.py").write_text(
        textwrap.dedent(
            """
            from walstream_plugins.host import PluginsHost

            class RecordingHost(PluginsHost):
                def __init__(self):
                    self.loaded = []

                def load_deployment(self, source):
                    self.loaded.append(source)
                    return super().load_deployment(source)

            HOST = RecordingHost()
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    _install(monkeypatch, _entry_point("other", "other_host:HOST"))
    async with walstream.open(MEMORY_DEPLOYMENT) as client:
        stream = await client.create_stream("orders")
        ack = await stream.append([walstream.Record(b"one")])
        assert ack.end == 1
    import other_host  # type: ignore[import-not-found]

    assert other_host.HOST.loaded == [MEMORY_DEPLOYMENT]


def test_the_installed_host_is_the_plugins_host() -> None:
    from walstream_plugins.host import HOST

    found = host_seam.find_host()
    assert found is HOST
    assert isinstance(found, host_seam.PluginHost)


def test_two_hosts_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    _install(
        monkeypatch,
        _entry_point("plugins", "walstream_plugins.host:HOST"),
        _entry_point("other", "somewhere_else:HOST"),
    )
    with pytest.raises(ConfigError, match=r"several plugin hosts .* Uninstall all but one"):
        host_seam.find_host()


def test_a_host_that_fails_to_import_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    _install(monkeypatch, _entry_point("broken", "no_such_walstream_host_module:HOST"))
    with pytest.raises(ConfigError) as refused:
        host_seam.find_host()
    message = str(refused.value)
    assert "failed to load (no_such_walstream_host_module:HOST)" in message
    assert "ModuleNotFoundError" in message and "walstream-plugins" in message


def test_an_object_that_is_not_a_host_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    _install(monkeypatch, _entry_point("wrong", "walstream.config.host:HOST_GROUP"))
    with pytest.raises(ConfigError, match="is a str, not a walstream plugin host"):
        host_seam.find_host()
