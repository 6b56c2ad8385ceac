"""The PostgreSQL schema of the metadata store and its forward migrations.

Every table lives in one PostgreSQL schema (option ``schema``, default ``walstream``), so several
deployments can share a database. ``schema_version`` holds one row per applied migration;
:func:`migrate` applies the missing ones at start, each in its own transaction together with its
version row, under an advisory lock so that nodes starting at once migrate exactly once. A schema
written by a newer walstream (a version this code does not know) is refused with
:class:`~walstream.errors.ConfigError`; nothing is changed then.

Adding a table (or a column, or an index) is one new entry at the end of :data:`MIGRATIONS`;
existing entries are never edited, because deployed databases already ran them.
"""

from __future__ import annotations

import re
import zlib
from typing import Any

from walstream.errors import ConfigError

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "check_schema_name", "migrate", "quote_identifier"]

#: The migrations in order; migration ``n`` (1-based) brings the schema to version ``n``.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    # -- version 1: streams, objects and their ranges, nodes, the deployment id, data-loss gaps --
    (
        "CREATE SEQUENCE stream_ids AS bigint",
        "CREATE SEQUENCE object_ids AS bigint",
        """CREATE TABLE streams (
            stream_id bigint PRIMARY KEY,
            name text,
            epoch bigint NOT NULL,
            start_offset bigint NOT NULL,
            committed_end bigint NOT NULL,
            state text NOT NULL CHECK (state IN ('active', 'deleted')),
            owner_node_id bigint,
            fencing_token text,
            created_ms bigint NOT NULL
        )""",
        # At most one ACTIVE stream per name; deleted streams keep their name for history.
        """CREATE UNIQUE INDEX streams_active_name ON streams (name)
            WHERE state = 'active' AND name IS NOT NULL""",
        "CREATE INDEX streams_owner ON streams (owner_node_id)",
        """CREATE TABLE objects (
            object_id bigint PRIMARY KEY,
            state text NOT NULL CHECK (state IN ('prepared', 'committed', 'mark_destroyed')),
            expires_ms bigint NOT NULL DEFAULT 0,
            expired boolean NOT NULL DEFAULT false,
            key text NOT NULL DEFAULT '',
            kind text NOT NULL DEFAULT 'stream',
            size bigint NOT NULL DEFAULT 0,
            index_size bigint NOT NULL DEFAULT 0,
            committed_ms bigint NOT NULL DEFAULT 0
        )""",
        # expired_prepared and the garbage collector look for these; committed objects (the
        # bulk) stay out of both indexes.
        "CREATE INDEX objects_prepared ON objects (expires_ms) WHERE state = 'prepared'",
        "CREATE INDEX objects_destroyed ON objects (object_id) WHERE state = 'mark_destroyed'",
        """CREATE TABLE ranges (
            object_id bigint NOT NULL REFERENCES objects (object_id),
            stream_id bigint NOT NULL,
            start_offset bigint NOT NULL,
            end_offset bigint NOT NULL,
            epoch bigint NOT NULL,
            min_timestamp_ms bigint NOT NULL,
            max_timestamp_ms bigint NOT NULL,
            PRIMARY KEY (object_id, stream_id, start_offset),
            CHECK (start_offset >= 0 AND end_offset > start_offset)
        )""",
        # The read path: objects of one stream past an offset, in offset order (get_objects
        # starts the index scan at the offset and stops after `limit` rows).
        "CREATE INDEX ranges_stream_end ON ranges (stream_id, end_offset)",
        """CREATE TABLE nodes (
            node_id bigint PRIMARY KEY,
            node_epoch bigint NOT NULL,
            state text NOT NULL,
            wal_config text NOT NULL,
            updated_ms bigint NOT NULL
        )""",
        # The deployment's identity, written once (the CHECK keeps it to one row).
        """CREATE TABLE deployment (
            singleton integer PRIMARY KEY CHECK (singleton = 0),
            deployment_id bytea NOT NULL CHECK (length(deployment_id) = 16)
        )""",
        # Offsets an operator recorded as lost (`walstream recover --accept-loss`).
        """CREATE TABLE data_loss (
            stream_id bigint NOT NULL,
            start_offset bigint NOT NULL,
            end_offset bigint NOT NULL,
            reason text NOT NULL,
            recorded_ms bigint NOT NULL,
            PRIMARY KEY (stream_id, start_offset)
        )""",
    ),
    # -- version 2: basins (the S2 API's namespaces of streams) -----------------------------------
    (
        # COLLATE "C": names sort by bytes, as list_basins pages them in every store.
        """CREATE TABLE basins (
            name text COLLATE "C" PRIMARY KEY,
            config text NOT NULL,
            created_ms bigint NOT NULL
        )""",
    ),
    # -- version 3: node leases (the advertised address; the lease expiry, server clock) -------
    (
        "ALTER TABLE nodes ADD COLUMN address text",
        "ALTER TABLE nodes ADD COLUMN lease_expires_ms bigint NOT NULL DEFAULT 0",
    ),
)

