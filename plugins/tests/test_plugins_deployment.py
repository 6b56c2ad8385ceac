"""YAML deployments: the example of docs/architecture/plugins.md, path resolution, ${ENV}, sizes and durations, and
one clear ConfigError per mistake."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from walstream.config import BackendFactory, Option
from walstream.errors import ConfigError
from walstream.objects.memory import MemoryObjectStore
from walstream.wal.memory import MemoryWal
from walstream_plugins import (
    Deployment,
    default_deployment,
    load_deployment,
    register_factory,
)
from walstream_plugins.deployment import EMBEDDED_DEFAULT
from walstream_plugins.registry import installed_names

WriteYaml = Callable[..., Path]  # the write_yaml fixture (conftest.py)

DESIGN_EXAMPLE = """\
    node: {id: 1}
    wal: {type: memory, name: design-example, capacity: 1GiB}
    object_store: {type: local, root: ./walstream-data/objects}
    metadata: {type: sqlite, path: ./walstream-data/meta.db}
    upload: {max_bytes: 32MiB, max_interval: 250ms}
"""

MINIMAL = {
    "wal": {"type": "memory"},
    "object_store": {"type": "memory"},
    "metadata": {"type": "memory"},
}


def config_error(source: Any, **kwargs: Any) -> str:
    with pytest.raises(ConfigError) as caught:
        load_deployment(source, **kwargs)
    return str(caught.value)


def with_section(**sections: Any) -> dict[str, Any]:
    return {**MINIMAL, **sections}


def test_design_example_loads_with_relative_paths_resolved_against_the_file(
    write_yaml: WriteYaml, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_yaml(DESIGN_EXAMPLE, "site/deploy.yaml")
    monkeypatch.chdir(tmp_path)  # not the file's folder: resolution must not use the cwd
    deployment = load_deployment(path)
    site = tmp_path / "site"
    assert deployment.source == path
    assert deployment.base_dir == site
    assert deployment.node_id == 1
    assert deployment.sections["wal"]["capacity"] == 1 << 30
    assert deployment.sections["object_store"]["root"] == site / "walstream-data/objects"
    assert deployment.sections["metadata"]["path"] == site / "walstream-data/meta.db"
    assert deployment.engine_config.upload.max_bytes == 32 << 20
    assert deployment.engine_config.upload.max_interval_s == pytest.approx(0.25)


async def test_design_example_builds_backends_that_work(write_yaml: WriteYaml) -> None:
    deployment = load_deployment(write_yaml(DESIGN_EXAMPLE))
    backends = deployment.build_backends()
    assert isinstance(backends.wal, MemoryWal)
    assert backends.wal.capabilities.capacity_bytes == 1 << 30
    await backends.objects.put("probe/one", b"payload")
    assert await backends.objects.get("probe/one") == b"payload"
    root = deployment.sections["object_store"]["root"]
    assert any(path.is_file() for path in Path(root).rglob("*"))


def test_every_engine_section_maps_onto_engine_config(write_yaml: WriteYaml) -> None:
    deployment = load_deployment(
        write_yaml("""\
        node: {id: 0}
        wal: {type: memory}
        object_store: {type: memory}
        metadata: {type: memory}
        cache: {log_cache_bytes: 64MiB, block_cache_bytes: 1GB, readahead_min_bytes: 256KiB,
                readahead_max_bytes: 16MiB}
        upload: {max_bytes: 8MiB, max_interval: 2s, split_bytes: 4MiB, max_concurrency: 8,
                 prepare_ttl: 5m}
        compaction: {enabled: false, interval: 1.5, min_objects: 6, small_object_bytes: 2MiB,
                     max_object_bytes: 64MiB}
        append_timeout: 750ms
        server: {listen: "[::1]:8080", token: s3cret}
        hooks: {disable: [metrics]}
    """)
    )
    config = deployment.engine_config
    assert config.node_id == 0
    assert (config.cache.log_cache_bytes, config.cache.block_cache_bytes) == (64 << 20, 10**9)
    assert (config.cache.readahead_min_bytes, config.cache.readahead_max_bytes) == (
        256 << 10,
        16 << 20,
    )
    assert config.upload.max_bytes == 8 << 20
    assert config.upload.max_interval_s == 2.0
    assert config.upload.split_bytes == 4 << 20
    assert config.upload.max_concurrency == 8
    assert config.upload.prepare_ttl_s == 300.0
    assert config.compaction.enabled is False
    assert config.compaction.interval_s == 1.5
    assert config.compaction.min_objects == 6
    assert config.compaction.small_object_bytes == 2 << 20
    assert config.compaction.max_object_bytes == 64 << 20
    assert config.append_timeout_s == pytest.approx(0.75)
    assert deployment.sections["server"] == {
        "listen": "[::1]:8080",
        "token": "s3cret",
        "header_timeout": 15.0,
        "body_timeout": 60.0,
        "max_connections": 512,
        "max_connections_per_address": 64,
        "max_long_polls": 256,
        "max_long_polls_per_address": 64,
        "send_timeout": 30.0,
        "max_connection_output": 4 << 20,
        "max_output": 64 << 20,
        "max_resets_per_connection": 100,
        "max_resets_per_address": 400,
        "max_control_frames": 1000,
        "tls": None,
        "http_stack": None,
    }
    assert deployment.disabled_hooks == ("metrics",)


def test_omitted_sections_take_the_engine_defaults() -> None:
    deployment = load_deployment(MINIMAL)
    assert deployment.engine_config.cache == type(deployment.engine_config.cache)()
    assert deployment.engine_config.upload == type(deployment.engine_config.upload)()
    assert deployment.engine_config.append_timeout_s == 30.0
    assert deployment.node_id == 1
    assert deployment.source is None
    assert deployment.base_dir == Path.cwd()


def test_env_expansion_with_and_without_defaults(write_yaml: WriteYaml) -> None:
    path = write_yaml("""\
        node: {id: "${NODE_ID}"}
        wal: {type: memory, capacity: "${WAL_CAPACITY:-2MiB}"}
        object_store: {type: local, root: "${DATA_DIR}/objects"}
        metadata: {type: memory, name: "meta-${UNSET_VAR:-default}"}
        server: {token: "${WALSTREAM_TOKEN}", listen: "127.0.0.1:${PORT:-7400}"}
        upload: {max_interval: "${EMPTY:-100ms}"}
    """)
    environ = {
        "NODE_ID": "7",
        "DATA_DIR": "/srv/walstream",
        "WALSTREAM_TOKEN": "tok-$1",
        "EMPTY": "",
    }
    deployment = load_deployment(path, environ=environ)
    assert deployment.node_id == 7
    assert deployment.sections["wal"]["capacity"] == 2 << 20
    assert deployment.sections["object_store"]["root"] == Path("/srv/walstream/objects")
    assert deployment.sections["metadata"]["name"] == "meta-default"
    assert deployment.sections["server"]["token"] == "tok-$1"
    assert deployment.sections["server"]["listen"] == "127.0.0.1:7400"
    assert deployment.engine_config.upload.max_interval_s == pytest.approx(0.1)
    assert deployment.describe()["sections"]["server"]["token"] == "***"


def test_env_expansion_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WALSTREAM_TEST_VOLUME", "from-env")
    deployment = load_deployment(
        with_section(wal={"type": "memory", "name": "${WALSTREAM_TEST_VOLUME}"})
    )
    assert deployment.sections["wal"]["name"] == "from-env"


def test_missing_env_variable_names_key_and_variable() -> None:
    message = config_error(with_section(server={"token": "Bearer ${WALSTREAM_TOKEN}"}), environ={})
    assert message.startswith("server.token: environment variable WALSTREAM_TOKEN is not set")


def test_escaped_and_malformed_references() -> None:
    deployment = load_deployment(with_section(server={"token": "a$${literal}"}), environ={})
    assert deployment.sections["server"]["token"] == "a${literal}"
    message = config_error(with_section(server={"token": "${not closed"}), environ={})
    assert message.startswith("server.token: malformed variable reference")


def test_misspelled_backend_option_names_key_and_suggests(write_yaml: WriteYaml) -> None:
    path = write_yaml("""\
        wal: {type: memory, capcity: 1GiB}
        object_store: {type: memory}
        metadata: {type: memory}
    """)
    message = config_error(path)
    assert "wal.capcity" in message
    assert "did you mean 'capacity'?" in message


def test_misspelled_engine_key_names_key_and_accepted_keys() -> None:
    message = config_error(with_section(upload={"max_intervall": "1s"}))
    assert message.startswith("upload.max_intervall: unknown key. Did you mean 'max_interval'?")
    assert "max_bytes" in message and "prepare_ttl" in message


def test_unknown_top_level_key(write_yaml: WriteYaml) -> None:
    path = write_yaml("""\
        wal: {type: memory}
        object_store: {type: memory}
        metadata: {type: memory}
        uploads: {max_bytes: 1MiB}
    """)
    message = config_error(path)
    assert message.startswith("uploads: unknown top-level key")
    assert "Did you mean 'upload'?" in message
    assert "compaction" in message


def test_uninstalled_wal_name_lists_installed_names() -> None:
    message = config_error(with_section(wal={"type": "ebz"}))
    assert message.startswith("wal.type: unknown WAL 'ebz'; installed: ")
    for name in installed_names("wal"):
        assert name in message
    assert "Did you mean 'ebs'?" in message


@pytest.mark.parametrize(
    ("sections", "expected_start"),
    [
        ({"node": {"id": -1}}, "node.id: must be at least 0"),
        ({"node": {"id": "one"}}, "node.id: expected an integer"),
        ({"node": 1}, "node: expected a mapping"),
        ({"wal": {"type": "memory", "capacity": "lots"}}, "wal.capacity: expected a size"),
        ({"wal": {"type": "memory", "capacity": True}}, "wal.capacity: expected a size"),
        ({"wal": ["memory"]}, "wal: expected a mapping"),
        ({"wal": {"capacity": "1GiB"}}, "wal.type: required; installed: "),
        ({"metadata": {"type": 3}}, "metadata.type: expected a plugin name"),
        ({"object_store": {"type": "local"}}, "object_store.root: required"),
        ({"upload": {"max_interval": "soon"}}, "upload.max_interval: expected a duration"),
        ({"upload": {"max_concurrency": 0}}, "upload.max_concurrency: must be at least 1"),
        ({"compaction": {"enabled": "maybe"}}, "compaction.enabled: expected true or false"),
        ({"append_timeout": "-1s"}, "append_timeout: expected a duration"),
        ({"server": {"listen": "localhost"}}, "server.listen: expected host:port"),
        ({"server": {"listen": "localhost:99999"}}, "server.listen: expected host:port"),
        ({"hooks": {"disable": {"metrics": True}}}, "hooks.disable: expected a list"),
        (
            {"cache": {"readahead_min_bytes": "2MiB", "readahead_max_bytes": "1MiB"}},
            "cache.readahead_min_bytes (2097152) must not exceed",
        ),
    ],
)
def test_wrong_values_name_the_key(sections: dict[str, Any], expected_start: str) -> None:
    message = config_error(with_section(**sections))
    assert message.startswith(expected_start), message


def test_missing_backend_section_says_what_to_write() -> None:
    message = config_error({"wal": {"type": "memory"}, "object_store": {"type": "memory"}})
    assert message.startswith("metadata: section missing")
    assert "sqlite" in message


def test_yaml_syntax_error_names_file_and_line(write_yaml: WriteYaml) -> None:
    path = write_yaml("""\
        node: {id: 1}
        wal: {type: memory
        object_store: {type: memory}
    """)
    message = config_error(path)
    assert message.startswith(f"{path}:3:")
    assert "YAML syntax error" in message


def test_duplicate_section_is_refused_with_its_line(write_yaml: WriteYaml) -> None:
    path = write_yaml("""\
        wal: {type: memory}
        object_store: {type: memory}
        metadata: {type: memory}
        wal: {type: ebs}
    """)
    message = config_error(path)
    assert message.startswith(f"{path}:4:1:")
    assert "duplicate key 'wal'" in message


def test_missing_file_empty_file_and_non_mapping(write_yaml: WriteYaml, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "deploy.yaml"
    assert str(missing) in config_error(missing)
    assert config_error(missing).startswith("deployment file not found")
    assert config_error(write_yaml("", "empty.yaml")).startswith("empty deployment in ")
    assert "a deployment is a mapping" in config_error(write_yaml("- wal\n", "list.yaml"))
    assert "folder" in config_error(tmp_path)


def test_base_dir_override_for_mappings(tmp_path: Path) -> None:
    deployment = load_deployment(
        with_section(metadata={"type": "sqlite", "path": "db/meta.db"}), base_dir=tmp_path
    )
    assert deployment.sections["metadata"]["path"] == tmp_path / "db/meta.db"
    assert load_deployment(deployment) is deployment


def test_describe_is_json_and_masks_secrets(write_yaml: WriteYaml) -> None:
    deployment = load_deployment(write_yaml(DESIGN_EXAMPLE))
    described = json.loads(json.dumps(deployment.describe()))
    assert described["source"] == str(deployment.source)
    assert described["sections"]["wal"]["type"] == "memory"
    assert described["sections"]["object_store"]["root"].endswith("walstream-data/objects")
    assert described["sections"]["append_timeout"] == 30.0
    assert described["sections"]["server"]["token"] is None


def test_backend_creation_failure_becomes_config_error() -> None:
    def refuse(options: dict[str, Any], context: Any) -> MemoryObjectStore:
        raise PermissionError(13, "Permission denied", "/srv/objects")

    unregister = register_factory(
        BackendFactory(
            kind="object_store", name="refusing", description="", options=(), create=refuse
        )
    )
    try:
        deployment = load_deployment(with_section(object_store={"type": "refusing"}))
        with pytest.raises(ConfigError) as caught:
            deployment.build_backends()
    finally:
        unregister()
    assert str(caught.value).startswith(
        "object_store: object_store type 'refusing' could not be created: PermissionError"
    )


def test_backend_of_the_wrong_type_is_refused() -> None:
    unregister = register_factory(
        BackendFactory(
            kind="metadata",
            name="not-metadata",
            description="",
            options=(),
            create=lambda options, context: MemoryObjectStore(),
        )
    )
    try:
        deployment = load_deployment(with_section(metadata={"type": "not-metadata"}))
        with pytest.raises(ConfigError, match="which is not a MetadataStore"):
            deployment.build_backends()
    finally:
        unregister()


def test_embedded_default_resolves_under_the_data_root(tmp_path: Path) -> None:
    """With stand-ins for the ebs, local and sqlite names, every path of the embedded default
    lands inside ``root``."""
    created: dict[str, dict[str, Any]] = {}

    def stand_in(kind: Any, name: str, options: tuple[Option, ...]) -> BackendFactory[Any]:
        def create(values: dict[str, Any], context: Any) -> Any:
            created[name] = values
            return MemoryWal() if kind == "wal" else MemoryObjectStore()

        return BackendFactory(
            kind=kind, name=name, description="stand-in", options=options, create=create
        )

    registrations = [
        register_factory(
            stand_in("wal", "ebs", (Option("path", "path", ""), Option("capacity", "size", "")))
        ),
        register_factory(stand_in("object_store", "local", (Option("root", "path", ""),))),
        register_factory(stand_in("metadata", "sqlite", (Option("path", "path", ""),))),
    ]
    try:
        deployment = default_deployment(tmp_path / "data")
    finally:
        for unregister in registrations:
            unregister()
    root = tmp_path / "data"
    assert deployment.base_dir == root
    assert deployment.node_id == 1
    assert deployment.sections["wal"] == {
        "type": "ebs",
        "path": root / "wal.img",
        "capacity": 512 << 20,
    }
    assert deployment.sections["object_store"]["root"] == root / "objects"
    assert deployment.sections["metadata"]["path"] == root / "meta.db"
    assert EMBEDDED_DEFAULT["wal"]["type"] == "ebs"  # one constant decides the default


def test_embedded_default_with_the_real_plugins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``load_deployment(None)`` is the embedded default in ./walstream-data; without the ebs
    plugin installed it says which package to install."""
    monkeypatch.chdir(tmp_path)
    if "ebs" not in installed_names("wal"):
        message = config_error(None)
        assert "pip install walstream-wal-ebs" in message
        return
    deployment = load_deployment(None)
    assert isinstance(deployment, Deployment)
    assert deployment.base_dir == tmp_path / "walstream-data"
    assert deployment.sections["metadata"]["path"] == tmp_path / "walstream-data" / "meta.db"
    assert os.path.basename(deployment.sections["wal"]["path"]) == "wal.img"


def test_disabling_an_unknown_hook_extension_warns_with_a_suggestion(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level("WARNING", logger="walstream_plugins.deployment"):
        deployment = load_deployment(with_section(hooks={"disable": ["metric"]}))
    assert deployment.disabled_hooks == ("metric",)
    assert any(
        "hooks.disable" in record.getMessage() and "Did you mean 'metrics'?" in record.getMessage()
        for record in caplog.records
    )


def test_yaml_boolean_words_as_keys_are_explained(write_yaml: WriteYaml) -> None:
    path = write_yaml("""\
        wal: {type: memory}
        object_store: {type: memory}
        metadata: {type: memory}
        compaction: {on: true}
    """)
    assert "quote YAML words such as 'on'" in config_error(path)


@pytest.mark.parametrize(
    ("wal_path", "root", "meta_path"),
    [
        ("./data/objects", "./data/objects", "./data/meta.db"),  # the WAL file is the object root
        ("./data/objects/wal.img", "./data/objects", "./data/meta.db"),  # inside it
        ("./data/wal.img", "./data/objects", "./data/objects/meta.db"),  # metadata inside it
    ],
)
def test_overlapping_wal_metadata_and_object_locations_are_refused(
    write_yaml: WriteYaml, wal_path: str, root: str, meta_path: str
) -> None:
    path = write_yaml(
        f"""
        wal: {{type: ebs, path: {wal_path}, capacity: 8MiB}}
        object_store: {{type: local, root: {root}}}
        metadata: {{type: sqlite, path: {meta_path}}}
        """,
        "deploy.yaml",
    )
    message = config_error(path)
    assert "overlap" in message and "separate locations" in message


def test_separate_locations_load(write_yaml: WriteYaml) -> None:
    path = write_yaml(
        """
        wal: {type: ebs, path: ./data/wal.img, capacity: 8MiB}
        object_store: {type: local, root: ./data/objects}
        metadata: {type: sqlite, path: ./data/meta.db}
        """,
        "deploy.yaml",
    )
    assert load_deployment(path).sections["object_store"]["root"].name == "objects"
