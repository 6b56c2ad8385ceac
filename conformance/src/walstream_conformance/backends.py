"""Finding and building backends: by entry-point name, by config file, by provisioning hook, or by
an importable target (what the crash harness hands a child process)."""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import importlib.util
import json
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from walstream.config import BackendFactory, BackendKind, BuildContext
from walstream.errors import ConfigError

__all__ = [
    "GROUPS",
    "BackendSpec",
    "backend_options",
    "build_backend",
    "load_factory",
    "load_target",
    "read_config_section",
]

GROUPS: dict[str, str] = {
    "wal": "walstream.wal",
    "object_store": "walstream.object_store",
    "metadata": "walstream.metadata",
}


def load_factory(kind: BackendKind, name: str) -> BackendFactory[Any]:
    """The factory published under ``name`` in ``kind``'s entry-point group."""
    try:
        from walstream_plugins.registry import load_factory as registry_load_factory
    except ImportError:
        pass
    else:
        factory: BackendFactory[Any] = registry_load_factory(kind, name)
        return factory
    group = GROUPS[kind]
    entry_points = {ep.name: ep for ep in importlib.metadata.entry_points(group=group)}
    if name not in entry_points:
        installed = ", ".join(sorted(entry_points)) or "(none)"
        raise ConfigError(
            f"no {kind} backend named {name!r} is installed (entry-point group {group}); "
            f"installed: {installed}"
        )
    loaded = entry_points[name].load()
    if not isinstance(loaded, BackendFactory):
        raise ConfigError(f"entry point {group}:{name} does not point at a BackendFactory")
    return loaded


_PATH_MODULES: dict[str, ModuleType] = {}


def load_target(target: str) -> Any:
    """``package.module:attr`` or ``/path/to/file.py:attr`` → the attribute
    (``:__loader_module__`` → the module itself)."""
    module_part, _, attr = target.rpartition(":")
    if not module_part or not attr:
        raise ConfigError(f"target {target!r}: expected module:attribute or file.py:attribute")
    module: ModuleType
    if module_part.endswith(".py"):
        path = str(Path(module_part).resolve())
        if path not in _PATH_MODULES:
            name = f"_walstream_conformance_target_{len(_PATH_MODULES)}"
            spec = importlib.util.spec_from_file_location(name, path)
            if spec is None or spec.loader is None:
                raise ConfigError(f"target {target!r}: cannot load {path}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
            _PATH_MODULES[path] = module
        module = _PATH_MODULES[path]
    else:
        module = importlib.import_module(module_part)
    if attr == "__loader_module__":
        return module
    return getattr(module, attr)


def read_config_section(path: Path, kind: BackendKind) -> dict[str, Any]:
    """A backend section from a YAML file: either a bare section (``type: ebs`` + options) or a
    whole deployment whose ``wal`` / ``object_store`` / ``metadata`` key holds it."""
    import yaml

    document = yaml.safe_load(path.read_text())
    if not isinstance(document, dict):
        raise ConfigError(f"{path}: expected a mapping of options")
    section = document.get(kind, document)
    if not isinstance(section, dict):
        raise ConfigError(f"{path}: {kind} must be a mapping of options")
    return dict(section)


def _jsonable(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, Mapping):
        return {str(key): _jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(item) for item in value]
    return value


@dataclass(frozen=True)
class BackendSpec:
    """How to build a backend in any process: JSON-serialisable.

    Either ``name`` (an installed entry point) with its raw option ``section``, or ``target``
    (``module:callable`` / ``file.py:callable``) called with ``kwargs``.
    """

    kind: BackendKind
    name: str | None = None
    section: dict[str, Any] = field(default_factory=dict)
    target: str | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    base_dir: str = "."

    def build(self) -> Any:
        if self.target is not None:
            return load_target(self.target)(**self.kwargs)
        if self.name is None:
            raise ConfigError("a BackendSpec needs a name or a target")
        factory = load_factory(self.kind, self.name)
        return factory.build(self.section, BuildContext(base_dir=Path(self.base_dir)), self.kind)

    def to_json(self) -> str:
        return json.dumps(
            {
                "kind": self.kind,
                "name": self.name,
                "section": _jsonable(self.section),
                "target": self.target,
                "kwargs": _jsonable(self.kwargs),
                "base_dir": self.base_dir,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> BackendSpec:
        raw = json.loads(text)
        return cls(**raw)


def build_backend(spec: BackendSpec) -> Any:
    return spec.build()


@contextlib.contextmanager
def backend_options(
    kind: BackendKind, name: str, config: Path | None, scratch: Path
) -> Iterator[BackendSpec]:
    """A spec for backend ``name``: from ``config`` when given, else from the factory's
    ``provision`` hook (a throwaway instance in ``scratch``), else from its defaults."""
    factory = load_factory(kind, name)
    if config is not None:
        section = read_config_section(config, kind)
        section.pop("type", None)
        yield BackendSpec(kind, name=name, section=section, base_dir=str(config.parent))
        return
    if factory.provision is None:
        yield BackendSpec(
            kind, name=name, section=_default_section(factory, scratch), base_dir=str(scratch)
        )
        return
    with factory.provision(scratch) as options:
        section = {
            key: value for key, value in _jsonable(dict(options)).items() if value is not None
        }
        yield BackendSpec(kind, name=name, section=section, base_dir=str(scratch))


def _default_section(factory: BackendFactory[Any], scratch: Path) -> dict[str, Any]:
    """Options for a throwaway instance of a backend without a ``provision`` hook: a path option
    points into ``scratch`` and a ``name`` option (a shared in-process volume) is made unique, so
    instances built from the section share one medium that no other test uses."""
    section: dict[str, Any] = {}
    for option in factory.options:
        if option.kind == "path" and (option.required or option.default is None):
            section[option.name] = str(scratch / option.name)
        elif option.name == "name" and option.kind == "str":
            section[option.name] = f"conformance-{scratch.name}-{id(scratch):x}"
    return section
