"""Backend discovery: entry-point groups ``walstream.wal``, ``walstream.object_store`` and
``walstream.metadata``, each name → a :class:`walstream.config.BackendFactory`.

Rules kept here:

1. A configured backend name that is not installed fails loudly with :class:`ConfigError`
   listing the installed names of that kind, a close match, and the package that provides the
   name when it is one of walstream's own plugins.
2. A factory built for another ``CONTRACT_VERSION`` is refused; the message says which dist to
   upgrade.
3. An entry point that fails to import is reported with its dist and the import error — never
   skipped silently, because the deployment asked for it by name.
4. Only the named entry point is imported: a broken, unrelated plugin cannot break a
   deployment that does not use it.
"""

from __future__ import annotations

import difflib
import importlib.metadata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, get_args

import walstream
from stevedore import ExtensionManager
from stevedore.named import NamedExtensionManager
from walstream.config import CONTRACT_VERSION, BackendFactory, BackendKind, Option
from walstream.config.host import forget_entry_points
from walstream.errors import ConfigError

from .hooks import HOOKS_GROUP

__all__ = [
    "GROUPS",
    "PROVIDERS",
    "BackendDescription",
    "installed_backends",
    "installed_names",
    "load_factory",
    "refresh",
    "register_factory",
]

GROUPS: dict[BackendKind, str] = {
    "wal": "walstream.wal",
    "object_store": "walstream.object_store",
    "metadata": "walstream.metadata",
}

#: Packages that provide walstream's own backend names (install hints for unknown names).
PROVIDERS: dict[BackendKind, dict[str, str]] = {
    "wal": {
        "ebs": "walstream-wal-ebs",
        "s3": "walstream-wal-s3",
        "s3express": "walstream-wal-s3express",
        "nvme-quorum": "walstream-wal-nvme-quorum",
    },
    "object_store": {"s3": "walstream-wal-s3"},
    "metadata": {},
}

_KIND_LABELS: dict[BackendKind, str] = {
    "wal": "WAL",
    "object_store": "object store",
    "metadata": "metadata store",
}

_RUNTIME_DIST = "(registered in process)"


@dataclass(frozen=True)
class BackendDescription:
    """One installed backend, as ``walstream plugins`` lists it."""

    kind: BackendKind
    name: str
    dist: str | None
    """Distribution that publishes the entry point (None when unknown)."""
    version: str | None
    description: str
    options: tuple[Option, ...]
    error: str | None = None
    """Why the entry point could not be loaded, if it could not."""


@dataclass(frozen=True)
class _Candidate:
    name: str
    value: str
    dist: str | None
    version: str | None


# Factories registered by the running process; they take precedence over entry points.
_registered: dict[tuple[BackendKind, str], BackendFactory[Any]] = {}
# (group, name, value) → (dist name, version), rebuilt by refresh().
_dist_index: dict[tuple[str, str, str], tuple[str, str]] | None = None


def _check_kind(kind: str) -> BackendKind:
    if kind not in GROUPS:
        raise ConfigError(
            f"unknown backend kind {kind!r}; expected one of: {', '.join(get_args(BackendKind))}"
        )
    return kind


def refresh() -> None:
    """Forget what was discovered so far (backends, hook extensions, and core's look-ups of
    the plugin host and extra commands), so plugins installed (or put on ``sys.path``) while
    the process runs become visible."""
    global _dist_index
    _dist_index = None
    forget_entry_points()
    for group in (*GROUPS.values(), HOOKS_GROUP):
        ExtensionManager.ENTRY_POINT_CACHE.pop(group, None)


def _dist_of(group: str, name: str, value: str) -> tuple[str | None, str | None]:
    global _dist_index
    if _dist_index is None:
        index: dict[tuple[str, str, str], tuple[str, str]] = {}
        for kind_group in GROUPS.values():
            for entry_point in importlib.metadata.entry_points(group=kind_group):
                dist = entry_point.dist
                if dist is not None:
                    key = (kind_group, entry_point.name, entry_point.value)
                    index.setdefault(key, (dist.metadata["Name"], dist.version))
        _dist_index = index
    found = _dist_index.get((group, name, value))
    return found if found is not None else (None, None)


def _candidates(kind: BackendKind) -> list[_Candidate]:
    """Entry points of ``kind`` as stevedore discovers them (nothing is imported)."""
    group = GROUPS[kind]
    listing = NamedExtensionManager(
        group, names=[], on_missing_entrypoints_callback=None
    ).list_entry_points()
    result = []
    for entry_point in listing:
        dist, version = _dist_of(group, entry_point.name, entry_point.value)
        result.append(_Candidate(entry_point.name, entry_point.value, dist, version))
    return result


def installed_names(kind: BackendKind) -> list[str]:
    """Names a deployment may give as ``<kind>.type`` (sorted, without importing anything)."""
    kind = _check_kind(kind)
    names = {candidate.name for candidate in _candidates(kind)}
    names.update(name for registered_kind, name in _registered if registered_kind == kind)
    return sorted(names)


def _dist_label(dist: str | None, version: str | None) -> str:
    if dist is None:
        return "an unknown distribution"
    return f"{dist} {version}" if version else dist


def _unknown_name_error(kind: BackendKind, name: str) -> ConfigError:
    label = _KIND_LABELS[kind]
    installed = installed_names(kind)
    listing = ", ".join(installed) if installed else "(none)"
    provider = PROVIDERS[kind].get(name)
    if provider is not None:
        return ConfigError(
            f"{kind}.type: {label} {name!r} is not installed; installed: {listing}. "
            f"It is provided by {provider}: pip install {provider}"
        )
    known = sorted(set(installed) | set(PROVIDERS[kind]))
    close = difflib.get_close_matches(name, known, n=1)
    message = f"{kind}.type: unknown {label} {name!r}; installed: {listing}."
    if close:
        suggestion = close[0]
        message += f" Did you mean {suggestion!r}?"
        if suggestion not in installed:
            message += f" (provided by {PROVIDERS[kind][suggestion]})"
    return ConfigError(message)


