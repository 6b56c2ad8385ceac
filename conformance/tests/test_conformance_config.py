"""A conformance --config file expands ${VAR} like a deployment file (the S3 option tables tell
users to keep secrets and endpoints in the environment)."""

from __future__ import annotations

from pathlib import Path

import pytest
from walstream.errors import ConfigError
from walstream_conformance.backends import read_config_section


def test_environment_references_expand_in_a_conformance_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "wal-s3.yaml"
    config.write_text(
        "wal:\n"
        "  type: s3\n"
        "  bucket: ${CONFORMANCE_BUCKET}\n"
        "  endpoint_url: ${CONFORMANCE_ENDPOINT:-http://127.0.0.1:5000}\n"
        "  prefix: literal-$${kept}\n"
    )
    monkeypatch.setenv("CONFORMANCE_BUCKET", "wal-bucket")
    monkeypatch.delenv("CONFORMANCE_ENDPOINT", raising=False)
    assert read_config_section(config, "wal") == {
        "type": "s3",
        "bucket": "wal-bucket",
        "endpoint_url": "http://127.0.0.1:5000",
        "prefix": "literal-${kept}",
    }


def test_a_missing_variable_names_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "wal.yaml"
    config.write_text("type: s3\nbucket: ${CONFORMANCE_NOT_SET}\n")
    monkeypatch.delenv("CONFORMANCE_NOT_SET", raising=False)
    with pytest.raises(ConfigError, match=r"bucket: environment variable CONFORMANCE_NOT_SET"):
        read_config_section(config, "wal")