#: The version this code writes and understands.
SCHEMA_VERSION = len(MIGRATIONS)

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


def _lock_key(schema: str) -> int:
    """The advisory-lock key serialising migrations of one schema (a signed 64-bit int)."""
    return zlib.crc32(f"walstream-migrate:{schema}".encode()) - (1 << 31)


async def migrate(connection: Any, schema: str, now_ms: int, where: str) -> int:
    """Bring ``schema`` to :data:`SCHEMA_VERSION` on an asyncpg ``connection`` (its
    ``search_path`` already names ``schema``); returns the version found before.

    Raises :class:`ConfigError` when the schema is newer than this code, or when it holds tables
    but no ``schema_version`` (it is not a walstream schema)."""
    quoted = quote_identifier(schema)
    async with connection.transaction():
        await connection.execute("SELECT pg_advisory_xact_lock($1)", _lock_key(schema))
        await connection.execute(f"CREATE SCHEMA IF NOT EXISTS {quoted}")
        exists = await connection.fetchval(
            "SELECT to_regclass($1) IS NOT NULL", f"{quoted}.schema_version"
        )
        if not exists:
            others = await connection.fetchval(
                "SELECT count(*) FROM pg_tables WHERE schemaname = $1", schema
            )
            if others:
                raise ConfigError(
                    f"metadata.schema: schema {schema!r} at {where} holds {others} tables but no "
                    "walstream schema_version table: it belongs to something else; choose "
                    "another metadata.schema"
                )
            await connection.execute(
                f"""CREATE TABLE {quoted}.schema_version (
                    version integer PRIMARY KEY CHECK (version > 0),
                    applied_ms bigint NOT NULL
                )"""
            )
    async with connection.transaction():
        await connection.execute("SELECT pg_advisory_xact_lock($1)", _lock_key(schema))
        found = int(
            await connection.fetchval(
                f"SELECT coalesce(max(version), 0) FROM {quoted}.schema_version"
            )
        )
    if found > SCHEMA_VERSION:
        raise ConfigError(
            f"metadata: PostgreSQL schema {schema!r} at {where} has schema version {found}, "
            f"newer than this walstream understands ({SCHEMA_VERSION}); upgrade walstream on "
            "this node (every node of a deployment must run a version that knows the schema)"
        )
    for version in range(found + 1, SCHEMA_VERSION + 1):
        async with connection.transaction():
            await connection.execute("SELECT pg_advisory_xact_lock($1)", _lock_key(schema))
            done = await connection.fetchval(
                f"SELECT count(*) FROM {quoted}.schema_version WHERE version = $1", version
            )
            if done:
                continue  # another node applied it while this one waited for the lock
            await connection.execute(f"SET LOCAL search_path TO {quoted}")
            for statement in MIGRATIONS[version - 1]:
                await connection.execute(statement)
            await connection.execute(
                f"INSERT INTO {quoted}.schema_version (version, applied_ms) VALUES ($1, $2)",
                version,
                now_ms,
            )
    return found
