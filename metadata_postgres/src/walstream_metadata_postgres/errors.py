"""PostgreSQL (asyncpg) errors in walstream's taxonomy.

:func:`classify` sorts a driver error into what the store does with it:

- ``transient``: the server or the connection went away, is starting or shutting down, refused
  for too many connections, timed out, or the transaction lost a deadlock or serialization
  race. Nothing was applied (unless it happened while ``COMMIT`` was in flight, which the store
  reports as :class:`~walstream.errors.AmbiguousError`), so the store reconnects and retries
  with bounded backoff, then raises :class:`~walstream.errors.BackendUnavailable`;
- ``config``: authentication, a missing database, missing privileges: no retry helps, so
  :class:`~walstream.errors.ConfigError` naming the DSN's user, host and database;
- ``capacity``: the server's disk is full (:class:`~walstream.errors.CapacityError`);
- ``corrupt``: PostgreSQL reported damaged data (:class:`~walstream.errors.CorruptionError`);
- ``other``: anything else: :class:`~walstream.errors.BackendUnavailable` with the SQLSTATE.
"""

from __future__ import annotations

import asyncio
from typing import Literal

import asyncpg
from walstream.errors import (
    BackendUnavailable,
    CapacityError,
    ConfigError,
    CorruptionError,
    WalstreamError,
)

__all__ = ["Kind", "classify", "translate"]

Kind = Literal["transient", "config", "capacity", "corrupt", "other"]

# SQLSTATE classes and codes (https://www.postgresql.org/docs/current/errcodes-appendix.html).
_TRANSIENT_CLASSES = ("08",)  # connection exception
_TRANSIENT_CODES = frozenset(
    {
        "40001",  # serialization_failure
        "40P01",  # deadlock_detected
        "55P03",  # lock_not_available
        "57014",  # query_canceled (statement_timeout)
        "57P01",  # admin_shutdown
        "57P02",  # crash_shutdown
        "57P03",  # cannot_connect_now (starting up, recovering)
        "53300",  # too_many_connections
        "53200",  # out_of_memory
        "25006",  # read_only_sql_transaction (connected to a standby after a failover)
        "25P04",  # transaction_timeout / idle_in_transaction timeout
        "57P05",  # idle_session_timeout
    }
)
_CONFIG_CLASSES = ("28", "3D", "3F")  # authorization, invalid catalog / schema name
_CONFIG_CODES = frozenset({"42501"})  # insufficient_privilege
_CAPACITY_CODES = frozenset({"53100"})  # disk_full
_CORRUPT_CODES = frozenset({"XX001", "XX002"})  # data_corrupted, index_corrupted


def classify(error: BaseException) -> Kind:
    if isinstance(error, asyncpg.PostgresError):
        code = str(getattr(error, "sqlstate", "") or "")
        if code in _TRANSIENT_CODES or code.startswith(_TRANSIENT_CLASSES):
            return "transient"
        if code in _CONFIG_CODES or code.startswith(_CONFIG_CLASSES):
            return "config"
        if code in _CAPACITY_CODES:
            return "capacity"
        if code in _CORRUPT_CODES:
            return "corrupt"
        return "other"
    if isinstance(
        error,
        (
            asyncpg.InterfaceError,  # connection closed under us, pool closing
            asyncpg.exceptions.InternalClientError,
            OSError,  # refused, reset, unreachable (ConnectionError is an OSError)
            asyncio.TimeoutError,
            TimeoutError,
            EOFError,
        ),
    ):
        return "transient"
    return "other"


def translate(error: BaseException, where: str) -> WalstreamError:
    """The walstream error for ``error`` seen at ``where`` (``user@host:port/db schema s``)."""
    kind = classify(error)
    code = getattr(error, "sqlstate", None)
    detail = f"{type(error).__name__}{f' {code}' if code else ''}: {error}".rstrip(": ")
    if kind == "config":
        return ConfigError(
            f"metadata.dsn: PostgreSQL at {where} refused this client ({detail}); check the "
            "user, password, database name and the user's privileges in metadata.dsn"
        )
    if kind == "capacity":
        return CapacityError(
            f"PostgreSQL at {where} is out of disk ({detail}); free space on the database "
            "server, then retry"
        )
    if kind == "corrupt":
        return CorruptionError(
            f"PostgreSQL at {where} reported damaged data ({detail}); restore the database "
            "from a backup"
        )
    if kind == "transient":
        return BackendUnavailable(
            f"PostgreSQL at {where} is unreachable or busy ({detail}); the store retried "
            "with backoff until metadata.retry_for ran out: check the server, then retry"
        )
    return BackendUnavailable(
        f"PostgreSQL at {where} failed ({detail}); retry, and check the server log if it repeats"
    )
