"""Bounding an HTTP/2 header block as its frames arrive, before ``h2`` buffers them.

``h2`` assembles a header block (HEADERS or PUSH_PROMISE, then CONTINUATION frames until
END_HEADERS) before it decodes it, and bounds only the number of CONTINUATION frames (64). With
frames as large as the listener allows (``MAX_FRAME_SIZE`` 1 MiB, so that a large append is one
DATA frame), a block could reach 64 MiB before ``h2`` refuses it. :class:`HeaderBlockGuard`
follows the frame boundaries of the byte stream (9-byte frame headers, RFC 9113 4.1) with a few
integer operations per frame, independently of ``h2``'s internals, and reports a block that
passes its bound as its frames arrive.
"""

from __future__ import annotations

__all__ = ["HeaderBlockGuard"]

_FRAME_HEAD = 9
_HEADERS = 0x1
_PUSH_PROMISE = 0x5
_CONTINUATION = 0x9
_END_HEADERS = 0x4


class HeaderBlockGuard:
    """Feed it what the connection receives after the client preface; :meth:`feed` returns
    False once a header block in progress is larger than ``limit_bytes``."""

    __slots__ = ("block", "head", "limit", "skip")

    def __init__(self, limit_bytes: int) -> None:
        self.limit = limit_bytes
        self.skip = 0
        """Payload bytes of the current frame still to come."""
        self.head = b""
        """The start of a frame header cut by the end of a chunk."""
        self.block = -1
        """Bytes of the header block in progress (-1: none)."""

    def feed(self, data: bytes) -> bool:
        if self.block > self.limit:
            return False  # refused already: it stays refused
        size = len(data)
        position = 0
        while position < size:
            skip = self.skip
            if skip:
                taken = min(skip, size - position)
                self.skip = skip - taken
                position += taken
                continue
            if self.head or size - position < _FRAME_HEAD:
                wanted = _FRAME_HEAD - len(self.head)
                self.head += data[position : position + wanted]
                position += wanted
                if len(self.head) < _FRAME_HEAD:
                    return True
                head, self.head = self.head, b""
                length = int.from_bytes(head[:3], "big")
                kind, flags = head[3], head[4]
            else:
                length = int.from_bytes(data[position : position + 3], "big")
                kind, flags = data[position + 3], data[position + 4]
                position += _FRAME_HEAD
            if kind == _HEADERS or kind == _PUSH_PROMISE:
                self.block = length
            elif kind == _CONTINUATION and self.block >= 0:
                self.block += length
            if self.block >= 0:
                if self.block > self.limit:
                    return False
                if flags & _END_HEADERS:
                    self.block = -1
            self.skip = length
        return True
