"""Object-store keys of uploaded objects: where an object of a deployment is stored.

Metadata records each object's key, so a reader never derives one; these functions name new
objects (:func:`object_key`), find objects of ids prepared by older versions
(:func:`legacy_object_key`), and tell which keys must hold an object that carries its identity
(:func:`is_identity_key`).
"""

from __future__ import annotations

import hashlib
import re

from walstream.errors import InvalidArgument
from walstream.records import DEPLOYMENT_ID_BYTES

__all__ = ["DEPLOYMENT_TAG_CHARS", "is_identity_key", "legacy_object_key", "object_key"]

DEPLOYMENT_TAG_CHARS = 16
"""Hex characters of the deployment id in an object key (64 bits: two deployments sharing a
bucket or folder never meet on a key; the footer identity catches even that)."""
_IDENTITY_KEY = re.compile(r"(?:^|/)[0-9a-f]{16}-[0-9a-f]{16}\.wso$")


def object_key(object_id: int, deployment_id: bytes, prefix: str = "") -> str:
    """The key of object ``object_id`` of deployment ``deployment_id``:
    ``{prefix}{h0}/{h1}/{deployment tag}-{object id}.wso``.

    The two folders come from a hash of the deployment and object id, so that keys of
    consecutive ids land in different folders (object stores partition by key prefix); the name
    carries the deployment so that deployments sharing a bucket or folder never share a key.
    Metadata stores each object's key, so objects written under :func:`legacy_object_key` stay
    readable.
    """
    if not 0 <= object_id < 2**64:
        raise InvalidArgument(f"object ids are in [0, 2**64), got {object_id}")
    if len(deployment_id) != DEPLOYMENT_ID_BYTES:
        raise InvalidArgument(
            f"a deployment id is {DEPLOYMENT_ID_BYTES} bytes, got {len(deployment_id)}"
        )
    tag = deployment_id.hex()[:DEPLOYMENT_TAG_CHARS]
    digest = hashlib.blake2b(
        deployment_id + object_id.to_bytes(8, "big"), digest_size=8
    ).hexdigest()
    return f"{prefix}{digest[:2]}/{digest[2:4]}/{tag}-{object_id:016x}.wso"


def legacy_object_key(object_id: int, prefix: str = "") -> str:
    """The key objects had before keys carried the deployment (format version 1 objects):
    still found through metadata, and by garbage collection of ids prepared before an
    upgrade."""
    if not 0 <= object_id < 2**64:
        raise InvalidArgument(f"object ids are in [0, 2**64), got {object_id}")
    digest = hashlib.blake2b(object_id.to_bytes(8, "big"), digest_size=8).hexdigest()
    return f"{prefix}{digest[:2]}/{digest[2:4]}/{object_id:016x}.wso"


def is_identity_key(key: str) -> bool:
    """True for keys made by :func:`object_key`: the object under them must carry an identity."""
    return _IDENTITY_KEY.search(key) is not None
