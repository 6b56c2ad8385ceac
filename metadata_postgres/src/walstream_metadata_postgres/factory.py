"""The ``postgres`` entry point of ``walstream.metadata``: options and the provisioning hook.

YAML::

    metadata:
      type: postgres
      dsn: postgresql://walstream:${PGPASSWORD}@db.internal:5432/walstream
      schema: walstream          # a PostgreSQL schema per deployment sharing the database
      pool_max: 10

Without a config file, ``walstream conformance --metadata postgres`` provisions a throwaway
PostgreSQL server (:mod:`.testing.server`, started once per process) and gives every test a
fresh schema in it.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from walstream.config import BackendFactory, BuildContext, Option

from .schema import check_schema_name
from .store import PostgresMetadataStore, check_dsn

__all__ = ["OPTIONS", "POSTGRES_METADATA"]

OPTIONS: tuple[Option, ...] = (
    Option(
        "dsn",
        "str",
        "postgresql://user[:password]@host[:port]/database[?sslmode=...]; put a password in ${ENV}",
        required=True,
    ),
    Option(
        "schema",
        "str",
        "PostgreSQL schema holding the tables (created and migrated at start); one per deployment",
        default="walstream",
    ),
    Option("pool_min", "int", "connections kept open", default=1, minimum=0),
    Option(
        "pool_max",
        "int",
        "connections at most (concurrent calls beyond wait)",
        default=10,
        minimum=1,
    ),
    Option("connect_timeout", "duration", "bound of one connection attempt", default="5s"),
    Option(
        "command_timeout",
        "duration",
        "bound of one statement, on the client and (statement_timeout) on the server",
        default="10s",
    ),
    Option(
        "retry_for",
        "duration",
        "how long a call reconnects and retries (backoff up to 1s) while the server is "
        "unreachable, before BackendUnavailable",
        default="15s",
    ),
)


def _make(options: dict[str, Any], context: BuildContext) -> PostgresMetadataStore:
    check_dsn(options["dsn"])
    return PostgresMetadataStore(
        options["dsn"],
        schema=check_schema_name(options["schema"]),
        pool_min=options["pool_min"],
        pool_max=options["pool_max"],
        connect_timeout_s=options["connect_timeout"],
        command_timeout_s=options["command_timeout"],
        retry_for_s=options["retry_for"],
    )


_SERVER: Any = None
_SCHEMAS = itertools.count(1)


def _shared_server() -> Any:
    """One throwaway server per process (stopped and removed at exit)."""
    global _SERVER
    if _SERVER is None:
        from .testing.server import PostgresServer

        server = PostgresServer()
        server.start()
        atexit.register(server.remove)
        _SERVER = server
    return _SERVER


@contextlib.contextmanager
def _provision(folder: Path) -> Iterator[dict[str, Any]]:
    """A fresh schema on this process's throwaway PostgreSQL server; dropped afterwards."""
    server = _shared_server()
    schema = f"conformance_{os.getpid()}_{next(_SCHEMAS)}"
    try:
        yield {"dsn": server.dsn, "schema": schema}
    finally:
        if server.running:
            with contextlib.suppress(Exception):
                server.sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


POSTGRES_METADATA: BackendFactory[PostgresMetadataStore] = BackendFactory(
    kind="metadata",
    name="postgres",
    description="metadata in PostgreSQL (several machines share one catalogue)",
    options=OPTIONS,
    create=_make,
    provision=_provision,
)
