"""Configuration values, option schemas and the backend factory contract.

A backend plugin publishes a :class:`BackendFactory` under one of the entry-point groups
``walstream.wal``, ``walstream.object_store`` or ``walstream.metadata``. Its ``options`` describe
every key its YAML section accepts; :func:`validate_options` checks a section against them and
names the offending key in every error.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from walstream.errors import ConfigError

__all__ = [
    "Option",
    "parse_duration",
    "parse_size",
]


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

