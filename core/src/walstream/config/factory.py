"""The backend factory contract: what a ``walstream.wal`` / ``walstream.object_store`` /
``walstream.metadata`` entry point publishes, and the check of a YAML section against it.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

from walstream.config.options import Option
from walstream.errors import ConfigError

__all__ = [
    "CONTRACT_VERSION",
    "BackendFactory",
    "BackendKind",
    "BuildContext",
    "validate_options",
]


#: Version of the interfaces in walstream.wal/objects/metadata. A plugin built for another
#: major contract version is refused at load time.
CONTRACT_VERSION = 1

BackendKind = Literal["wal", "object_store", "metadata"]
T = TypeVar("T")


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

