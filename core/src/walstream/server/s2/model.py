"""How S2's concepts map onto walstream's, and the configurations this server accepts.

**Names.** A basin is a :class:`walstream.metadata.BasinInfo` (S2's basin-name rule). Stream
``S`` of basin ``B`` is the walstream stream named ``B.`` + the encoding of ``S``
(:func:`walstream.records.encode_stream_name`: ASCII letters, digits, ``.``, ``_`` and ``-``
stand for themselves, every other UTF-8 byte is an escape such as ``+20`` for a space or
``~C3~A9`` for ``é``); basin names hold no ``.``, so the first ``.`` separates the two. One
more basin always exists, :data:`ROOT_BASIN` (``walstream``): its streams are all walstream
streams under the names they encode, so streams made with the Python API or the CLI
(``orders``, and ``B.S`` too) are reachable through the S2 API; it cannot be created or
deleted. Any S2 name (1 to 512 bytes of UTF-8, not ``.`` or ``..``) is accepted. The encoding
keeps the order and the prefixes of the UTF-8 bytes, so listings page in S2's order and prefix
queries are prefix queries of the walstream names.

**Records.** An S2 record's headers are the walstream record's headers (names are UTF-8 text
in walstream: a header name that is not UTF-8 is refused with 422), its body is the value, its
timestamp the record's ``timestamp_ms``. A walstream record's *key* (S2 has none) travels as
the record's first header, named :data:`KEY_HEADER`; an appended record whose first header has
that name stores it as the key again, so records cross between the two APIs unchanged.

**Configurations.** walstream keeps every record until it is trimmed and has one storage class,
so a stream's configuration is fixed: :func:`stream_config_json`. A create, ensure or
reconfigure that asks for anything else (age-based retention, ``arrival`` or ``client-require``
timestamping, ``uncapped`` timestamps, delete-on-empty) is refused with 422 naming the setting.
Basin configurations are stored after the same check (:func:`check_basin_config`), reconfigured
by :func:`reconfigure_basin`; ``create_stream_on_append``, ``create_stream_on_read`` and
``stream_cipher`` (the cipher of the basin's streams, :mod:`walstream.encryption`) are
honoured.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from walstream.errors import InvalidArgument
from walstream.records import decode_stream_name, encode_stream_name
from walstream.server.s2.errors import S2Error

__all__ = [
    "CIPHERS",
    "CREATION_TOKEN_KEY",
    "KEY_HEADER",
    "MAX_BATCH_BYTES",
    "MAX_BATCH_RECORDS",
    "MAX_FENCING_TOKEN_BYTES",
    "MAX_UNARY_WAIT_S",
    "ROOT_BASIN",
    "basin_config_json",
    "basin_prefix",
    "check_basin_config",
    "check_stream_config",
    "metered_bytes",
    "reconfigure_basin",
    "rfc3339",
    "s2_prefix",
    "s2_stream_name",
    "same_basin_config",
    "stream_config_json",
    "walstream_stream_name",
]

#: The basin whose streams are all walstream streams, under their own names.
ROOT_BASIN = "walstream"
#: The header that carries a walstream record's key through the S2 API.
KEY_HEADER = "walstream-key"

# S2's own limits, stricter than the engine's (walstream.records): they hold on this API only.
MAX_BATCH_RECORDS = 1000
"""Records of one append, and of one read batch."""
MAX_BATCH_BYTES = 1 << 20
"""Metered bytes (:func:`metered_bytes`) of one append, and of one read batch."""
MAX_FENCING_TOKEN_BYTES = 36
"""Bytes of UTF-8 in a fencing token."""
MAX_UNARY_WAIT_S = 60
"""The longest ``wait`` of a read."""
_MAX_S2_STREAM_NAME_BYTES = 512


def walstream_stream_name(basin: str, stream: str) -> str:
    """The walstream name of S2 stream ``stream`` in ``basin`` (422 if S2 refuses the name)."""
    try:
        size = len(stream.encode("utf-8"))
    except UnicodeEncodeError:
        raise S2Error(422, "invalid", "a stream name is valid UTF-8 text") from None
    if not 1 <= size <= _MAX_S2_STREAM_NAME_BYTES:
        raise S2Error(422, "invalid", "a stream name has 1 to 512 bytes")
    if stream in (".", ".."):
        raise S2Error(422, "invalid", 'stream name must not be "." or ".."')
    return basin_prefix(basin) + encode_stream_name(stream)


def metered_bytes(headers: tuple[tuple[bytes, bytes], ...], body: bytes) -> int:
    """S2's measure of a record: 8 bytes, 2 per header, plus the bytes of names, values, body."""
    return 8 + 2 * len(headers) + sum(len(n) + len(v) for n, v in headers) + len(body)


def basin_prefix(basin: str) -> str:
    """What the walstream names of ``basin``'s streams start with."""
    return "" if basin == ROOT_BASIN else f"{basin}."


def s2_stream_name(basin: str, walstream_name: str) -> str:
    """The S2 name of a walstream stream of ``basin`` (InvalidArgument when its name encodes
    none: a stream named before the name rule)."""
    return decode_stream_name(walstream_name[len(basin_prefix(basin)) :])


def s2_prefix(basin: str, prefix: str) -> str:
    """The walstream names of ``basin``'s S2 streams that start with ``prefix`` start with
    this (the encoding keeps prefixes)."""
    try:
        return basin_prefix(basin) + encode_stream_name(prefix)
    except InvalidArgument:
        raise S2Error(400, "bad_query", "prefix is valid UTF-8 text") from None


