"""Parsing of the data source options (``.option(key, value)``; Spark passes strings)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from walstream.errors import ConfigError
from walstream.metadata import StreamInfo

__all__ = [
    "EARLIEST",
    "LATEST",
    "OffsetSpec",
    "optional_int",
    "parse_offsets",
    "parse_streams",
    "required",
]

EARLIEST: Literal["earliest"] = "earliest"
LATEST: Literal["latest"] = "latest"
Position = int | Literal["earliest", "latest"]


@dataclass(frozen=True)
class OffsetSpec:
    """``earliest``, ``latest`` or a JSON object ``{"stream": offset, ...}``.

    In the JSON form an offset may also be ``"earliest"``/``"latest"`` (or Kafka's -2/-1);
    streams it does not name take ``default``.
    """

    default: Position
    per_stream: Mapping[str, Position]

    def position(self, stream: str) -> Position:
        return self.per_stream.get(stream, self.default)

    def resolve(self, stream: str, info: StreamInfo) -> int:
        """An offset inside ``[start_offset, committed_end]`` of the stream."""
        position = self.position(stream)
        if position == EARLIEST:
            return info.start_offset
        if position == LATEST:
            return info.committed_end
        assert isinstance(position, int)
        return min(max(position, info.start_offset), info.committed_end)


def required(options: Mapping[str, str], key: str, example: str) -> str:
    value = options.get(key)
    if value is None or not str(value).strip():
        raise ConfigError(f"option {key!r} is required, e.g. .option({key!r}, {example!r})")
    return str(value).strip()


def parse_streams(options: Mapping[str, str]) -> list[str]:
    names = [name.strip() for name in required(options, "streams", "clicks,orders").split(",")]
    names = [name for name in names if name]
    if not names:
        raise ConfigError("option 'streams': name at least one stream, e.g. 'clicks,orders'")
    if len(set(names)) != len(names):
        raise ConfigError(f"option 'streams': a stream is named twice in {names}")
    return names


def _position(value: object, key: str) -> Position:
    if value in (EARLIEST, -2):
        return EARLIEST
    if value in (LATEST, -1):
        return LATEST
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise ConfigError(
        f"option {key!r}: an offset is 'earliest', 'latest' or a non-negative integer, got {value!r}"
    )


def parse_offsets(options: Mapping[str, str], key: str, default: Position) -> OffsetSpec:
    raw = options.get(key)
    if raw is None or not str(raw).strip():
        return OffsetSpec(default, {})
    text = str(raw).strip()
    if text.lower() in (EARLIEST, LATEST):
        return OffsetSpec(_position(text.lower(), key), {})
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"option {key!r}: expected 'earliest', 'latest' or JSON like "
            f'{{"clicks": 42}}, got {text!r} ({exc.msg})'
        ) from None
    if not isinstance(document, dict):
        raise ConfigError(
            f'option {key!r}: expected a JSON object like {{"clicks": 42}}, got {text!r}'
        )
    return OffsetSpec(
        default, {str(name): _position(value, f"{key}.{name}") for name, value in document.items()}
    )


def optional_int(
    options: Mapping[str, str], key: str, default: int | None, minimum: int = 0
) -> int | None:
    raw = options.get(key)
    if raw is None or str(raw).strip() == "":
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ConfigError(f"option {key!r}: expected an integer, got {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"option {key!r}: must be at least {minimum}, got {value}")
    return value


def optional_bool(options: Mapping[str, str], key: str, default: bool) -> bool:
    raw = options.get(key)
    if raw is None or str(raw).strip() == "":
        return default
    value = str(raw).strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise ConfigError(f"option {key!r}: expected true or false, got {raw!r}")
