"""Test rigs of the PostgreSQL metadata store: a throwaway PostgreSQL server.

:mod:`.server` holds the server (no pytest); :mod:`.fixtures` holds the pytest fixtures over it
and is the only module here that imports pytest.
"""

from __future__ import annotations

from .server import PostgresServer, find_postgres_bin

__all__ = ["PostgresServer", "find_postgres_bin"]
