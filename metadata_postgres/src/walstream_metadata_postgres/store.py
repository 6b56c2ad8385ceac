"""PostgreSQL :class:`MetadataStore`: one catalogue shared by the nodes of several machines.

The operations are the shared SQL store's (:mod:`walstream.metadata.sql`), run by the PostgreSQL
dialect (:mod:`.dialect`: the asyncpg pool, transactions, row locks, retries and the error
taxonomy); this module builds it from the options and checks them.
"""

from __future__ import annotations

import urllib.parse
from typing import Any

from walstream.clock import Clock, SystemClock
from walstream.errors import ConfigError
from walstream.metadata.sql import SqlMetadataStore

from .dialect import PostgresDialect
from .schema import check_schema_name

__all__ = ["PostgresMetadataStore", "check_dsn", "redact"]


def check_dsn(dsn: str, key: str = "metadata.dsn") -> urllib.parse.SplitResult:
    """A ``postgresql://user[:password]@host[:port]/database[?options]`` URL, else ConfigError."""
    parts = urllib.parse.urlsplit(dsn)
    if parts.scheme not in ("postgresql", "postgres"):
        raise ConfigError(
            f"{key}: expected a URL like postgresql://user@host:5432/database, got "
            f"{redact(dsn)!r} (the keyword=value form is not supported)"
        )
    if "," in parts.netloc:
        return parts  # several hosts (host1:5432,host2:5432): the driver tries each in turn
    try:
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError as error:
        raise ConfigError(f"{key}: bad port in {redact(dsn)!r} ({error})") from None
    return parts


def redact(dsn: str) -> str:
    """``dsn`` without its password."""
    parts = urllib.parse.urlsplit(dsn)
    if parts.password is None:
        return dsn
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


class PostgresMetadataStore(SqlMetadataStore):
    """Metadata in a PostgreSQL schema, shared by every node of a deployment."""

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "walstream",
        pool_min: int = 1,
        pool_max: int = 10,
        connect_timeout_s: float = 5.0,
        command_timeout_s: float = 10.0,
        retry_for_s: float = 15.0,
        clock: Clock | None = None,
    ) -> None:
        parts = check_dsn(dsn)
        self._dsn = dsn
        self._schema = check_schema_name(schema)
        if pool_min < 0 or pool_max < 1 or pool_min > pool_max:
            raise ConfigError(
                f"metadata.pool_min/pool_max: need 0 <= pool_min <= pool_max and pool_max >= 1, "
                f"got {pool_min}/{pool_max}"
            )
        hosts = parts.netloc.rpartition("@")[2] or "localhost:5432"
        where = f"{parts.username or '(default user)'}@{hosts}{parts.path or '/'} schema {schema!r}"
        store_clock: Clock = clock or SystemClock()
        dialect = PostgresDialect(
            dsn,
            self._schema,
            where,
            pool_min=pool_min,
            pool_max=pool_max,
            connect_timeout_s=connect_timeout_s,
            command_timeout_s=command_timeout_s,
            retry_for_s=retry_for_s,
            clock=store_clock,
        )
        super().__init__(dialect, store_clock)

    @property
    def schema(self) -> str:
        return self._schema

    def describe(self) -> dict[str, Any]:
        return {"type": "postgres", "dsn": redact(self._dsn), "schema": self._schema}
