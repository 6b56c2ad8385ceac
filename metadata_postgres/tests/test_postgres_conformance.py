"""The metadata conformance suite against a real PostgreSQL server (fsync on)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from walstream.metadata import MetadataStore
from walstream_conformance import MetadataSuite


class TestPostgresMetadata(MetadataSuite):
    @pytest.fixture
    def walstream_metadata_factory(self, make_store: Any) -> Callable[[], MetadataStore]:
        return lambda: make_store()
