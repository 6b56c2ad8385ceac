"""Object storage: the contract (``contract``) and the reference stores (``memory``, ``local``).
"""

from walstream.objects.contract import (
    BufferedObjectWriter,
    ObjectMeta,
    ObjectStore,
    ObjectStoreCapabilities,
    ObjectWriter,
)

__all__ = [
    "BufferedObjectWriter",
    "ObjectMeta",
    "ObjectStore",
    "ObjectStoreCapabilities",
    "ObjectWriter",
]
