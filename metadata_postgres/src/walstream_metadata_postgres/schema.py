"""The PostgreSQL schema a store's tables live in, and how its migrations are serialised.

Every table lives in one PostgreSQL schema (option ``schema``, default ``walstream``), so several
deployments can share a database. The migrations themselves, their version table and their rules
are core's, shared with SQLite (:mod:`walstream.metadata.sql.migrations`); the PostgreSQL dialect
(:mod:`.dialect`) applies them when a store first connects, each in its own transaction under an
advisory lock of the schema (:func:`migration_lock_key`), so that nodes starting at once migrate
exactly once. A schema holding tables but no ``schema_version`` table belongs to something else
and is refused.

Schemas written before versioned migrations were shared with SQLite had a ``schema_version``
table without the ``name`` column, whose versions 1 to 3 are now 2 to 4 (the first one held what
is now migrations 1 and 2); the dialect adopts them in place, keeping when each was applied.
"""

from __future__ import annotations

import re
import zlib

from walstream.errors import ConfigError
from walstream.metadata.sql.migrations import SCHEMA_VERSION

__all__ = [
    "LEGACY_VERSION_OFFSET",
    "SCHEMA_VERSION",
    "check_schema_name",
    "migration_lock_key",
    "quote_identifier",
]

#: A legacy ``schema_version`` row ``v`` is migration ``v + 1`` of the shared list.
LEGACY_VERSION_OFFSET = 1

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_$-]{0,62}$")


def check_schema_name(name: str, key: str = "metadata.schema") -> str:
    """A PostgreSQL schema name the store accepts: letters, digits, ``_``, ``$`` and ``-`` (it is
    always quoted), at most 63 bytes, not a system schema."""
    if not _IDENTIFIER.match(name) or name.lower().startswith("pg_"):
        raise ConfigError(
            f"{key}: {name!r} is not a usable schema name: use 1 to 63 letters, digits, "
            "'_', '$' or '-', starting with a letter or '_' (and not pg_...)"
        )
    if name == "information_schema":
        raise ConfigError(f"{key}: {name!r} is a system schema; choose another name")
    return name


def quote_identifier(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def migration_lock_key(schema: str) -> int:
    """The advisory-lock key serialising migrations of one schema (a signed 64-bit int)."""
    return zlib.crc32(f"walstream-migrate:{schema}".encode()) - (1 << 31)
