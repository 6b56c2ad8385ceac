"""Metadata: the contract (``contract``), the pure rules every store runs (``rules``), and the
reference stores (``memory``, ``sqlite``).
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
