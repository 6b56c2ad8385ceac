"""Configuration values, option schemas and the backend factory contract.

A backend plugin publishes a :class:`BackendFactory` under one of the entry-point groups
``walstream.wal``, ``walstream.object_store`` or ``walstream.metadata``. Its ``options`` describe
every key its YAML section accepts; :func:`validate_options` checks a section against them and
names the offending key in every error.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

from .errors import ConfigError

__all__ = [
    "CONTRACT_VERSION",
    "BackendFactory",
    "BackendKind",
    "BuildContext",
    "CacheConfig",
    "CompactionConfig",
    "EngineConfig",
    "Option",
    "RecoveryConfig",
    "UploadConfig",
    "parse_duration",
    "parse_size",
    "validate_options",
]

#: Version of the interfaces in walstream.wal/objects/metadata. A plugin built for another
#: major contract version is refused at load time.
CONTRACT_VERSION = 1

BackendKind = Literal["wal", "object_store", "metadata"]
T = TypeVar("T")

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_DURATION_UNITS = {"": 1.0, "s": 1.0, "ms": 0.001, "us": 1e-6, "m": 60.0, "min": 60.0, "h": 3600.0}
_NUMBER_UNIT = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(value: Any, key: str = "size") -> int:
    """``64MiB`` → 67108864; ints pass through. Units: B, KB/MB/GB (10³), KiB/MiB/GiB (2¹⁰)."""
    if isinstance(value, bool):
        raise ConfigError(f"{key}: expected a size like 64MiB, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(f"{key}: a size cannot be negative ({value})")
        return value
    if isinstance(value, str):
        match = _NUMBER_UNIT.match(value)
        if match and match.group(2).lower() in _SIZE_UNITS:
            return int(float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()])
    raise ConfigError(f"{key}: expected a size like 4096, 64KiB, 32MiB or 1GiB, got {value!r}")


def parse_duration(value: Any, key: str = "duration") -> float:
    """``250ms`` → 0.25 (seconds); plain numbers are seconds."""
    if isinstance(value, bool):
        raise ConfigError(f"{key}: expected a duration like 250ms, got {value!r}")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ConfigError(f"{key}: a duration cannot be negative ({value})")
        return float(value)
    if isinstance(value, str):
        match = _NUMBER_UNIT.match(value)
        if match and match.group(2).lower() in _DURATION_UNITS:
            return float(match.group(1)) * _DURATION_UNITS[match.group(2).lower()]
    raise ConfigError(f"{key}: expected a duration like 250ms, 2s or 1m, got {value!r}")


def _parse_bool(value: Any, key: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in {
        "true",
        "yes",
        "on",
        "1",
        "false",
        "no",
        "off",
        "0",
    }:
        return value.lower() in {"true", "yes", "on", "1"}
    raise ConfigError(f"{key}: expected true or false, got {value!r}")


def _parse_int(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"{key}: expected an integer, got {value!r}") from None


def _parse_float(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    try:
        return float(value)
    except ValueError:
        raise ConfigError(f"{key}: expected a number, got {value!r}") from None


def _parse_str(value: Any, key: str) -> str:
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    return str(value)


def _parse_str_list(value: Any, key: str) -> list[str]:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    if isinstance(value, list) and all(isinstance(item, (str, int)) for item in value):
        return [str(item) for item in value]
    raise ConfigError(f"{key}: expected a list of strings, got {value!r}")


OptionKind = Literal["str", "int", "float", "bool", "size", "duration", "path", "str_list", "any"]


@dataclass(frozen=True)
class Option:
    """One key of a backend's YAML section."""

    name: str
    kind: OptionKind
    doc: str
    default: Any = None
    required: bool = False
    choices: Sequence[Any] | None = None
    minimum: float | None = None

    def parse(self, value: Any, key: str, base_dir: Path) -> Any:
        if value is None:
            return None
        parsed: Any
        if self.kind == "str":
            parsed = _parse_str(value, key)
        elif self.kind == "int":
            parsed = _parse_int(value, key)
        elif self.kind == "float":
            parsed = _parse_float(value, key)
        elif self.kind == "bool":
            parsed = _parse_bool(value, key)
        elif self.kind == "size":
            parsed = parse_size(value, key)
        elif self.kind == "duration":
            parsed = parse_duration(value, key)
        elif self.kind == "path":
            path = Path(_parse_str(value, key)).expanduser()
            parsed = path if path.is_absolute() else (base_dir / path)
        elif self.kind == "str_list":
            parsed = _parse_str_list(value, key)
        else:
            parsed = value
        if self.choices is not None and parsed not in self.choices:
            accepted = ", ".join(str(choice) for choice in self.choices)
            raise ConfigError(f"{key}: {value!r} is not one of: {accepted}")
        if self.minimum is not None and isinstance(parsed, (int, float)) and parsed < self.minimum:
            raise ConfigError(f"{key}: must be at least {self.minimum}, got {value!r}")
        return parsed

    def describe(self) -> str:
        extra = " (required)" if self.required else f" (default: {self.default!r})"
        return f"{self.name}: {self.kind}{extra} — {self.doc}"


