"""A stream's configuration: what the engine keeps for each stream in the metadata store
(docs/guides/lifecycle.md).

:class:`StreamConfig` is one immutable value with a default for every setting, stored with the
stream (:meth:`walstream.metadata.MetadataStore.create_stream`,
:meth:`~walstream.metadata.MetadataStore.reconfigure_stream`) and read back with it
(``StreamInfo.config``). Its JSON form (:meth:`StreamConfig.to_json`) is what the metadata
stores keep and what the CLI and the Python API show; the S2 API maps S2's names onto it
(:mod:`walstream.server.s2.model`).

Settings, with their defaults:

- ``retention_age_s`` (None: infinite): records whose timestamp is older than this many seconds
  stop being readable; the stream's start moves past them as a trim would.
- ``timestamping`` (:class:`Timestamping`, ``client-prefer``): where a record's timestamp comes
  from; ``uncapped`` (False) keeps client timestamps that lie in the future.
- ``delete_on_empty_min_age_s`` (0: never): the stream is deleted once it has been empty for
  this long.
- ``storage_class`` (None: unset): kept and reported as given (``standard`` or ``express``).
- ``cipher`` (None: plaintext): the cipher the stream's records are sealed with
  (:class:`walstream.encryption.Cipher`), fixed when the stream is created.

Changes are partial (:meth:`StreamConfig.with_changes`): a field not named keeps its value.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from walstream.encryption import Cipher
from walstream.errors import InvalidArgument

__all__ = [
    "FIELDS",
    "MAX_AGE_S",
    "STORAGE_CLASSES",
    "StreamConfig",
    "Timestamping",
    "format_age",
    "parse_age",
]

STORAGE_CLASSES = ("standard", "express")
"""The storage classes a stream may name (S2's); walstream keeps every stream on its one WAL
and object store, so the class is kept and reported, not acted on."""
MAX_AGE_S = 100 * 365 * 86_400
"""The longest retention or delete-on-empty age: 100 years."""


class Timestamping(enum.Enum):
    """Where a record's timestamp comes from (S2's ``TimestampingMode``)."""

    CLIENT_PREFER = "client-prefer"
    """The client's timestamp when it gives one, else the arrival time."""
    CLIENT_REQUIRE = "client-require"
    """The client's timestamp; an append of a record without one is refused."""
    ARRIVAL = "arrival"
    """The arrival time; client timestamps are ignored."""


