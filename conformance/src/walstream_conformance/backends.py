"""Finding and building backends: by entry-point name, by config file, by provisioning hook, or by
an importable target (what the crash harness hands a child process).

Discovery by name is :mod:`walstream_plugins.registry`'s (:func:`load_factory` and ``GROUPS`` are
re-exported from there); this module only builds what it found."""

from __future__ import annotations

import contextlib
import glob
import importlib
import importlib.util
import itertools
import json
import secrets
import shutil
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from walstream.config import BackendFactory, BackendKind, BuildContext
from walstream.errors import ConfigError
from walstream_plugins.registry import GROUPS, load_factory

__all__ = [
    "GROUPS",
    "BackendSpec",
    "backend_options",
    "build_backend",
    "isolated_section",
    "isolation_changes",
    "load_factory",
    "load_target",
    "read_config_section",
]

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
    whole deployment whose ``wal`` / ``object_store`` / ``metadata`` key holds it. ``${VAR}``
    references expand from the environment as in a deployment file."""
    import yaml
    from walstream_plugins.deployment import expand_environment

    document = expand_environment(yaml.safe_load(path.read_text()))
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
    ``provision`` hook (a throwaway instance in ``scratch``), else from its defaults.

    A spec from ``config`` does not reuse the configured medium: every call derives a fresh
    one from it (:func:`isolated_section`), because every test needs an empty WAL, store or
    catalogue — a WAL left claimed by an earlier test (or an earlier run) fences the next one.
    Files and folders derived from configured paths are removed on exit.
    """
    factory = load_factory(kind, name)
    if config is not None:
        section = read_config_section(config, kind)
        section.pop("type", None)
        isolated, created = isolated_section(factory, section, config.parent)
        try:
            yield BackendSpec(kind, name=name, section=isolated, base_dir=str(config.parent))
        finally:
            for path in created:
                _remove(path)
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


#: Names of string options that say where a backend keeps its data inside a shared service
#: (a key prefix in a bucket, a log name on chunk servers, an in-process volume name, a schema
#: in a shared database).
NAMESPACE_OPTIONS = frozenset({"prefix", "log_id", "name", "schema"})

_RUN_ID = f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
_INSTANCES = itertools.count(1)


def isolated_section(
    factory: BackendFactory[Any], section: Mapping[str, Any], base_dir: Path
) -> tuple[dict[str, Any], list[Path]]:
    """``section`` rewritten to address a medium no other test (and no earlier run) uses,
    derived from the options the factory declares:

    - a ``path`` option (a WAL file, an object folder, a database) becomes a new sibling,
      ``<stem>.conformance-<run>-<n><suffix>`` next to the configured one. A configured path
      that exists and is neither a file nor a folder (a block device) is kept: it cannot be
      copied, so the tests share it;
    - a ``prefix`` option (or one ending in ``_prefix``) gets ``conformance-<run>-<n>/``
      appended: a fresh key space in the same bucket;
    - a ``log_id``, ``name`` or ``schema`` option gets ``-conformance-<run>-<n>`` appended (or is set to
      ``conformance-<run>-<n>`` when unset).

    Every other option (endpoints, credentials, sizes) is kept as configured. Returns the new
    section and the derived paths, which the caller removes when the test is done.
    """
    token = f"conformance-{_RUN_ID}-{next(_INSTANCES)}"
    result = dict(section)
    created: list[Path] = []
    for option in factory.options:
        value = section.get(option.name, option.default)
        if option.kind == "path":
            if value is None:
                continue
            configured = Path(str(value)).expanduser()
            if not configured.is_absolute():
                configured = base_dir / configured
            if configured.exists() and not (configured.is_file() or configured.is_dir()):
                continue
            derived = configured.with_name(f"{configured.stem}.{token}{configured.suffix}")
            result[option.name] = str(derived)
            created.append(derived)
        elif option.kind == "str" and (option.name == "prefix" or option.name.endswith("_prefix")):
            prefix = "" if value is None else str(value)
            if prefix and not prefix.endswith("/"):
                prefix += "/"
            result[option.name] = f"{prefix}{token}/"
        elif option.kind == "str" and option.name in NAMESPACE_OPTIONS:
            result[option.name] = token if value in (None, "") else f"{value}-{token}"
    return result, created


def isolation_changes(
    factory: BackendFactory[Any], section: Mapping[str, Any], isolated: Mapping[str, Any]
) -> list[tuple[str, str]]:
    """What :func:`isolated_section` changed, as ``(option, "configured -> per-test")`` rows."""
    rows = []
    for option in factory.options:
        before = section.get(option.name, option.default)
        after = isolated.get(option.name, before)
        if after != before:
            shown = "(unset)" if before in (None, "") else str(before)
            rows.append((option.name, f"{shown} -> {after}"))
    return rows


def _remove(path: Path) -> None:
    """Remove a derived path and its companions (``meta.<token>.db-wal``, ``-shm``, …): every
    name that starts with it carries the unique token, so nothing else can match."""
    for item in [path, *path.parent.glob(f"{glob.escape(path.name)}?*")]:
        if item.is_dir() and not item.is_symlink():
            shutil.rmtree(item, ignore_errors=True)
        else:
            item.unlink(missing_ok=True)


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
