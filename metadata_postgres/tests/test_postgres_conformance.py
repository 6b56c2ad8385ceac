"""The metadata conformance suite against a real PostgreSQL server (fsync on)."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from walstream.metadata import MetadataStore
from walstream_conformance import MetadataSuite
from walstream_conformance.backends import isolated_section
from walstream_metadata_postgres import POSTGRES_METADATA
from walstream_metadata_postgres.schema import check_schema_name


class TestPostgresMetadata(MetadataSuite):
    @pytest.fixture
    def walstream_metadata_factory(self, make_store: Any) -> Callable[[], MetadataStore]:
        return lambda: make_store()


def test_a_configured_schema_is_derived_afresh_per_test(tmp_path: Path) -> None:
    section = {"dsn": "postgresql://u@db/x", "schema": "prod"}
    first, _ = isolated_section(POSTGRES_METADATA, section, tmp_path)
    second, _ = isolated_section(POSTGRES_METADATA, section, tmp_path)
    assert first["schema"].startswith("prod-conformance-") and first["dsn"] == section["dsn"]
    assert first["schema"] != second["schema"]
    assert check_schema_name(first["schema"]) == first["schema"]


@pytest.mark.slow
@pytest.mark.parametrize("configured", [False, True], ids=["provisioned", "configured-dsn"])
def test_walstream_conformance_command(tmp_path: Path, postgres_dsn: str, configured: bool) -> None:
    """``walstream conformance --metadata postgres``: with its own throwaway server, and with a
    user-given DSN."""
    command = [
        str(Path(sys.executable).parent / "walstream"),
        "conformance",
        "--metadata",
        "postgres",
    ]
    if configured:
        config = tmp_path / "metadata.yaml"
        config.write_text(f"metadata: {{type: postgres, dsn: '{postgres_dsn}', schema: mine}}\n")
        command += ["--metadata-config", str(config)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.rstrip().endswith("CERTIFIED")
    assert re.search(r"^  failed +0$", done.stdout, re.M), done.stdout
    assert re.search(rf"^  passed +{len(_suite_tests())}$", done.stdout, re.M), done.stdout
    if configured:
        assert "per-test schema   mine -> mine-conformance-" in done.stdout


def _suite_tests() -> list[str]:
    return [name for name in dir(MetadataSuite) if name.startswith("test_")]