@dataclass(frozen=True)
class BuildContext:
    """What a factory may need besides its options."""

    base_dir: Path = field(default_factory=Path.cwd)
    """Folder relative paths resolve against (the YAML file's folder)."""
    node_id: int = 1
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class BackendFactory(Generic[T]):
    """What an entry point in ``walstream.wal`` / ``walstream.object_store`` /
    ``walstream.metadata`` points at."""

    kind: BackendKind
    name: str
    description: str
    options: tuple[Option, ...]
    create: Callable[[dict[str, Any], BuildContext], T]
    contract_version: int = CONTRACT_VERSION
    provision: Callable[[Path], Any] | None = None
    """Optional: make a throwaway instance for the conformance suite; given a temp folder, it
    returns a context manager yielding the options dict for ``create``."""
    inspect: Callable[[Path], Any] | None = None
    """Optional (WALs): decode and verify the medium at a path for ``walstream inspect wal``;
    returns an iterable of printable lines and raises CorruptionError on damage it cannot pass."""

    def build(self, section: Mapping[str, Any], context: BuildContext, key_prefix: str) -> T:
        return self.create(validate_options(self, section, context.base_dir, key_prefix), context)


def validate_options(
    factory: BackendFactory[Any],
    section: Mapping[str, Any],
    base_dir: Path,
    key_prefix: str,
) -> dict[str, Any]:
    """Check ``section`` against ``factory.options``: unknown keys, missing keys, bad values —
    each error names the key (``wal.capacity``) and what is accepted."""
    known = {option.name: option for option in factory.options}
    result: dict[str, Any] = {}
    for key, value in section.items():
        if key == "type":
            continue
        if key not in known:
            close = difflib.get_close_matches(str(key), list(known), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else "."
            accepted = ", ".join(sorted(known)) or "(none)"
            raise ConfigError(
                f"{key_prefix}.{key}: unknown option for {factory.kind} type "
                f"{factory.name!r}{hint} Accepted keys: {accepted}"
            )
        result[key] = known[key].parse(value, f"{key_prefix}.{key}", base_dir)
    for option in factory.options:
        if option.name not in result or result[option.name] is None:
            if option.required:
                raise ConfigError(
                    f"{key_prefix}.{option.name}: required for {factory.kind} type "
                    f"{factory.name!r} ({option.doc})"
                )
            default = option.default
            if default is not None and option.kind in {"size", "duration", "path"}:
                default = option.parse(default, f"{key_prefix}.{option.name}", base_dir)
            result[option.name] = default
    return result


@dataclass(frozen=True)
class CacheConfig:
    log_cache_bytes: int = 256 << 20
    """Bound of the LogCache (hot tail); appends wait (back-pressure) when un-uploaded data
    reaches it."""
    block_cache_bytes: int = 128 << 20
    """Bound of the BlockCache (LRU of object data blocks) for cold reads."""
    readahead_min_bytes: int = 512 << 10
    readahead_max_bytes: int = 32 << 20


@dataclass(frozen=True)
class UploadConfig:
    max_bytes: int = 32 << 20
    """Seal the active LogCache block and upload it at this size …"""
    max_interval_s: float = 0.25
    """… or at this age."""
    split_bytes: int = 8 << 20
    """A stream with at least this much data in a block gets its own stream object."""
    max_concurrency: int = 4
    """Objects uploaded at once (commits stay in FIFO order)."""
    prepare_ttl_s: float = 600.0


@dataclass(frozen=True)
class CompactionConfig:
    enabled: bool = True
    interval_s: float = 30.0
    min_objects: int = 4
    """Compact when at least this many small objects wait."""
    small_object_bytes: int = 8 << 20
    """Stream-set objects and stream objects below this size are compaction candidates."""
    max_object_bytes: int = 256 << 20


@dataclass(frozen=True)
class RecoveryConfig:
    accept_loss: bool = False
    """Start even though the WAL lost acknowledged records (DESIGN §8): record each lost range
    as a data-loss gap in metadata (reads of it raise ``DataLossError``; its offsets are never
    reused), commit everything valid and reset the WAL. Off by default: without it a node whose
    WAL shows damage refuses to start with :class:`~walstream.errors.CorruptionError`. An
    operator's one-off action (``walstream recover --accept-loss``), deliberately not a key of
    the deployment YAML, where it would silently accept every future loss."""


@dataclass(frozen=True)
class EngineConfig:
    node_id: int = 1
    cache: CacheConfig = field(default_factory=CacheConfig)
    upload: UploadConfig = field(default_factory=UploadConfig)
    compaction: CompactionConfig = field(default_factory=CompactionConfig)
    recovery: RecoveryConfig = field(default_factory=RecoveryConfig)
    append_timeout_s: float = 30.0
    """How long an append waits under back-pressure before failing with CapacityError."""
