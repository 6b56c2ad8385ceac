"""HPACK for the native HTTP/2 connection, cheaper per request than ``hpack``'s own coders (which
``h2`` uses by default), plugged into ``h2`` through its ``encoder`` and ``decoder`` attributes.

- :class:`LiteralEncoder` never adds to the dynamic table (RFC 7541 6.2.2, literal without
  indexing; a field of the static table is indexed): the encoding of a field does not depend on
  any state, so each is built once and reused from a bounded cache. Answers repeat the same few
  fields (``:status``, ``content-type``, ``content-length``); a header block costs a dict lookup
  per field instead of a table search and Huffman coding. A table size the client lowers
  (SETTINGS_HEADER_TABLE_SIZE) is still acknowledged at the start of the next block, as RFC 7541
  4.2 requires.
- :class:`CachingDecoder` is ``hpack``'s decoder with a bounded cache of decoded blocks, keyed
  by the block and the generation of its dynamic table (which any insertion or resize advances):
  a block decoded without changing the table decodes to the same list as long as the table is
  the same. Clients on ``h2`` (S2's Python SDK) send a repeated request as one identical block
  of indexed fields, which is then a dict lookup. A block that inserts (new values) is decoded
  as before.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hpack import Decoder, Encoder
from hpack.table import HeaderTable

__all__ = ["CachingDecoder", "LiteralEncoder"]

#: Fields (encoder) and blocks (decoder) each coder keeps; it forgets all of them beyond this.
CACHE_ENTRIES = 512
#: Only blocks (decoder) and fields (encoder) up to this size are cached: a connection's caches
#: hold at most CACHE_ENTRIES x this (and the decoded lists, bounded alike), whatever the client
#: sends.
CACHED_BYTES = 1024

_STATIC_FIELDS: dict[tuple[bytes, bytes], int] = {}
_STATIC_NAMES: dict[bytes, int] = {}
for _index, (_name, _value) in enumerate(HeaderTable.STATIC_TABLE, 1):
    _STATIC_FIELDS.setdefault((_name, _value), _index)
    _STATIC_NAMES.setdefault(_name, _index)


def _integer(value: int, prefix_bits: int, flags: int) -> bytes:
    """RFC 7541 5.1."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((flags | value,))
    out = bytearray((flags | limit,))
    value -= limit
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(name: bytes, value: bytes) -> bytes:
    index = _STATIC_FIELDS.get((name, value))
    if index is not None:
        return _integer(index, 7, 0x80)  # indexed field (6.1)
    value_part = _integer(len(value), 7, 0) + value  # raw string (no Huffman)
    name_index = _STATIC_NAMES.get(name)
    if name_index is not None:
        return _integer(name_index, 4, 0) + value_part  # literal without indexing, name indexed
    return b"\x00" + _integer(len(name), 7, 0) + name + value_part


class LiteralEncoder(Encoder):
    """Encodes without the dynamic table (see the module's docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.fields: dict[tuple[bytes, bytes], bytes] = {}

    def encode(self, headers: Any, huffman: bool = True) -> bytes:
        parts: list[bytes] = []
        table = self.header_table
        if table.resized:  # the client lowered SETTINGS_HEADER_TABLE_SIZE: say we follow
            parts.extend(_integer(size, 5, 0x20) for size in self.table_size_changes)
            self.table_size_changes = []
            table.resized = False
        fields = self.fields
        for name, value in headers:
            encoded = fields.get((name, value))
            if encoded is None:
                encoded = _field(name, value)
                if len(encoded) <= CACHED_BYTES:
                    if len(fields) >= CACHE_ENTRIES:
                        fields.clear()
                    fields[(name, value)] = encoded
            parts.append(encoded)
        return b"".join(parts)


class _CountingTable(HeaderTable):
    """A dynamic table that counts its changes (insertions, resizes)."""

    def __init__(self) -> None:
        super().__init__()
        self.generation = 0

    def add(self, name: bytes, value: bytes) -> None:
        self.generation += 1
        super().add(name, value)

    @property
    def maxsize(self) -> int:
        return HeaderTable.maxsize.fget(self)  # type: ignore[attr-defined,no-any-return]

    @maxsize.setter
    def maxsize(self, newmax: int) -> None:
        self.generation += 1
        HeaderTable.maxsize.fset(self, newmax)  # type: ignore[attr-defined]


class CachingDecoder(Decoder):
    """``hpack``'s decoder with a cache of blocks (see the module's docstring)."""

    def __init__(self, max_header_list_size: int) -> None:
        super().__init__(max_header_list_size)
        self.header_table = _CountingTable()
        self.blocks: dict[tuple[int, bytes], Any] = {}

    def decode(self, data: bytes, raw: bool = False) -> Iterable[Any]:
        table = self.header_table
        assert isinstance(table, _CountingTable)
        if len(data) > CACHED_BYTES:
            return super().decode(data, raw)
        generation = table.generation
        key = (generation, bytes(data))
        known = self.blocks.get(key)
        if known is not None and raw:
            return known  # type: ignore[no-any-return]
        headers = super().decode(data, raw)
        if raw and table.generation == generation:
            if len(self.blocks) >= CACHE_ENTRIES:
                self.blocks.clear()
            self.blocks[key] = headers
        return headers
