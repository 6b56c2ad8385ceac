"""Compressed bodies of the S2 API: ``gzip`` and ``zstd``, both ways, as S2's server does.

**Requests.** A body with ``Content-Encoding: gzip`` or ``zstd`` (``identity`` or none: as
sent) is decompressed before it is read as JSON or protobuf; any other coding answers 415
``invalid``. Decompression is bounded: it stops one byte past the body limit
(``server.max_body_bytes``) and answers 413, so a small body that expands without end (a
"zip bomb") costs at most the limit in memory. A body that is not valid for its coding answers
400 ``invalid``.

**Answers.** When the request's ``Accept-Encoding`` names ``zstd`` or ``gzip`` (zstd preferred
at equal quality, ``q=0`` refuses a coding) an answer of at least :data:`THRESHOLD_BYTES` is
compressed with it and says so in ``Content-Encoding`` (S2: tower-http's compression layer
with ``SizeAbove(1024)``). SSE streams and S2S sessions are not compressed as a whole.

**S2S messages.** The flag byte of a session message carries its compression (``01`` zstd,
``10`` gzip). A client's compressed message is decompressed under the message bound; the
server compresses the messages it sends with the coding the session's ``Accept-Encoding``
names (S2: ``CompressionAlgorithm::from_accept_encoding``, zstd first), when they are at least
:data:`THRESHOLD_BYTES`.
"""

from __future__ import annotations

import enum
import gzip
import io
import zlib

import zstandard

from walstream.server.s2.errors import S2Error

__all__ = [
    "THRESHOLD_BYTES",
    "Coding",
    "answer_coding",
    "compress",
    "decompress",
    "request_coding",
]

THRESHOLD_BYTES = 1024
"""Answers and S2S messages smaller than this go uncompressed (S2's threshold)."""


class Coding(enum.IntEnum):
    """A content coding, numbered as in the S2S flag byte's two compression bits."""

    NONE = 0
    ZSTD = 1
    GZIP = 2

    @property
    def token(self) -> bytes:
        """The coding's name in ``Content-Encoding``."""
        return {Coding.NONE: b"identity", Coding.ZSTD: b"zstd", Coding.GZIP: b"gzip"}[self]


def request_coding(content_encoding: str | None) -> Coding:
    """The coding of a request body (415 for one this server cannot decode)."""
    value = (content_encoding or "").strip().lower()
    if value in ("", "identity"):
        return Coding.NONE
    if value == "gzip" or value == "x-gzip":
        return Coding.GZIP
    if value == "zstd":
        return Coding.ZSTD
    raise S2Error(
        415,
        "invalid",
        f"content-encoding {value[:40]!r} is not supported: send gzip, zstd or identity",
    )


def answer_coding(accept_encoding: str | None) -> Coding:
    """The coding to answer with for an ``Accept-Encoding`` value: the one of zstd and gzip
    with the highest quality above 0 (zstd at equal quality), else none."""
    if not accept_encoding:
        return Coding.NONE
    best, best_quality = Coding.NONE, 0.0
    for item in accept_encoding.split(","):
        name, *params = (part.strip() for part in item.split(";"))
        coding = {"zstd": Coding.ZSTD, "gzip": Coding.GZIP, "x-gzip": Coding.GZIP}.get(name.lower())
        if coding is None:
            continue
        quality = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0
        if quality > best_quality or (
            quality == best_quality and best is Coding.GZIP and coding is Coding.ZSTD
        ):
            best, best_quality = coding, quality
    return best


def compress(data: bytes, coding: Coding) -> bytes:
    if coding is Coding.ZSTD:
        return zstandard.ZstdCompressor(level=3).compress(data)
    if coding is Coding.GZIP:
        return gzip.compress(data, compresslevel=6, mtime=0)
    return data


def decompress(data: bytes, coding: Coding, limit: int, what: str = "the request body") -> bytes:
    """``data`` decoded: 413 as soon as it would exceed ``limit`` bytes (holding at most
    ``limit`` bytes of output meanwhile, in pieces), 400 ``invalid`` when it is not valid
    ``coding`` data."""
    if coding is Coding.NONE:
        return data
    pieces: list[bytes] = []
    try:
        if coding is Coding.GZIP:
            complete = _gunzip(data, limit, pieces)
        else:
            complete = _unzstd(data, limit, pieces)
    except (zlib.error, zstandard.ZstdError, EOFError) as error:
        raise S2Error(
            400, "invalid", f"{what} is not valid {coding.token.decode()} data: {error}"
        ) from None
    if not complete:
        pieces.clear()
        raise S2Error(
            413,
            "invalid",
            f"{what} decompresses to over {limit} bytes (server.max_body_bytes); send less at once",
        )
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


_PIECE_BYTES = 1 << 20


def _gunzip(data: bytes, limit: int, pieces: list[bytes]) -> bool:
    """gzip members one after another (as ``gzip.decompress``) into ``pieces``, a megabyte at
    a time; False once the output passes ``limit``."""
    size = 0
    rest = data
    while rest:
        decoder = zlib.decompressobj(wbits=31)
        pending = rest
        while True:
            piece = decoder.decompress(pending, _PIECE_BYTES)
            size += len(piece)
            if size > limit:
                return False
            if piece:
                pieces.append(piece)
            pending = decoder.unconsumed_tail
            if decoder.eof or (not pending and not piece):
                break
        if not decoder.eof:
            raise EOFError("the gzip data ends early")
        rest = decoder.unused_data
    return True


def _unzstd(data: bytes, limit: int, pieces: list[bytes]) -> bool:
    """zstd frames one after another into ``pieces``, a megabyte at a time; False once the
    output passes ``limit``."""
    size = 0
    decompressor = zstandard.ZstdDecompressor()
    with decompressor.stream_reader(io.BytesIO(data), read_across_frames=True) as reader:
        while True:
            piece = reader.read(_PIECE_BYTES)
            if not piece:
                break
            size += len(piece)
            if size > limit:
                return False
            pieces.append(piece)
    # The reader ends quietly at a cut frame: check that each frame is whole. The output is
    # known to be within the limit now, so decoding it again at once is bounded too.
    rest = data
    while rest:
        frame = zstandard.ZstdDecompressor().decompressobj()
        frame.decompress(rest)
        if not frame.eof:
            raise EOFError("the zstd data ends early")
        rest = frame.unused_data
    return True
