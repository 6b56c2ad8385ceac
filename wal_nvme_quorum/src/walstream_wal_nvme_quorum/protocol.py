"""The chunk-server wire protocol: length-prefixed binary frames over TCP (see wal_nvme_quorum/README.md).

Every frame, in both directions, is::

    length u32 | code u8 | request_id u32 | body | crc32c u32

``length`` counts the bytes after itself; ``code`` is the operation in a request and the status
in a reply; the CRC32C covers ``code``, ``request_id`` and ``body`` (a CRC trailer of
:mod:`walstream.format.frames`). All integers big-endian.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterator
from dataclasses import dataclass

from walstream.format.frames import CRC_BYTES, crc_trailer_ok, with_crc
from walstream.records import DEPLOYMENT_ID_BYTES
from walstream.wal.quorum import ChunkInfo, LogIdentity, LogListing, Seal

__all__ = [
    "DEFAULT_MAX_FRAME_BYTES",
    "FRAME_OVERHEAD",
    "FRAME_PREFIX",
    "MIN_FRAME_LENGTH",
    "BodyReader",
    "Frame",
    "FrameError",
    "FrameLengthError",
    "FrameReader",
    "Op",
    "Status",
    "decode_identity",
    "decode_listing",
    "encode_frame",
    "encode_identity",
    "encode_listing",
    "pack_str",
    "parse_frame",
]

FRAME_PREFIX = struct.Struct(">I")
_FRAME_HEAD = struct.Struct(">BI")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")
#: code + request_id + crc: the smallest legal value of ``length``.
MIN_FRAME_LENGTH = _FRAME_HEAD.size + CRC_BYTES
FRAME_OVERHEAD = FRAME_PREFIX.size + MIN_FRAME_LENGTH
DEFAULT_MAX_FRAME_BYTES = (16 << 20) + 4096
MAX_LOG_ID_BYTES = 255


class Op(enum.IntEnum):
    HELLO = 1  # body: token bytes
    CLAIM = 2  # log_id, epoch u64 -> listing
    LIST = 3  # log_id -> listing
    WRITE = 4  # log_id, epoch u64, seq u64, data_crc u32, data
    READ = 5  # log_id, seq u64 -> epoch u64, data
    SEAL = 6  # log_id, epoch u64, end_seq u64
    TRIM = 7  # log_id, epoch u64, through_seq u64, trim_offset i64
    PING = 8  # -> empty
    # Protocol version 2: identity (a server of version 1 answers BAD_REQUEST to these).
    CLAIM_IDENTIFIED = 9  # log_id, epoch u64, deployment_id 16, node_id u64 -> listing2
    LIST_IDENTIFIED = 10  # log_id -> listing2


class Status(enum.IntEnum):
    OK = 0
    FENCED = 1  # body: claimed_epoch u64, message
    NOT_FOUND = 2
    CONFLICT = 3
    BAD_REQUEST = 4
    UNAUTHORIZED = 5
    CORRUPT = 6
    INTERNAL = 7
    IDENTITY_MISMATCH = 8  # version 2: the log belongs to another deployment or node


class FrameError(ValueError):
    """A frame that cannot be parsed; the message says what was wrong."""


@dataclass(frozen=True, slots=True)
class Frame:
    code: int
    request_id: int
    body: bytes


def encode_frame(code: int, request_id: int, body: bytes = b"") -> bytes:
    head = _FRAME_HEAD.pack(code, request_id)
    return FRAME_PREFIX.pack(len(head) + len(body) + CRC_BYTES) + with_crc(head, body)


def parse_frame(payload: bytes, start: int = 0, end: int | None = None) -> Frame:
    """Parse the bytes after the length prefix (``payload[start:end]``, so that a receive
    buffer holding several frames is not copied per frame); :class:`FrameError` when they are
    damaged."""
    stop = len(payload) if end is None else end
    if stop - start < MIN_FRAME_LENGTH:
        raise FrameError(f"frame of {stop - start} bytes is shorter than {MIN_FRAME_LENGTH}")
    if not crc_trailer_ok(payload, start, stop):
        raise FrameError("frame checksum mismatch")
    code, request_id = _FRAME_HEAD.unpack_from(payload, start)
    return Frame(code, request_id, payload[start + _FRAME_HEAD.size : stop - CRC_BYTES])


class FrameLengthError(FrameError):
    """A length prefix no frame can have (below the smallest frame or over the bound): the
    stream cannot be resynchronised, the connection must end."""

    def __init__(self, length: int, max_length: int) -> None:
        super().__init__(f"frame length {length} outside {MIN_FRAME_LENGTH}..{max_length}")
        self.length = length


class FrameReader:
    """Splits the bytes a connection receives into frames, keeping a partial frame until the
    rest arrives (both ends of the protocol use one per connection)."""

    def __init__(self, max_length: int) -> None:
        self.max_length = max_length
        self._buffer = bytearray()

    @property
    def buffered(self) -> int:
        """Bytes of a frame not complete yet (0: the stream is between frames)."""
        return len(self._buffer)

    def clear(self) -> None:
        self._buffer.clear()

    def feed(self, data: bytes) -> Iterator[Frame | FrameError]:
        """Each frame ``data`` completes, in order: a :class:`Frame`, or the
        :class:`FrameError` of a damaged one (its length was sound: the next frame follows it).
        Raises :class:`FrameLengthError` at an impossible length prefix. The rest of a partial
        frame is kept once the iteration is complete (a caller that stops early, its connection
        ending, drops it)."""
        if self._buffer:
            self._buffer += data
            data = bytes(self._buffer)
            self._buffer.clear()
        position, size = 0, len(data)
        while size - position >= FRAME_PREFIX.size:
            (length,) = FRAME_PREFIX.unpack_from(data, position)
            if length < MIN_FRAME_LENGTH or length > self.max_length:
                raise FrameLengthError(length, self.max_length)
            start = position + FRAME_PREFIX.size
            end = start + length
            if end > size:
                break
            position = end
            try:
                frame: Frame | FrameError = parse_frame(data, start, end)
            except FrameError as exc:
                frame = exc
            yield frame
        # Kept only when every frame was taken: a reader that stops early ends its connection.
        if position < size:
            self._buffer += data[position:] if position else data


def pack_str(text: str) -> bytes:
    raw = text.encode()
    if len(raw) > MAX_LOG_ID_BYTES:
        raise ValueError(f"log id longer than {MAX_LOG_ID_BYTES} bytes")
    return _U16.pack(len(raw)) + raw


class BodyReader:
    """Reads fields off a body; any overrun raises :class:`FrameError`."""

    def __init__(self, body: bytes) -> None:
        self._body = body
        self._position = 0

    def _take(self, size: int) -> bytes:
        end = self._position + size
        if size < 0 or end > len(self._body):
            raise FrameError("body shorter than its fields")
        data = self._body[self._position : end]
        self._position = end
        return data

    def take(self, size: int) -> bytes:
        return self._take(size)

    def u8(self) -> int:
        return self._take(1)[0]

    def u32(self) -> int:
        return int(_U32.unpack(self._take(4))[0])

    def u64(self) -> int:
        return int(_U64.unpack(self._take(8))[0])

    def i64(self) -> int:
        return int(_I64.unpack(self._take(8))[0])

    def string(self) -> str:
        (length,) = _U16.unpack(self._take(2))
        if length == 0 or length > MAX_LOG_ID_BYTES:
            raise FrameError(f"log id of {length} bytes (1..{MAX_LOG_ID_BYTES} allowed)")
        try:
            return self._take(length).decode()
        except UnicodeDecodeError:
            raise FrameError("log id is not UTF-8") from None

    def rest(self) -> bytes:
        data = self._body[self._position :]
        self._position = len(self._body)
        return data

    def end(self) -> None:
        if self._position != len(self._body):
            raise FrameError(f"{len(self._body) - self._position} unexpected bytes after the body")


_CHUNK_ENTRY = struct.Struct(">QQII")
_SEAL_ENTRY = struct.Struct(">QQ")
_LISTING_HEAD = struct.Struct(">QQq")


_NO_DEPLOYMENT = bytes(DEPLOYMENT_ID_BYTES)


def encode_identity(identity: LogIdentity | None) -> bytes:
    """``deployment_id 16 | node_id u64``; all zero for "no identity"."""
    if identity is None:
        return _NO_DEPLOYMENT + _U64.pack(0)
    return identity.deployment_id + _U64.pack(identity.node_id)


def decode_identity(reader: BodyReader) -> LogIdentity | None:
    deployment_id = reader.take(DEPLOYMENT_ID_BYTES)
    node_id = reader.u64()
    return None if deployment_id == _NO_DEPLOYMENT else LogIdentity(deployment_id, node_id)


def encode_listing(listing: LogListing, *, identified: bool = False) -> bytes:
    """Listing (version 1) or listing2 (``identified``: the identity appended)."""
    parts = [
        _LISTING_HEAD.pack(listing.claimed_epoch, listing.trim_seq, listing.trim_offset),
        _U32.pack(len(listing.seals)),
    ]
    parts.extend(_SEAL_ENTRY.pack(seal.epoch, seal.end_seq) for seal in listing.seals)
    parts.append(_U32.pack(len(listing.chunks)))
    parts.extend(
        _CHUNK_ENTRY.pack(chunk.seq, chunk.epoch, chunk.size, chunk.crc)
        for chunk in sorted(listing.chunks.values(), key=lambda chunk: chunk.seq)
    )
    if identified:
        parts.append(encode_identity(listing.identity))
        parts.append(bytes([1 if listing.incomplete else 0]))
    return b"".join(parts)


def decode_listing(body: bytes, *, identified: bool = False) -> LogListing:
    try:
        claimed_epoch, trim_seq, trim_offset = _LISTING_HEAD.unpack_from(body, 0)
        position = _LISTING_HEAD.size
        (seal_count,) = _U32.unpack_from(body, position)
        position += 4
        seals = []
        for _ in range(seal_count):
            epoch, end_seq = _SEAL_ENTRY.unpack_from(body, position)
            seals.append(Seal(epoch, end_seq))
            position += _SEAL_ENTRY.size
        (chunk_count,) = _U32.unpack_from(body, position)
        position += 4
        chunks = {}
        for _ in range(chunk_count):
            seq, epoch, size, crc = _CHUNK_ENTRY.unpack_from(body, position)
            chunks[seq] = ChunkInfo(seq, epoch, size, crc)
            position += _CHUNK_ENTRY.size
    except struct.error as exc:
        raise FrameError(f"malformed listing: {exc}") from None
    identity = None
    incomplete = False
    if identified:
        reader = BodyReader(body[position:])
        identity = decode_identity(reader)
        incomplete = bool(reader.u8() & 1)
        reader.end()
    elif position != len(body):
        raise FrameError("listing has trailing bytes")
    return LogListing(
        claimed_epoch, trim_seq, trim_offset, tuple(seals), chunks, identity, incomplete
    )


def pack_u64(*values: int) -> bytes:
    return b"".join(_U64.pack(value) for value in values)


def pack_i64(value: int) -> bytes:
    return _I64.pack(value)


def pack_u32(value: int) -> bytes:
    return _U32.pack(value)
