"""The SQL metadata stores' shared base: the logic and SQL of every operation, written once.

- :mod:`.store` — :class:`SqlMetadataStore`, the :class:`~walstream.metadata.MetadataStore` over
  any dialect (streams, objects, data loss; nodes and leases in :mod:`.nodes`, basins in
  :mod:`.basins`, key/value in :mod:`.kv`), running the shared rules of
  :mod:`walstream.metadata.rules`;
- :mod:`.tables` — row access inside one transaction, and the lock order;
- :mod:`.migrations` — the schema's numbered migrations, applied at open on every dialect;
- :mod:`.dialect` — :class:`Dialect`, what differs per database (connections, transactions and
  retries, error translation, placeholders, row locks, id allocation, the store's clock).

The dialects: :mod:`walstream.metadata.sqlite` (in core) and ``walstream_metadata_postgres``
(its own dist, so core never imports asyncpg).
"""

from walstream.metadata.sql.dialect import Connection, Dialect, Lock, Row
from walstream.metadata.sql.store import SqlMetadataStore
from walstream.metadata.sql.tables import Tables

__all__ = ["Connection", "Dialect", "Lock", "Row", "SqlMetadataStore", "Tables"]
