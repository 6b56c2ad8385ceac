"""walstream metadata on PostgreSQL: the ``postgres`` entry point of ``walstream.metadata``.

YAML::

    metadata: {type: postgres, dsn: "postgresql://walstream:${PGPASSWORD}@db:5432/walstream"}

See :mod:`.store` for the transaction rules and :mod:`.factory` for the options.
"""

from __future__ import annotations

from .factory import POSTGRES_METADATA
from .schema import SCHEMA_VERSION
from .store import PostgresMetadataStore

__all__ = ["POSTGRES_METADATA", "SCHEMA_VERSION", "PostgresMetadataStore"]
