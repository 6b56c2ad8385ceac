"""The S3 WAL's object layout (docs/architecture/wal-plugins.md): WAL objects, epoch markers and the key names under
``<prefix>wal/<node_id>/``. Pure encoding and decoding; the WAL that reads and writes them is
:mod:`walstream_wal_s3.wal`.

**WAL objects** (:func:`encode_wal_object`) start with a CRC32C-protected header: magic, format
version, node id, epoch, first offset, record count, body length and body CRC32C; version 2 adds
the deployment id and the writer's ``durable_before`` attestation. The body is a record table of
:mod:`walstream.format.frames`. :func:`decode_wal_header` reads formats 1 and 2.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

import crc32c
from walstream.errors import (
    CorruptionError,
    InvalidArgument,
)
from walstream.format.frames import (
    CRC_BYTES,
    TableErrors,
    crc_trailer_ok,
    decode_record_table,
    encode_record_table,
    with_crc,
)
from walstream.records import DEPLOYMENT_ID_BYTES

__all__ = [
    "FORMAT_VERSION",
    "MAX_HEADER_BYTES",
    "WAL_OBJECT_MAGIC",
    "EpochMarker",
    "WalKeys",
    "WalObjectHeader",
    "WalObjectName",
    "decode_wal_header",
    "decode_wal_object",
    "encode_wal_object",
    "read_wal_object",
]

WAL_OBJECT_MAGIC = b"WSW1"
_HEADER_V1 = struct.Struct(">4sHHqqqIII")  # magic, version, flags, node, epoch, first, count,
#                                            body_len, body_crc
_HEADER_V2 = struct.Struct(">4sHHqqqIII16sq")  # ... + deployment id, durable_before
# After the header: its CRC32C (a frames CRC trailer); then the body, a frames record table.
_HEADERS = {1: _HEADER_V1, 2: _HEADER_V2}
_VERSION = struct.Struct(">H")
FORMAT_VERSION = 2
"""The WAL object format this code writes; :func:`decode_wal_header` reads 1 and 2."""
MAX_HEADER_BYTES = max(header.size for header in _HEADERS.values()) + CRC_BYTES
_NO_DEPLOYMENT = bytes(DEPLOYMENT_ID_BYTES)


@dataclass(frozen=True)
class WalObjectHeader:
    """The checked header of a WAL object."""

    version: int
    node_id: int
    epoch: int
    first_offset: int
    count: int
    body_len: int
    body_crc: int
    deployment_id: bytes = b""
    """Empty for version 1 objects and for writers without a bound deployment."""
    durable_before: int | None = None
    """Every offset below was durable in the WAL when the object was written (version 2)."""

    @property
    def size(self) -> int:
        return _HEADERS[self.version].size + CRC_BYTES


def encode_wal_object(
    node_id: int,
    epoch: int,
    first_offset: int,
    payloads: Sequence[bytes],
    *,
    deployment_id: bytes = b"",
    durable_before: int = 0,
    version: int = FORMAT_VERSION,
) -> bytes:
    """One WAL object: a CRC32C-protected header, then ``len u32 | data`` per record (body
    CRC32C in the header). ``version=1`` writes the old format (no deployment id, no
    ``durable_before``), which readers still accept."""
    if deployment_id and len(deployment_id) != DEPLOYMENT_ID_BYTES:
        raise InvalidArgument(
            f"a deployment id has {DEPLOYMENT_ID_BYTES} bytes, got {len(deployment_id)}"
        )
    body = encode_record_table(payloads)
    common = (
        WAL_OBJECT_MAGIC,
        version,
        0,
        node_id,
        epoch,
        first_offset,
        len(payloads),
        len(body),
        crc32c.crc32c(body),
    )
    if version == 1:
        header = _HEADER_V1.pack(*common)
    elif version == 2:
        header = _HEADER_V2.pack(*common, deployment_id or _NO_DEPLOYMENT, durable_before)
    else:
        raise InvalidArgument(f"WAL object format version {version} is not 1 or 2")
    return with_crc(header) + body


def decode_wal_header(data: bytes, where: str = "WAL object") -> WalObjectHeader:
    """The header at the start of ``data`` (which may be just the first
    :data:`MAX_HEADER_BYTES`); :class:`CorruptionError` when it fails its checks."""
    if len(data) < len(WAL_OBJECT_MAGIC) + _VERSION.size:
        raise CorruptionError(f"{where}: {len(data)} bytes is shorter than a WAL object header")
    magic = bytes(data[: len(WAL_OBJECT_MAGIC)])
    (version,) = _VERSION.unpack_from(data, len(WAL_OBJECT_MAGIC))
    layout = _HEADERS.get(version)
    if magic != WAL_OBJECT_MAGIC or layout is None:
        raise CorruptionError(f"{where}: not a WAL object (magic {magic!r}, version {version})")
    if len(data) < layout.size + CRC_BYTES:
        raise CorruptionError(f"{where}: {len(data)} bytes is shorter than a WAL object header")
    if not crc_trailer_ok(data, 0, layout.size + CRC_BYTES):
        raise CorruptionError(f"{where}: header checksum mismatch")
    fields = layout.unpack_from(data)
    _, _, _, node_id, epoch, first, count, body_len, body_crc = fields[:9]
    deployment_id = b""
    durable_before: int | None = None
    if version >= 2:
        deployment_id = b"" if fields[9] == _NO_DEPLOYMENT else fields[9]
        durable_before = fields[10]
    return WalObjectHeader(
        version, node_id, epoch, first, count, body_len, body_crc, deployment_id, durable_before
    )


def read_wal_object(data: bytes, where: str = "WAL object") -> tuple[WalObjectHeader, list[bytes]]:
    """``(header, payloads)`` of a whole WAL object; :class:`CorruptionError` on bad bytes."""
    header = decode_wal_header(data, where)
    body = memoryview(data)[header.size :]
    body_len = header.body_len
    if len(body) != body_len or crc32c.crc32c(body) != header.body_crc:
        raise CorruptionError(f"{where}: body checksum or length mismatch")
    errors = TableErrors(
        length_overrun=f"{where}: record table overruns the body",
        payload_overrun=f"{where}: record overruns the body",
        trailing=f"{where}: {{count}} trailing bytes after the records",
    )
    return header, decode_record_table(body, header.count, errors)


def decode_wal_object(data: bytes, where: str = "WAL object") -> tuple[int, int, int, list[bytes]]:
    """``(node_id, epoch, first_offset, payloads)``; :class:`CorruptionError` on bad bytes."""
    header, payloads = read_wal_object(data, where)
    return header.node_id, header.epoch, header.first_offset, payloads


@dataclass(frozen=True)
class EpochMarker:
    """What an ``epochs/<epoch>`` marker says about the writer that claimed the epoch.

    Format 2 is one line of ``key=value`` words: ``walstream-s3-wal-epoch format=2 node=7
    epoch=3 mode=read_write deployment=<32 hex digits or none> max_inflight=8
    fence_lease_ms=1000 token=<hex>`` (the token makes every claim's bytes unique, so a retried
    conditional create that finds the marker can tell its own from a competitor's;
    ``fence_lease_ms``, the writer's fence lease, is absent for none). Format 1 markers hold
    ``node=7 epoch=3 mode=read_write`` and parse with an empty deployment id, no
    ``max_inflight`` and no lease.
    """

    node_id: int
    epoch: int
    deployment_id: bytes = b""
    max_inflight: int | None = None
    fence_lease_ms: int = 0

    def encode(self, mode: str, token: str) -> bytes:
        deployment = self.deployment_id.hex() if self.deployment_id else "none"
        return (
            f"walstream-s3-wal-epoch format=2 node={self.node_id} epoch={self.epoch} "
            f"mode={mode} deployment={deployment} "
            + (f"max_inflight={self.max_inflight} " if self.max_inflight else "")
            + (f"fence_lease_ms={self.fence_lease_ms} " if self.fence_lease_ms else "")
            + f"token={token}"
        ).encode()

    @classmethod
    def parse(cls, data: bytes, where: str) -> EpochMarker:
        try:
            words = data.decode("ascii").split()
            fields = dict(word.split("=", 1) for word in words if "=" in word)
            deployment = fields.get("deployment", "none")
            max_inflight = fields.get("max_inflight")
            return cls(
                node_id=int(fields["node"]),
                epoch=int(fields["epoch"]),
                deployment_id=b"" if deployment == "none" else bytes.fromhex(deployment),
                max_inflight=None if max_inflight is None else int(max_inflight),
                fence_lease_ms=int(fields.get("fence_lease_ms", "0")),
            )
        except (UnicodeDecodeError, KeyError, ValueError):
            raise CorruptionError(
                f"S3 WAL epoch marker {where} is not a walstream epoch marker: {data[:80]!r}"
            ) from None


@dataclass(frozen=True, order=True)
class WalObjectName:
    """What a data key says: records ``first..last`` (inclusive) written by ``epoch``."""

    first: int
    last: int
    epoch: int
    key: str = field(compare=False)


def _number(value: int) -> str:
    return f"{value:020d}"


@dataclass(frozen=True)
class WalKeys:
    """Object keys of one node's WAL (relative to the store's prefix)."""

    root: str

    @classmethod
    def for_node(cls, node_id: int) -> WalKeys:
        return cls(f"wal/{node_id}/")

    @property
    def epochs(self) -> str:
        return self.root + "epochs/"

    @property
    def bases(self) -> str:
        return self.root + "bases/"

    @property
    def data(self) -> str:
        return self.root + "data/"

    @property
    def releases(self) -> str:
        return self.root + "released/"

    @property
    def trims(self) -> str:
        return self.root + "trim/"

    def epoch(self, epoch: int) -> str:
        return self.epochs + _number(epoch)

    def base(self, epoch: int) -> str:
        return self.bases + _number(epoch)

    def release(self, epoch: int) -> str:
        return self.releases + _number(epoch)

    def trim(self, start: int) -> str:
        return self.trims + _number(start)

    def data_object(self, first: int, last: int, epoch: int) -> WalObjectName:
        key = f"{self.data}{_number(first)}-{_number(last)}-{_number(epoch)}"
        return WalObjectName(first, last, epoch, key)

    def data_starting_at(self, first: int) -> str:
        """The key prefix shared by every data object whose first offset is ``first``."""
        return f"{self.data}{_number(first)}-"

    def parse_data(self, key: str) -> WalObjectName | None:
        try:
            first, last, epoch = (int(part) for part in key[len(self.data) :].split("-"))
        except ValueError:
            return None
        if first < 0 or last < first or epoch < 0:
            return None
        return WalObjectName(first, last, epoch, key)

    def parse_number(self, key: str, folder: str) -> int | None:
        try:
            return int(key[len(folder) :])
        except ValueError:
            return None