def _checked(
    kind: BackendKind, name: str, plugin: Any, dist: str | None, version: str | None
) -> BackendFactory[Any]:
    origin = _dist_label(dist, version)
    if not isinstance(plugin, BackendFactory):
        raise ConfigError(
            f"{kind}.type: plugin {name!r} from {origin} is not a walstream BackendFactory "
            f"(got {type(plugin).__name__}); fix or uninstall {dist or 'that plugin'}"
        )
    if plugin.kind != kind:
        raise ConfigError(
            f"{kind}.type: plugin {name!r} from {origin} is registered as a "
            f"{_KIND_LABELS[kind]} but builds a {plugin.kind!r} backend; fix its entry point"
        )
    if plugin.contract_version != CONTRACT_VERSION:
        if plugin.contract_version < CONTRACT_VERSION:
            advice = (
                f"upgrade {dist or 'the plugin'} to a release built for contract "
                f"version {CONTRACT_VERSION}"
            )
        else:
            advice = (
                f"upgrade walstream (installed {walstream.__version__}) to a release with "
                f"contract version {plugin.contract_version}, or install an older "
                f"{dist or 'plugin'}"
            )
        raise ConfigError(
            f"{kind}.type: plugin {name!r} from {origin} implements contract version "
            f"{plugin.contract_version}, but this walstream speaks version {CONTRACT_VERSION}; "
            f"{advice}"
        )
    return plugin


def load_factory(kind: BackendKind, name: str) -> BackendFactory[Any]:
    """The factory for ``<kind>.type: <name>``, or :class:`ConfigError` saying what to install,
    upgrade or fix."""
    kind = _check_kind(kind)
    if not isinstance(name, str) or not name:
        raise ConfigError(
            f"{kind}.type: expected a plugin name such as {', '.join(installed_names(kind))}; "
            f"got {name!r}"
        )
    registered = _registered.get((kind, name))
    if registered is not None:
        return _checked(kind, name, registered, _RUNTIME_DIST, None)

    matches = [candidate for candidate in _candidates(kind) if candidate.name == name]
    if not matches:
        raise _unknown_name_error(kind, name)
    if len({(match.dist, match.value) for match in matches}) > 1:
        sources = "; ".join(
            f"{_dist_label(match.dist, match.version)} ({match.value})" for match in matches
        )
        raise ConfigError(
            f"{kind}.type: {_KIND_LABELS[kind]} {name!r} is provided by several packages: "
            f"{sources}. Uninstall all but one."
        )
    match = matches[0]

    failures: list[BaseException] = []

    def remember_failure(_manager: Any, _entry_point: Any, error: BaseException) -> None:
        failures.append(error)

    manager: NamedExtensionManager[Any] = NamedExtensionManager(
        GROUPS[kind],
        names=[name],
        on_load_failure_callback=remember_failure,
        on_missing_entrypoints_callback=None,
    )
    if failures or not manager.extensions:
        error = failures[0] if failures else None
        reason = f"{type(error).__name__}: {error}" if error is not None else "nothing loaded"
        dist = match.dist or "the package that provides it"
        raise ConfigError(
            f"{kind}.type: {_KIND_LABELS[kind]} {name!r} from "
            f"{_dist_label(match.dist, match.version)} failed to load ({match.value}): "
            f"{reason}. Reinstall or upgrade {dist}."
        ) from error
    return _checked(kind, name, manager.extensions[0].plugin, match.dist, match.version)


def installed_backends() -> list[BackendDescription]:
    """Every backend a deployment can name, sorted by kind then name. Entry points that fail to
    load are listed too, with ``error`` set (``walstream plugins`` shows why)."""
    descriptions: list[BackendDescription] = []
    for kind in GROUPS:
        seen: set[str] = set()
        for (registered_kind, name), factory in sorted(_registered.items()):
            if registered_kind == kind:
                seen.add(name)
                descriptions.append(
                    BackendDescription(
                        kind, name, _RUNTIME_DIST, None, factory.description, factory.options
                    )
                )
        for candidate in _candidates(kind):
            if candidate.name in seen:
                continue
            seen.add(candidate.name)
            try:
                factory = load_factory(kind, candidate.name)
            except ConfigError as error:
                descriptions.append(
                    BackendDescription(
                        kind, candidate.name, candidate.dist, candidate.version, "", (),
                        error=str(error).removeprefix(f"{kind}.type: "),
                    )
                )
                continue
            descriptions.append(
                BackendDescription(
                    kind, candidate.name, candidate.dist, candidate.version,
                    factory.description, factory.options,
                )
            )
    kind_order = list(GROUPS)
    descriptions.sort(key=lambda item: (kind_order.index(item.kind), item.name))
    return descriptions


def register_factory(factory: BackendFactory[Any]) -> Callable[[], None]:
    """Make ``factory`` loadable by name in this process without an installed dist (embedding
    applications, tests). It takes precedence over an entry point of the same name.
    Returns a function that removes it again."""
    kind = _check_kind(factory.kind)
    key = (kind, factory.name)
    if key in _registered:
        raise ConfigError(
            f"{kind} backend {factory.name!r} is already registered in this process"
        )
    _registered[key] = factory

    def unregister() -> None:
        if _registered.get(key) is factory:
            del _registered[key]

    return unregister
