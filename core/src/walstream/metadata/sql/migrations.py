"""The metadata schema's versions: an ordered list of migrations, applied at open on every dialect.

A database's schema version is the number of the last migration applied to it, recorded in its
``schema_version`` table (one row per migration: ``version``, ``name``, ``applied_ms``). A store
brings its database to :data:`SCHEMA_VERSION` when it first connects (:func:`migrate_step`):

1. **Ordered, numbered, each in its own transaction.** Migration ``n`` runs, with its version row,
   in one transaction, so a database is always at exactly one version: a crash mid-migration
   leaves the previous one.
2. **Idempotent under concurrent openers.** Each step takes the dialect's migration lock (SQLite's
   write lock, ``BEGIN IMMEDIATE``; a PostgreSQL advisory lock per schema), then reads the version
   again: of several processes opening one new database at once, each applies what is still
   missing and all of them open it.
3. **Downgrade protection.** A database whose version is newer than this code's
   :data:`SCHEMA_VERSION` (migrated by a newer walstream) is refused with
   :class:`~walstream.errors.SchemaTooNew`, and nothing is changed.
4. **Databases from before versioned migrations** are adopted in place: SQLite files recorded
   their version (1 to 4) in ``meta``; PostgreSQL schemas had a ``schema_version`` table without
   ``name`` whose versions 1 to 3 are this list's 2 to 4 (its first migration held this list's
   first two). Their tables are exactly what those migrations made, so adoption only records the
   versions as applied (:meth:`Dialect.legacy_version
   <walstream.metadata.sql.dialect.Dialect.legacy_version>`).

Adding a migration (a table, a column, an index) is one new :class:`Migration` at the end of
:data:`MIGRATIONS`, numbered one more than the last. Its steps are SQL statements, one text for
every dialect where the SQL is the same (``ALTER TABLE streams ADD COLUMN retention_ms bigint``:
SQLite reads ``bigint`` as an integer column), and :class:`PerDialect` where it is not. Existing
entries are never edited: deployed databases already ran them. A new column needs a ``DEFAULT``
(or to allow NULL) that describes every existing row, and the code that reads it goes in the same
change. docs/architecture/metadata.md has a worked example.
"""

from __future__ import annotations

from dataclasses import dataclass

from walstream.errors import ConfigError, SchemaTooNew
from walstream.metadata.sql.dialect import Connection, Dialect

__all__ = [
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "Migration",
    "PerDialect",
    "is_current",
    "migrate_step",
    "recorded_version",
    "schema_too_new",
]


@dataclass(frozen=True)
class PerDialect:
    """One step written per dialect; ``None``: nothing to do on that dialect."""

    sqlite: str | None
    postgres: str | None

    def text(self, dialect: str) -> str | None:
        if dialect == "sqlite":
            return self.sqlite
        if dialect == "postgres":
            return self.postgres
        raise ConfigError(f"migrations: no SQL for the {dialect!r} dialect")


Step = str | PerDialect


@dataclass(frozen=True)
class Migration:
    """Migration ``version``: ``steps`` in order, each one text for every dialect or a
    :class:`PerDialect`; ``name`` says what it adds (it is recorded in ``schema_version``)."""

    version: int
    name: str
    steps: tuple[Step, ...]

    def statements(self, dialect: str) -> list[str]:
        """The statements this migration runs on ``dialect``, in order."""
        found: list[str] = []
        for step in self.steps:
            text = step if isinstance(step, str) else step.text(dialect)
            if text is not None:
                found.append(text)
        return found