@dataclass(frozen=True, slots=True)
class StreamConfig:
    """A stream's configuration (see the module docstring for each setting's meaning)."""

    retention_age_s: int | None = None
    timestamping: Timestamping = Timestamping.CLIENT_PREFER
    uncapped: bool = False
    delete_on_empty_min_age_s: int = 0
    storage_class: str | None = None
    cipher: str | None = None

    def __post_init__(self) -> None:
        _check_age(self.retention_age_s, "retention_age_s", allow_none=True)
        _check_age(self.delete_on_empty_min_age_s, "delete_on_empty_min_age_s", allow_zero=True)
        if not isinstance(self.timestamping, Timestamping):
            raise InvalidArgument(
                f"timestamping: one of {', '.join(t.value for t in Timestamping)}, "
                f"got {self.timestamping!r}"
            )
        if not isinstance(self.uncapped, bool):
            raise InvalidArgument(f"uncapped: expected true or false, got {self.uncapped!r}")
        if self.storage_class is not None and self.storage_class not in STORAGE_CLASSES:
            raise InvalidArgument(
                f"storage_class: one of {', '.join(STORAGE_CLASSES)} (or unset), "
                f"got {self.storage_class!r}"
            )
        if self.cipher is not None and self.cipher not in {c.value for c in Cipher}:
            raise InvalidArgument(
                f"cipher: one of {', '.join(c.value for c in Cipher)} (or unset), "
                f"got {self.cipher!r}"
            )

    @property
    def retention_ms(self) -> int | None:
        return None if self.retention_age_s is None else self.retention_age_s * 1000

    def with_changes(self, changes: Mapping[str, Any]) -> StreamConfig:
        """This config with ``changes`` (field name -> new value, JSON form or typed) applied;
        fields not named keep their value. Unknown fields or invalid values:
        :class:`~walstream.errors.InvalidArgument`, nothing changed."""
        unknown = sorted(set(changes) - set(FIELDS))
        if unknown:
            raise InvalidArgument(
                f"unknown stream config field(s) {', '.join(map(repr, unknown))}; the fields "
                f"are {', '.join(FIELDS)}"
            )
        values = dict(changes)
        if "timestamping" in values and not isinstance(values["timestamping"], Timestamping):
            values["timestamping"] = _timestamping(values["timestamping"])
        return dataclasses.replace(self, **values)

    def to_json(self) -> dict[str, Any]:
        """Every field, by name, in JSON types."""
        return {
            "retention_age_s": self.retention_age_s,
            "timestamping": self.timestamping.value,
            "uncapped": self.uncapped,
            "delete_on_empty_min_age_s": self.delete_on_empty_min_age_s,
            "storage_class": self.storage_class,
            "cipher": self.cipher,
        }

    def encode(self) -> str:
        """The text the metadata stores keep (:meth:`decode` reads it)."""
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, value: Any) -> StreamConfig:
        """A config from its JSON form; fields left out take their defaults."""
        if value is None:
            return cls()
        if not isinstance(value, Mapping):
            raise InvalidArgument(f"a stream config is a JSON object, got {value!r}")
        return cls().with_changes(value)

    @classmethod
    def decode(cls, text: str | None) -> StreamConfig:
        return cls.from_json(json.loads(text) if text else None)

    def describe(self) -> str:
        """One line for people (the CLI's listings)."""
        parts = [
            "retention "
            + ("infinite" if self.retention_age_s is None else format_age(self.retention_age_s)),
            f"timestamping {self.timestamping.value}" + (" uncapped" if self.uncapped else ""),
        ]
        if self.delete_on_empty_min_age_s:
            parts.append(f"delete-on-empty {format_age(self.delete_on_empty_min_age_s)}")
        if self.storage_class:
            parts.append(f"storage-class {self.storage_class}")
        if self.cipher:
            parts.append(f"cipher {self.cipher}")
        return ", ".join(parts)


FIELDS = tuple(field.name for field in dataclasses.fields(StreamConfig))


def _timestamping(value: Any) -> Timestamping:
    try:
        return Timestamping(value)
    except ValueError:
        raise InvalidArgument(
            f"timestamping: one of {', '.join(t.value for t in Timestamping)}, got {value!r}"
        ) from None


def _check_age(
    value: Any, what: str, *, allow_none: bool = False, allow_zero: bool = False
) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{what}: expected whole seconds, got {value!r}")
    low = 0 if allow_zero else 1
    if not low <= value <= MAX_AGE_S:
        raise InvalidArgument(f"{what}: {low} to {MAX_AGE_S} seconds (100 years), got {value}")


_AGE_UNITS = {"": 1, "s": 1, "m": 60, "min": 60, "h": 3600, "d": 86_400, "w": 604_800}
_AGE = re.compile(r"^\s*([0-9]+)\s*([a-z]*)\s*$")


def parse_age(value: Any, what: str = "age") -> int | None:
    """``7d`` -> 604800 seconds; ``infinite`` -> None; plain numbers are seconds. Units: s, m,
    h, d, w."""
    if isinstance(value, str) and value.strip().lower() in ("infinite", "inf", "forever"):
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        match = _AGE.match(value.lower())
        if match and match.group(2) in _AGE_UNITS:
            return int(match.group(1)) * _AGE_UNITS[match.group(2)]
    raise InvalidArgument(
        f"{what}: expected an age like 30s, 15m, 12h, 7d or 2w (or infinite), got {value!r}"
    )


def format_age(seconds: int) -> str:
    """The shortest exact form in days at most: 604800 -> ``7d``, 90 -> ``90s``."""
    for unit, size in (("d", 86_400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
