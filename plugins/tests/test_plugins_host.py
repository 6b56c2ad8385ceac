"""The plugin host as core sees it: the object of the ``walstream.host`` entry point, and the
engine sections its YAML loader checks against core's schemas."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from walstream.config import EngineConfig, Option
from walstream.config.engine import APPEND_TIMEOUT, ENGINE_SECTIONS
from walstream.config.host import PluginHost, find_host
from walstream.errors import ConfigError
from walstream_plugins import HOST, Deployment, default_deployment, load_deployment
from walstream_plugins.deployment import TOP_LEVEL_KEYS

MEMORY = {"wal": {"type": "memory"}, "object_store": {"type": "memory"}, "metadata": "memory"}


def test_the_entry_point_names_this_host() -> None:
    assert find_host() is HOST
    assert isinstance(HOST, PluginHost)


def test_host_loads_a_path_a_mapping_and_the_embedded_default(tmp_path: Path) -> None:
    path = tmp_path / "deploy.yaml"
    path.write_text("wal: memory\nobject_store: memory\nmetadata: memory\nnode: {id: 4}\n")
    from_file = HOST.load_deployment(str(path))
    assert isinstance(from_file, Deployment)
    assert from_file.source == path and from_file.node_id == 4
    assert HOST.load_deployment(from_file) is from_file
    assert HOST.load_deployment(MEMORY).engine_config.node_id == 1
    embedded = HOST.load_deployment(None)
    assert embedded.sections["wal"]["type"] == "ebs"
    assert embedded.base_dir == (Path.cwd() / "walstream-data").absolute()


def test_host_lists_and_loads_backends() -> None:
    listed = {(backend.kind, backend.name) for backend in HOST.installed_backends()}
    assert {("wal", "memory"), ("object_store", "local"), ("metadata", "sqlite")} <= listed
    assert HOST.load_factory("wal", "memory").name == "memory"
    with pytest.raises(ConfigError, match="unknown WAL 'memroy'"):
        HOST.load_factory("wal", "memroy")


def test_metrics_renderer_follows_the_metrics_extension() -> None:
    with_metrics = HOST.make_hooks()
    render = HOST.metrics_renderer(with_metrics)
    assert render is not None and "wal_appends_total" in render()
    assert HOST.metrics_renderer(HOST.make_hooks(disabled=("metrics",))) is None


def _names(options: tuple[Option, ...]) -> list[str]:
    return [option.name for option in options]


def test_engine_sections_are_checked_against_cores_schemas() -> None:
    deployment = load_deployment(MEMORY)
    for section, options in ENGINE_SECTIONS.items():
        assert section in TOP_LEVEL_KEYS
        assert list(deployment.sections[section]) == _names(options)
    with pytest.raises(ConfigError) as refused:
        load_deployment({**MEMORY, "upload": {"max_byte": 1}})
    message = str(refused.value)
    assert "upload.max_byte: unknown key. Did you mean 'max_bytes'?" in message
    assert f"Accepted keys: {', '.join(_names(ENGINE_SECTIONS['upload']))}" in message
    assert APPEND_TIMEOUT.name in TOP_LEVEL_KEYS


def test_schema_defaults_are_the_engine_defaults() -> None:
    """A deployment that sets nothing runs the engine exactly as ``EngineConfig()`` would."""
    assert load_deployment(MEMORY).engine_config == EngineConfig()
    assert default_deployment().engine_config == EngineConfig()
    tuned = load_deployment({**MEMORY, "upload": {"max_interval": "2s"}, "append_timeout": "5s"})
    assert tuned.engine_config == dataclasses.replace(
        EngineConfig(),
        upload=dataclasses.replace(EngineConfig().upload, max_interval_s=2.0),
        append_timeout_s=5.0,
    )
