"""The native HTTP/2 connection's HPACK coders (:mod:`walstream.server.http.header_codec`)
decode and encode exactly as ``hpack``'s own: checked against them on the same blocks."""

from __future__ import annotations

import random

from hpack import Decoder, Encoder
from walstream.server.http.header_codec import CachingDecoder, LiteralEncoder


def test_the_literal_encoder_is_read_back_by_hpack_and_keeps_no_table() -> None:
    encoder, decoder = LiteralEncoder(), Decoder()
    blocks = [
        [(b":status", b"200"), (b"content-type", b"application/json"), (b"content-length", b"12")],
        [(b":status", b"404"), (b"x-custom", b"v" * 200), (b"content-length", b"0")],
        [(b":status", b"200"), (b"content-type", b"application/json"), (b"content-length", b"12")],
    ]
    for block in blocks:
        assert decoder.decode(encoder.encode(block), raw=True) == block
    assert len(decoder.header_table.dynamic_entries) == 0  # nothing was indexed
    # A smaller table the client asks for is acknowledged at the start of the next block.
    encoder.header_table_size = 0
    encoded = encoder.encode(blocks[0])
    assert encoded[:1] == b"\x20"  # dynamic table size update to 0
    decoder.max_allowed_table_size = 0
    assert decoder.decode(encoded, raw=True) == blocks[0]
    assert encoder.encode(blocks[0])[:1] != b"\x20"  # once


def test_the_caching_decoder_agrees_with_hpack_as_the_table_changes() -> None:
    """Blocks from an indexing encoder, repeated while the dynamic table changes under them: a
    block that refers to a dynamic entry must decode to the entry of that moment."""
    rng = random.Random(5)
    encoder, plain, cached = Encoder(), Decoder(), CachingDecoder(1 << 16)
    names = [b"s2-basin", b"content-length", b"x-a", b"authorization"]
    history: list[bytes] = []
    for _ in range(400):
        if history and rng.random() < 0.5:
            block = rng.choice(history)  # as sent before: may refer to entries since evicted
            if plain.header_table_size != cached.header_table_size:
                raise AssertionError("tables diverged")
        else:
            fields = [(b":method", b"POST"), (b":path", b"/v1/streams/s/records")]
            fields += [(name, b"%d" % rng.randrange(6)) for name in rng.sample(names, 3)]
            block = encoder.encode(fields)
            history.append(block)
        try:
            expected = plain.decode(block, raw=True)
        except Exception as error:  # an old block whose index is gone now
            try:
                cached.decode(block, raw=True)
            except Exception as cached_error:
                assert type(cached_error) is type(error)
                continue
            raise AssertionError("the caching decoder decoded what hpack refuses") from error
        assert cached.decode(block, raw=True) == expected
    assert cached.blocks  # repeated blocks were served from the cache