#: Every migration, in order; migration ``n`` (1-based) brings a database to version ``n``.
MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "streams, objects and their ranges, nodes",
        (
            # SQLite keeps its id counters in `meta`; PostgreSQL uses sequences.
            PerDialect(
                sqlite="""CREATE TABLE meta (
                    key TEXT PRIMARY KEY,
                    value INTEGER NOT NULL
                )""",
                postgres="CREATE SEQUENCE stream_ids AS bigint",
            ),
            PerDialect(
                sqlite="INSERT INTO meta (key, value) VALUES ('last_stream_id', 0), "
                "('last_object_id', 0)",
                postgres="CREATE SEQUENCE object_ids AS bigint",
            ),
            PerDialect(
                sqlite="""CREATE TABLE streams (
                    stream_id INTEGER PRIMARY KEY,
                    name TEXT,
                    epoch INTEGER NOT NULL,
                    start_offset INTEGER NOT NULL,
                    committed_end INTEGER NOT NULL,
                    state TEXT NOT NULL,
                    owner_node_id INTEGER,
                    fencing_token TEXT,
                    created_ms INTEGER NOT NULL
                )""",
                postgres="""CREATE TABLE streams (
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
            ),
            # At most one ACTIVE stream per name; deleted streams keep their name for history.
            "CREATE UNIQUE INDEX streams_active_name ON streams (name) "
            "WHERE state = 'active' AND name IS NOT NULL",
            "CREATE INDEX streams_owner ON streams (owner_node_id)",
            PerDialect(
                sqlite="""CREATE TABLE objects (
                    object_id INTEGER PRIMARY KEY,
                    state TEXT NOT NULL,
                    expires_ms INTEGER NOT NULL DEFAULT 0,
                    expired INTEGER NOT NULL DEFAULT 0,
                    key TEXT NOT NULL DEFAULT '',
                    kind TEXT NOT NULL DEFAULT 'stream',
                    size INTEGER NOT NULL DEFAULT 0,
                    index_size INTEGER NOT NULL DEFAULT 0,
                    committed_ms INTEGER NOT NULL DEFAULT 0
                )""",
                postgres="""CREATE TABLE objects (
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
            ),
            # expired_prepared and the garbage collector look for these; on PostgreSQL committed
            # objects (the bulk) stay out of both partial indexes.
            PerDialect(
                sqlite="CREATE INDEX objects_state ON objects (state, expires_ms)",
                postgres="CREATE INDEX objects_prepared ON objects (expires_ms) "
                "WHERE state = 'prepared'",
            ),
            PerDialect(
                sqlite=None,
                postgres="CREATE INDEX objects_destroyed ON objects (object_id) "
                "WHERE state = 'mark_destroyed'",
            ),
            PerDialect(
                sqlite="""CREATE TABLE ranges (
                    object_id INTEGER NOT NULL,
                    stream_id INTEGER NOT NULL,
                    start_offset INTEGER NOT NULL,
                    end_offset INTEGER NOT NULL,
                    epoch INTEGER NOT NULL,
                    min_timestamp_ms INTEGER NOT NULL,
                    max_timestamp_ms INTEGER NOT NULL
                )""",
                postgres="""CREATE TABLE ranges (
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
            ),
            # The read path: objects of one stream past an offset, in offset order (get_objects
            # starts the index scan at the offset and stops after `limit` rows).
            "CREATE INDEX ranges_stream_end ON ranges (stream_id, end_offset)",
            # An object's ranges (PostgreSQL's primary key starts with object_id).
            PerDialect(sqlite="CREATE INDEX ranges_object ON ranges (object_id)", postgres=None),
            PerDialect(
                sqlite="""CREATE TABLE nodes (
                    node_id INTEGER PRIMARY KEY,
                    node_epoch INTEGER NOT NULL,
                    state TEXT NOT NULL,
                    wal_config TEXT NOT NULL,
                    updated_ms INTEGER NOT NULL
                )""",
                postgres="""CREATE TABLE nodes (
                    node_id bigint PRIMARY KEY,
                    node_epoch bigint NOT NULL,
                    state text NOT NULL,
                    wal_config text NOT NULL,
                    updated_ms bigint NOT NULL
                )""",
            ),
        ),
    ),
    Migration(
        2,
        "the deployment id, data-loss gaps",
        (
            # The deployment's identity, written once (the CHECK keeps it to one row).
            PerDialect(
                sqlite="""CREATE TABLE deployment (
                    singleton INTEGER PRIMARY KEY CHECK (singleton = 0),
                    deployment_id BLOB NOT NULL
                )""",
                postgres="""CREATE TABLE deployment (
                    singleton integer PRIMARY KEY CHECK (singleton = 0),
                    deployment_id bytea NOT NULL CHECK (length(deployment_id) = 16)
                )""",
            ),
            # Offsets an operator recorded as lost (`walstream recover --accept-loss`).
            PerDialect(
                sqlite="""CREATE TABLE data_loss (
                    stream_id INTEGER NOT NULL,
                    start_offset INTEGER NOT NULL,
                    end_offset INTEGER NOT NULL,
                    reason TEXT NOT NULL,
                    recorded_ms INTEGER NOT NULL,
                    PRIMARY KEY (stream_id, start_offset)
                )""",
                postgres="""CREATE TABLE data_loss (
                    stream_id bigint NOT NULL,
                    start_offset bigint NOT NULL,
                    end_offset bigint NOT NULL,
                    reason text NOT NULL,
                    recorded_ms bigint NOT NULL,
                    PRIMARY KEY (stream_id, start_offset)
                )""",
            ),
        ),
    ),
    Migration(
        3,
        "basins",
        (
            # Names sort by their bytes (COLLATE "C" on PostgreSQL; SQLite's BINARY), as
            # list_basins pages them in every store.
            PerDialect(
                sqlite="""CREATE TABLE basins (
                    name TEXT PRIMARY KEY,
                    config TEXT NOT NULL,
                    created_ms INTEGER NOT NULL
                )""",
                postgres="""CREATE TABLE basins (
                    name text COLLATE "C" PRIMARY KEY,
                    config text NOT NULL,
                    created_ms bigint NOT NULL
                )""",
            ),
        ),
    ),
    Migration(
        4,
        "node leases: the advertised address, the lease expiry",
        (
            PerDialect(
                sqlite="ALTER TABLE nodes ADD COLUMN address TEXT",
                postgres="ALTER TABLE nodes ADD COLUMN address text",
            ),
            PerDialect(
                sqlite="ALTER TABLE nodes ADD COLUMN lease_expires_ms INTEGER NOT NULL DEFAULT 0",
                postgres="ALTER TABLE nodes ADD COLUMN lease_expires_ms bigint NOT NULL DEFAULT 0",
            ),
        ),
    ),
    Migration(
        5,
        "key/value: namespaced values with compare-and-set versions",
        (
            # Versions come from one counter for the whole store: never given twice.
            PerDialect(
                sqlite="INSERT INTO meta (key, value) VALUES ('last_kv_version', 0)",
                postgres="CREATE SEQUENCE kv_versions AS bigint",
            ),
            # Keys sort by their bytes (COLLATE "C"; SQLite's BINARY): kv_list pages by them.
            PerDialect(
                sqlite="""CREATE TABLE kv (
                    namespace TEXT NOT NULL,
                    key TEXT NOT NULL,
                    value BLOB NOT NULL,
                    version INTEGER NOT NULL,
                    PRIMARY KEY (namespace, key)
                ) WITHOUT ROWID""",
                postgres="""CREATE TABLE kv (
                    namespace text COLLATE "C" NOT NULL,
                    key text COLLATE "C" NOT NULL,
                    value bytea NOT NULL,
                    version bigint NOT NULL CHECK (version > 0),
                    PRIMARY KEY (namespace, key)
                )""",
            ),
        ),
    ),
    Migration(
        6,
        "stream configuration, creation tokens, lifecycle due times",
        (
            # Every existing stream has the default configuration ('{}': every field its
            # default), no creation token and nothing due.
            PerDialect(
                sqlite="ALTER TABLE streams ADD COLUMN config TEXT NOT NULL DEFAULT '{}'",
                postgres="ALTER TABLE streams ADD COLUMN config text NOT NULL DEFAULT '{}'",
            ),
            PerDialect(
                sqlite="ALTER TABLE streams ADD COLUMN creation_token TEXT",
                postgres="ALTER TABLE streams ADD COLUMN creation_token text",
            ),
            PerDialect(
                sqlite="ALTER TABLE streams ADD COLUMN lifecycle_due_ms INTEGER",
                postgres="ALTER TABLE streams ADD COLUMN lifecycle_due_ms bigint",
            ),
            # due_streams: an index range over the streams with work due, the others left out.
            "CREATE INDEX streams_lifecycle_due ON streams (lifecycle_due_ms) "
            "WHERE lifecycle_due_ms IS NOT NULL",
        ),
    ),
    Migration(
        7,
        "stream listing pages: names in byte order, streams without a name",
        (
            # list_streams pages named streams by name in byte order: SQLite's BINARY index of
            # active names (migration 1) already sorts so; PostgreSQL's sorts by the database's
            # collation, so it gets one in "C" order.
            PerDialect(
                sqlite=None,
                postgres='CREATE INDEX streams_active_name_bytes ON streams (name COLLATE "C") '
                "WHERE state = 'active' AND name IS NOT NULL",
            ),
            "CREATE INDEX streams_unnamed ON streams (stream_id) "
            "WHERE state = 'active' AND name IS NULL",
        ),
    ),
)

#: The version this code writes and understands: the last migration's.
SCHEMA_VERSION = MIGRATIONS[-1].version


def schema_too_new(dialect: Dialect, found: int) -> SchemaTooNew:
    return SchemaTooNew(
        f"{dialect.where} has schema version {found}, newer than this walstream understands "
        f"({SCHEMA_VERSION}): a newer walstream migrated it. Nothing was changed; upgrade "
        "walstream on this node (every node of a deployment must run a release that knows "
        "its schema)",
        found,
        SCHEMA_VERSION,
    )


async def recorded_version(db: Connection, dialect: Dialect) -> int | None:
    """The version recorded in the database, read without any lock; None when it has no
    version table yet (new, from before versioned migrations, or foreign)."""
    tables = await dialect.table_names(db)
    if "schema_version" not in tables:
        return None
    if await dialect.legacy_version(db, tables) is not None:
        return None
    return int(await db.fetchval("SELECT coalesce(max(version), 0) FROM schema_version"))


async def is_current(db: Connection, dialect: Dialect) -> bool:
    """Whether the database is at :data:`SCHEMA_VERSION`, read without a lock (the fast path of
    every open); :class:`~walstream.errors.SchemaTooNew` when it is newer."""
    found = await recorded_version(db, dialect)
    if found is not None and found > SCHEMA_VERSION:
        raise schema_too_new(dialect, found)
    return found == SCHEMA_VERSION


async def migrate_step(db: Connection, dialect: Dialect, now_ms: int) -> bool:
    """One step towards :data:`SCHEMA_VERSION`, in the open write transaction under the
    dialect's migration lock: adopt a database from before versioned migrations, or apply the
    next migration. True when the database is at :data:`SCHEMA_VERSION` afterwards."""
    tables = await dialect.table_names(db)
    legacy = await dialect.legacy_version(db, tables)
    if legacy is not None:
        if legacy > SCHEMA_VERSION:
            raise schema_too_new(dialect, legacy)
        applied = await dialect.adopt_legacy(db, legacy)
        for migration in MIGRATIONS[:legacy]:
            await _record(db, migration, applied.get(migration.version, now_ms))
        await dialect.after_migration(db, legacy)
        return legacy == SCHEMA_VERSION
    if "schema_version" in tables:
        version = int(await db.fetchval("SELECT coalesce(max(version), 0) FROM schema_version"))
    elif tables:
        raise ConfigError(
            f"{dialect.where} holds {len(tables)} tables but no walstream schema_version "
            f"table: it belongs to something else; point {dialect.config_key} at a database "
            "of walstream's own"
        )
    else:
        await db.execute(dialect.version_table_sql)
        version = 0
    if version > SCHEMA_VERSION:
        raise schema_too_new(dialect, version)
    if version == SCHEMA_VERSION:
        return True
    migration = MIGRATIONS[version]
    for statement in migration.statements(dialect.name):
        await db.execute(statement)
    await _record(db, migration, now_ms)
    await dialect.after_migration(db, migration.version)
    return migration.version == SCHEMA_VERSION


async def _record(db: Connection, migration: Migration, applied_ms: int) -> None:
    await db.execute(
        "INSERT INTO schema_version (version, name, applied_ms) VALUES ($1, $2, $3)",
        migration.version,
        migration.name,
        applied_ms,
    )