def rfc3339(milliseconds: int) -> str:
    """RFC 3339 time (UTC) of milliseconds since 1970, as S2's ``created_at`` fields."""
    moment = datetime.fromtimestamp(milliseconds / 1000, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def stream_config_json() -> dict[str, Any]:
    """The configuration of every stream on this server (see the module docstring)."""
    return {
        "storage_class": "express",
        "retention_policy": {"infinite": {}},
        "timestamping": {"mode": "client-prefer", "uncapped": False},
        "delete_on_empty": {"min_age_secs": 0},
    }


def _unsupported(setting: str, value: Any) -> S2Error:
    return S2Error(
        422,
        "invalid",
        f"{setting}={value!r} is not supported by walstream: streams keep records until "
        "trimmed, take client timestamps capped at arrival (arrival time when absent), and "
        "are not deleted when empty; leave it unset",
    )


def check_stream_config(config: Any, what: str = "config") -> None:
    """Refuse (422) a stream configuration this server cannot honour; null fields are fine."""
    if config is None:
        return
    if not isinstance(config, dict):
        raise S2Error(422, "invalid", f"{what}: expected a StreamConfig object")
    for key, value in config.items():
        if value is None:
            continue
        if key == "storage_class":
            if value not in ("standard", "express"):
                raise S2Error(422, "invalid", f"{what}.storage_class: standard or express")
        elif key == "retention_policy":
            if value != {"infinite": {}}:
                raise _unsupported(f"{what}.retention_policy", value)
        elif key == "timestamping":
            if not isinstance(value, dict):
                raise S2Error(422, "invalid", f"{what}.timestamping: expected an object")
            if value.get("mode") not in (None, "client-prefer"):
                raise _unsupported(f"{what}.timestamping.mode", value.get("mode"))
            if value.get("uncapped") not in (None, False):
                raise _unsupported(f"{what}.timestamping.uncapped", value.get("uncapped"))
        elif key == "delete_on_empty":
            if not isinstance(value, dict) or value.get("min_age_secs") not in (None, 0):
                raise _unsupported(f"{what}.delete_on_empty", value)
        else:
            raise S2Error(422, "invalid", f"{what}: unknown field {key!r}")


CIPHERS = ("aegis-256", "aes-256-gcm")
"""S2's names of the stream ciphers (``EncryptionAlgorithm``)."""
_BASIN_FLAGS = ("create_stream_on_append", "create_stream_on_read")
CREATION_TOKEN_KEY = "creation_token_sha256"
"""Where a basin created with ``s2-request-token`` keeps its idempotency key (in its stored
config; never part of an answer, and refused as a field of a config sent by a client)."""


def check_basin_config(config: Any) -> dict[str, Any]:
    """A basin configuration this server can honour, as stored (422 otherwise). Fields left
    out, or null, take S2's defaults (not stored)."""
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise S2Error(422, "invalid", "config: expected a BasinConfig object")
    stored: dict[str, Any] = {}
    for key, value in config.items():
        if value is None:
            if key not in (*_BASIN_FLAGS, "default_stream_config", "stream_cipher"):
                raise S2Error(422, "invalid", f"config: unknown field {key!r}")
            continue
        if key in _BASIN_FLAGS:
            stored[key] = _flag(value, f"config.{key}")
        elif key == "default_stream_config":
            check_stream_config(value, "config.default_stream_config")
        elif key == "stream_cipher":
            stored[key] = _cipher(value, "config.stream_cipher")
        else:
            raise S2Error(422, "invalid", f"config: unknown field {key!r}")
    return stored


def reconfigure_basin(stored: dict[str, Any], changes: Any) -> dict[str, Any]:
    """The config ``stored`` with the ``BasinReconfiguration`` ``changes`` applied (S2's
    ``BasinConfig::reconfigure``): a field left out keeps its value; ``stream_cipher: null``
    removes the cipher; ``default_stream_config: null`` resets the defaults. S2's spec allows
    null for ``create_stream_on_append``/``_read`` too (s2-lite refuses it): null leaves the
    flag as it is. Unknown fields and invalid values are refused with 422 before anything
    changes."""
    if not isinstance(changes, dict):
        raise S2Error(422, "invalid", "expected a BasinReconfiguration object")
    updated = dict(stored)
    for key, value in changes.items():
        if key in _BASIN_FLAGS:
            if value is not None:
                updated[key] = _flag(value, key)
        elif key == "stream_cipher":
            if value is None:
                updated.pop(key, None)
            else:
                updated[key] = _cipher(value, key)
        elif key == "default_stream_config":
            if value is not None:
                check_stream_config(value, key)
        else:
            raise S2Error(422, "invalid", f"unknown field {key!r} of a BasinReconfiguration")
    return updated


def same_basin_config(stored: dict[str, Any], given: dict[str, Any]) -> bool:
    """True when ``given`` (checked) says what ``stored`` says (an ``ensure`` changes nothing)."""
    return basin_config_json(stored) == basin_config_json(given)


def _flag(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise S2Error(422, "invalid", f"{what}: expected true or false")
    return value


def _cipher(value: Any, what: str) -> str:
    if value not in CIPHERS:
        raise S2Error(422, "invalid", f"{what}: one of {', '.join(CIPHERS)} (or null)")
    return str(value)


def basin_config_json(stored: dict[str, Any]) -> dict[str, Any]:
    """A basin's ``BasinConfig`` answer."""
    return {
        "create_stream_on_append": bool(stored.get("create_stream_on_append", False)),
        "create_stream_on_read": bool(stored.get("create_stream_on_read", False)),
        "default_stream_config": stream_config_json(),
        "stream_cipher": stored.get("stream_cipher"),
    }
