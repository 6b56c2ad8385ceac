"""The key/value rules every store shares: the prefix range kv_list scans, and argument checks
(the behaviour itself is conformance invariant 15, run against every store)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from walstream.errors import InvalidArgument, VersionMismatchError
from walstream.metadata.memory import MemoryMetadataStore
from walstream.metadata.rules import MAX_KV_VALUE_BYTES, prefix_end, version_mismatch

_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=6)


@given(_TEXT, _TEXT)
def test_the_prefix_range_holds_exactly_the_keys_with_the_prefix(prefix: str, key: str) -> None:
    end = prefix_end(prefix)
    in_range = prefix <= key and (end is None or key < end)
    assert in_range == key.startswith(prefix)
    assert (key.encode() < prefix.encode()) == (key < prefix), "code point order is byte order"


def test_the_prefix_range_skips_surrogates_and_ends_at_the_last_code_point() -> None:
    assert prefix_end("a\ud7ff") == "a\ue000"
    assert prefix_end("ab\U0010ffff") == "ac"
    assert prefix_end("\U0010ffff\U0010ffff") is None
    assert prefix_end("") is None


def test_a_mismatch_says_what_was_expected_and_found() -> None:
    error = version_mismatch("kv_put", "groups", "g1", 0, 7)
    assert isinstance(error, VersionMismatchError) and error.actual_version == 7
    assert "expected no value, found version 7" in str(error)
    assert "found no value" in str(version_mismatch("kv_delete", "groups", "g1", 3, 0))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda s: s.kv_put("ns", "k", b"x" * (MAX_KV_VALUE_BYTES + 1), 0), "larger than"),
        (lambda s: s.kv_put("ns", "k", b"v", 1.5), "expected_version"),
        (lambda s: s.kv_delete("ns", "k", False), "expected_version"),
        (lambda s: s.kv_get("n" * 257, "k"), "namespace must be 1 to 256 bytes"),
        (lambda s: s.kv_get("ns", "é" * 513), "key must be 1 to 1024 bytes"),
        (lambda s: s.kv_list("ns", prefix=3), "prefix must be a string"),
    ],
)
async def test_bad_key_value_arguments_say_what_is_wrong(call: object, message: str) -> None:
    store = MemoryMetadataStore()
    with pytest.raises(InvalidArgument, match=message):
        await call(store)  # type: ignore[operator]
