"""Backend discovery through real entry points: installed names, install hints, third-party
dists, contract versions and import failures."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from walstream.config import CONTRACT_VERSION, BackendFactory, Option
from walstream.errors import ConfigError
from walstream.wal.memory import MEMORY_WAL, MemoryWal
from walstream_plugins import installed_backends, load_factory, register_factory, registry
from walstream_plugins.registry import installed_names

MakeDist = Callable[..., str]  # the third_party_dist fixture (conftest.py)

ACME_MODULE = """
from walstream.config import CONTRACT_VERSION, BackendFactory, Option
from walstream.wal.memory import MemoryWal


class AcmeWal(MemoryWal):
    pass


def _create(options, context):
    return AcmeWal(name=options["volume"], capacity_bytes=options["capacity"])


ACME_WAL = BackendFactory(
    kind="wal",
    name="acme",
    description="Acme's WAL appliance",
    options=(
        Option("volume", "str", "appliance volume", required=True),
        Option("capacity", "size", "bytes", default="8MiB"),
    ),
    create=_create,
)
OLD_WAL = BackendFactory(
    kind="wal", name="old", description="built for an older walstream",
    options=(), create=_create, contract_version=CONTRACT_VERSION - 1,
)
FUTURE_WAL = BackendFactory(
    kind="wal", name="future", description="built for a newer walstream",
    options=(), create=_create, contract_version=CONTRACT_VERSION + 1,
)
NOT_A_FACTORY = {"kind": "wal"}
"""

BROKEN_MODULE = """
import acme_hardware_sdk_that_is_not_installed  # noqa: F401
"""


def test_memory_wal_is_found_through_its_entry_point() -> None:
    factory = load_factory("wal", "memory")
    assert factory is MEMORY_WAL
    assert "memory" in installed_names("wal")


def test_misspelled_wal_lists_installed_names_and_suggests() -> None:
    with pytest.raises(ConfigError) as caught:
        load_factory("wal", "memroy")
    message = str(caught.value)
    assert message.startswith("wal.type: unknown WAL 'memroy'; installed: ")
    for name in installed_names("wal"):
        assert name in message
    assert "Did you mean 'memory'?" in message


def test_known_but_uninstalled_wal_names_its_package() -> None:
    if "nvme-quorum" in installed_names("wal"):
        pytest.skip("walstream-wal-nvme-quorum is installed here")
    with pytest.raises(ConfigError) as caught:
        load_factory("wal", "nvme-quorum")
    assert "pip install walstream-wal-nvme-quorum" in str(caught.value)
    assert "memory" in str(caught.value)


def test_near_miss_of_an_uninstalled_known_wal_points_at_its_package() -> None:
    if "s3express" in installed_names("wal"):
        pytest.skip("walstream-wal-s3express is installed here")
    with pytest.raises(ConfigError) as caught:
        load_factory("wal", "s3expres")
    message = str(caught.value)
    assert "Did you mean 's3express'?" in message
    assert "walstream-wal-s3express" in message


def test_s3_object_store_hint_names_the_s3_dist() -> None:
    if "s3" in installed_names("object_store"):
        pytest.skip("walstream-wal-s3 is installed here")
    with pytest.raises(ConfigError, match="pip install walstream-wal-s3"):
        load_factory("object_store", "s3")


def test_unknown_kind_and_non_string_name_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="unknown backend kind 'queue'"):
        load_factory("queue", "memory")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"wal\.type: expected a plugin name"):
        load_factory("wal", 7)  # type: ignore[arg-type]


def test_third_party_dist_is_discovered_loaded_and_described(
    third_party_dist: MakeDist,
) -> None:
    suffix = third_party_dist(
        "acme-walstream",
        "2.3.4",
        modules={"acme_wal{suffix}": ACME_MODULE},
        entry_points={"walstream.wal": {"acme": "acme_wal{suffix}:ACME_WAL"}},
    )
    assert "acme" in installed_names("wal")
    factory = load_factory("wal", "acme")
    assert factory.name == "acme"
    assert type(factory.create({"volume": "v", "capacity": 1 << 20}, None)).__module__ == (  # type: ignore[arg-type]
        f"acme_wal{suffix}"
    )
    described = {(item.kind, item.name): item for item in installed_backends()}
    acme = described[("wal", "acme")]
    assert (acme.dist, acme.version) == ("acme-walstream", "2.3.4")
    assert acme.description == "Acme's WAL appliance"
    assert [option.name for option in acme.options] == ["volume", "capacity"]
    assert acme.error is None
    memory = described[("wal", "memory")]
    assert memory.dist == "walstream"


def test_contract_version_mismatch_is_refused_naming_what_to_upgrade(
    third_party_dist: MakeDist,
) -> None:
    third_party_dist(
        "acme-walstream",
        "0.9.0",
        modules={"acme_wal{suffix}": ACME_MODULE},
        entry_points={
            "walstream.wal": {
                "old": "acme_wal{suffix}:OLD_WAL",
                "future": "acme_wal{suffix}:FUTURE_WAL",
            }
        },
    )
    with pytest.raises(ConfigError) as old:
        load_factory("wal", "old")
    assert f"contract version {CONTRACT_VERSION - 1}" in str(old.value)
    assert "upgrade acme-walstream" in str(old.value)
    with pytest.raises(ConfigError) as future:
        load_factory("wal", "future")
    assert f"contract version {CONTRACT_VERSION + 1}" in str(future.value)
    assert "upgrade walstream" in str(future.value)


def test_entry_point_that_fails_to_import_names_dist_and_error(
    third_party_dist: MakeDist,
) -> None:
    third_party_dist(
        "acme-broken-wal",
        "1.0.0",
        modules={"acme_broken{suffix}": BROKEN_MODULE},
        entry_points={"walstream.wal": {"broken": "acme_broken{suffix}:FACTORY"}},
    )
    with pytest.raises(ConfigError) as caught:
        load_factory("wal", "broken")
    message = str(caught.value)
    assert "acme-broken-wal 1.0.0" in message
    assert "acme_hardware_sdk_that_is_not_installed" in message
    assert "ModuleNotFoundError" in message
    # A broken plugin does not hide the others, and `walstream plugins` says why it is broken.
    assert load_factory("wal", "memory") is MEMORY_WAL
    broken = next(item for item in installed_backends() if item.name == "broken")
    assert broken.error is not None and "acme_hardware_sdk" in broken.error


def test_entry_point_that_is_not_a_factory_or_of_another_kind_is_refused(
    third_party_dist: MakeDist,
) -> None:
    third_party_dist(
        "acme-confused",
        modules={"acme_wal{suffix}": ACME_MODULE},
        entry_points={
            "walstream.wal": {"dict": "acme_wal{suffix}:NOT_A_FACTORY"},
            "walstream.metadata": {"acme": "acme_wal{suffix}:ACME_WAL"},
        },
    )
    with pytest.raises(ConfigError, match="is not a walstream BackendFactory"):
        load_factory("wal", "dict")
    with pytest.raises(ConfigError, match="builds a 'wal' backend"):
        load_factory("metadata", "acme")


def test_same_name_from_two_dists_is_ambiguous(third_party_dist: MakeDist) -> None:
    third_party_dist(
        "acme-one",
        modules={"acme_one{suffix}": ACME_MODULE},
        entry_points={"walstream.wal": {"acme": "acme_one{suffix}:ACME_WAL"}},
    )
    third_party_dist(
        "acme-two",
        modules={"acme_two{suffix}": ACME_MODULE},
        entry_points={"walstream.wal": {"acme": "acme_two{suffix}:ACME_WAL"}},
    )
    with pytest.raises(ConfigError) as caught:
        load_factory("wal", "acme")
    assert "acme-one" in str(caught.value) and "acme-two" in str(caught.value)


def test_registered_factory_is_loadable_until_unregistered() -> None:
    factory: BackendFactory[MemoryWal] = BackendFactory(
        kind="wal",
        name="in-process",
        description="registered by the embedding application",
        options=(Option("name", "str", "volume"),),
        create=lambda options, context: MemoryWal(name=options["name"]),
    )
    unregister = register_factory(factory)
    try:
        assert load_factory("wal", "in-process") is factory
        assert "in-process" in installed_names("wal")
        with pytest.raises(ConfigError, match="already registered"):
            register_factory(factory)
    finally:
        unregister()
    with pytest.raises(ConfigError, match="unknown WAL 'in-process'"):
        load_factory("wal", "in-process")


def test_registered_factory_with_another_contract_is_refused() -> None:
    factory = BackendFactory(
        kind="object_store", name="stale", description="", options=(),
        create=lambda options, context: None, contract_version=CONTRACT_VERSION + 5,
    )
    unregister = register_factory(factory)
    try:
        with pytest.raises(ConfigError, match=f"contract version {CONTRACT_VERSION + 5}"):
            load_factory("object_store", "stale")
    finally:
        unregister()


def test_install_hint_for_a_known_provider_that_is_not_installed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Deterministic whichever walstream plugins happen to be installed here."""
    monkeypatch.setitem(registry.PROVIDERS["object_store"], "gcs", "walstream-object-gcs")
    with pytest.raises(ConfigError) as exact:
        load_factory("object_store", "gcs")
    assert "object store 'gcs' is not installed" in str(exact.value)
    assert "pip install walstream-object-gcs" in str(exact.value)
    assert "memory" in str(exact.value)
    with pytest.raises(ConfigError) as near:
        load_factory("object_store", "gsc")
    assert "Did you mean 'gcs'? (provided by walstream-object-gcs)" in str(near.value)
