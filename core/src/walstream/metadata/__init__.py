"""Metadata: the contract (``contract``), the pure rules every store runs (``rules``), the
in-memory store (``memory``), and the SQL stores' shared base (``sql``) with its SQLite dialect
(``sqlite``); PostgreSQL's dialect is the ``walstream-metadata-postgres`` dist. How they keep the
contract: docs/architecture/metadata.md.
"""

from walstream.metadata.contract import (
    BasinInfo,
    DataLossGap,
    KvEntry,
    KvValue,
    MetadataStore,
    NodeInfo,
    NodeState,
    ObjectCommit,
    ObjectInfo,
    ObjectKind,
    ObjectState,
    StreamInfo,
    StreamRange,
    StreamState,
)

__all__ = [
    "BasinInfo",
    "DataLossGap",
    "KvEntry",
    "KvValue",
    "MetadataStore",
    "NodeInfo",
    "NodeState",
    "ObjectCommit",
    "ObjectInfo",
    "ObjectKind",
    "ObjectState",
    "StreamInfo",
    "StreamRange",
    "StreamState",
]
