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

**Configurations.** A stream's configuration is walstream's own
(:class:`walstream.stream_config.StreamConfig`, kept in the metadata store), under S2's names
(:func:`stream_config_json`): ``retention_policy`` ``{"age": s}`` or ``{"infinite": {}}`` is
``retention_age_s``; ``timestamping`` ``mode`` and ``uncapped``; ``delete_on_empty``
``min_age_secs`` (0: off); ``storage_class`` kept as given (unset reads as ``express``). A stream
created here takes, field by field, what the request gives, else the basin's
``default_stream_config``, else S2's defaults (:data:`S2_DEFAULT_RETENTION_S`: 7 days of
retention), and its basin's ``stream_cipher`` (fixed from then on). A reconfiguration changes
the fields it names; a null field returns to S2's default. Basin configurations are stored after
the same check (:func:`check_basin_config`), reconfigured by :func:`reconfigure_basin`;
``create_stream_on_append`` and ``create_stream_on_read`` create a missing stream with the
basin's defaults.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from walstream.errors import InvalidArgument
from walstream.records import decode_stream_name, encode_stream_name
from walstream.server.s2.errors import S2Error
from walstream.stream_config import MAX_AGE_S, STORAGE_CLASSES, StreamConfig, Timestamping

__all__ = [
    "CIPHERS",
    "CREATION_TOKEN_KEY",
    "KEY_HEADER",
    "MAX_BATCH_BYTES",
    "MAX_BATCH_RECORDS",
    "MAX_FENCING_TOKEN_BYTES",
    "MAX_UNARY_WAIT_S",
    "ROOT_BASIN",
    "S2_DEFAULT_RETENTION_S",
    "basin_config_json",
    "basin_prefix",
    "check_basin_config",
    "check_stream_config",
    "merge_stream_configs",
    "metered_bytes",
    "new_stream_config",
    "reconfigure_basin",
    "rfc3339",
    "s2_prefix",
    "s2_stream_name",
    "same_basin_config",
    "stream_changes",
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


S2_DEFAULT_RETENTION_S = 7 * 86_400
"""S2's retention of a stream created without one (and without a basin default): 7 days."""
_STREAM_FIELDS = ("storage_class", "retention_policy", "timestamping", "delete_on_empty")


def stream_config_json(config: StreamConfig) -> dict[str, Any]:
    """A stream's ``StreamConfig`` answer: its walstream configuration under S2's names (an
    unset storage class is S2's default, ``express``)."""
    retention = config.retention_age_s
    return {
        "storage_class": config.storage_class or "express",
        "retention_policy": {"infinite": {}} if retention is None else {"age": retention},
        "timestamping": {"mode": config.timestamping.value, "uncapped": config.uncapped},
        "delete_on_empty": {"min_age_secs": config.delete_on_empty_min_age_s},
    }


def _invalid(what: str, expected: str) -> S2Error:
    return S2Error(422, "invalid", f"{what}: {expected}")


def _age(value: Any, what: str, *, zero: bool) -> int:
    low = 0 if zero else 1
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_AGE_S:
        raise _invalid(what, f"whole seconds from {low} to {MAX_AGE_S}")
    return value


def check_stream_config(config: Any, what: str = "config") -> dict[str, Any]:
    """An S2 ``StreamConfig`` (or ``StreamReconfiguration``) checked (422 naming the field
    otherwise) and normalised: the fields given, with their values; a null field is kept as
    null (in a reconfiguration it resets the field to S2's default)."""
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise S2Error(422, "invalid", f"{what}: expected a StreamConfig object")
    checked: dict[str, Any] = {}
    for key, value in config.items():
        if key not in _STREAM_FIELDS:
            raise S2Error(422, "invalid", f"{what}: unknown field {key!r}")
        if value is None:
            checked[key] = None
        elif key == "storage_class":
            if value not in STORAGE_CLASSES:
                raise _invalid(f"{what}.storage_class", "standard or express")
            checked[key] = value
        elif key == "retention_policy":
            if value == {"infinite": {}}:
                checked[key] = {"infinite": {}}
            elif isinstance(value, dict) and set(value) == {"age"}:
                checked[key] = {"age": _age(value["age"], f"{what}.retention_policy.age", zero=False)}
            else:
                raise _invalid(
                    f"{what}.retention_policy", 'expected {"age": seconds} or {"infinite": {}}'
                )
        elif key == "timestamping":
            if not isinstance(value, dict) or not set(value) <= {"mode", "uncapped"}:
                raise _invalid(f"{what}.timestamping", "expected an object of mode, uncapped")
            stamping: dict[str, Any] = {}
            if "mode" in value:
                mode = value["mode"]
                if mode is not None and mode not in {t.value for t in Timestamping}:
                    raise _invalid(
                        f"{what}.timestamping.mode", "client-prefer, client-require or arrival"
                    )
                stamping["mode"] = mode
            if "uncapped" in value:
                if value["uncapped"] is not None and not isinstance(value["uncapped"], bool):
                    raise _invalid(f"{what}.timestamping.uncapped", "expected true or false")
                stamping["uncapped"] = value["uncapped"]
            checked[key] = stamping
        else:  # delete_on_empty
            if not isinstance(value, dict) or not set(value) <= {"min_age_secs"}:
                raise _invalid(f"{what}.delete_on_empty", 'expected {"min_age_secs": seconds}')
            min_age = value.get("min_age_secs")
            checked[key] = {
                "min_age_secs": None
                if min_age is None
                else _age(min_age, f"{what}.delete_on_empty.min_age_secs", zero=True)
            }
    return checked


def merge_stream_configs(defaults: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """``given`` over ``defaults`` (both checked), field by field and, in ``timestamping``,
    mode and ``uncapped`` apart: what a stream of a basin gets (S2 merges the same way)."""
    merged = {k: v for k, v in defaults.items() if v is not None}
    for key, value in given.items():
        if value is None:
            continue
        if key == "timestamping" and isinstance(merged.get(key), dict):
            stamping = dict(merged[key])
            stamping.update({k: v for k, v in value.items() if v is not None})
            merged[key] = stamping
        else:
            merged[key] = value
    return merged


def stream_changes(config: dict[str, Any]) -> dict[str, Any]:
    """The walstream config changes (:meth:`StreamConfig.with_changes`) of a checked S2
    ``StreamReconfiguration``: a field left out keeps its value, a null one returns to S2's
    default (retention 7 days, storage class unset: ``express``, timestamping
    ``client-prefer`` capped, delete-on-empty off)."""
    changes: dict[str, Any] = {}
    for key, value in config.items():
        if key == "storage_class":
            changes["storage_class"] = value
        elif key == "retention_policy":
            if value is None:
                changes["retention_age_s"] = S2_DEFAULT_RETENTION_S
            else:
                changes["retention_age_s"] = value.get("age")
        elif key == "timestamping":
            stamping = value or {"mode": None, "uncapped": None}
            if "mode" in stamping:
                changes["timestamping"] = stamping["mode"] or Timestamping.CLIENT_PREFER.value
            if "uncapped" in stamping:
                changes["uncapped"] = bool(stamping["uncapped"])
        elif key == "delete_on_empty":
            changes["delete_on_empty_min_age_s"] = ((value or {}).get("min_age_secs")) or 0
    return changes


def new_stream_config(
    basin_defaults: dict[str, Any], given: dict[str, Any], cipher: str | None
) -> StreamConfig:
    """The configuration of a stream created through the S2 API: ``given`` over the basin's
    ``default_stream_config`` over S2's defaults (retention 7 days), with the basin's cipher."""
    merged = merge_stream_configs(basin_defaults, given)
    merged.setdefault("retention_policy", None)
    return StreamConfig().with_changes({**stream_changes(merged), "cipher": cipher})


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
            defaults = _defaults(value, "config.default_stream_config")
            if defaults:
                stored[key] = defaults
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
            if value is None:
                updated.pop(key, None)
            else:
                defaults = merge_stream_configs(
                    updated.get(key, {}), _defaults(value, key, keep_nulls=True)
                )
                for field, given in value.items():
                    if given is None:
                        defaults.pop(field, None)  # null: back to S2's default
                if defaults:
                    updated[key] = defaults
                else:
                    updated.pop(key, None)
        else:
            raise S2Error(422, "invalid", f"unknown field {key!r} of a BasinReconfiguration")
    return updated


def same_basin_config(stored: dict[str, Any], given: dict[str, Any]) -> bool:
    """True when ``given`` (checked) says what ``stored`` says (an ``ensure`` changes nothing)."""
    return basin_config_json(stored) == basin_config_json(given)


def _defaults(value: Any, what: str, *, keep_nulls: bool = False) -> dict[str, Any]:
    """A basin's ``default_stream_config`` as stored: the fields set (nulls dropped unless
    ``keep_nulls``: a reconfiguration's null resets a field)."""
    checked = check_stream_config(value, what)
    if keep_nulls:
        return checked
    stored = {k: v for k, v in checked.items() if v is not None}
    if isinstance(stored.get("timestamping"), dict):
        stored["timestamping"] = {
            k: v for k, v in stored["timestamping"].items() if v is not None
        }
    return stored


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
        "default_stream_config": stream_config_json(
            new_stream_config(stored.get("default_stream_config", {}), {}, None)
        ),
        "stream_cipher": stored.get("stream_cipher"),
    }
