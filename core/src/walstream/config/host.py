"""The one seam between core and the plugin host.

Core assembles nothing from YAML itself: reading a deployment file, discovering installed
backends and loading hook extensions is the plugin host's job (the ``walstream-plugins`` dist).
Core never imports it by name. The host publishes one object under the entry-point group
:data:`HOST_GROUP` that core owns, the way a backend publishes a factory under
``walstream.wal``::

    [project.entry-points."walstream.host"]
    plugins = "<the host module>:HOST"     # walstream-plugins registers its host so

and :func:`find_host` returns that object, typed by the :class:`PluginHost` protocol below:
everything core asks of a host, and nothing more.

Rules kept here:

1. No host installed is a :class:`~walstream.errors.ConfigError` that says what to install,
   never an ImportError or an AttributeError from deep inside a command.
2. Several hosts installed, a host that fails to import, or an object that is not a host are
   ConfigErrors naming the distribution to fix or uninstall — never silently skipped, because
   nothing else could assemble the deployment.
3. Only the entry point is imported, and only when a caller needs the host: ``import walstream``
   and every command that needs no deployment work without one.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from walstream.config.engine import EngineConfig
from walstream.config.factory import BackendFactory, BackendKind, BuildContext
from walstream.config.options import Option
from walstream.errors import ConfigError

__all__ = [
    "HOST_DIST",
    "HOST_GROUP",
    "BackendListing",
    "HostBackends",
    "HostDeployment",
    "PluginHost",
    "entry_points_in",
    "find_host",
    "forget_entry_points",
]

HOST_GROUP = "walstream.host"
"""The entry-point group a plugin host registers its :class:`PluginHost` object in."""

HOST_DIST = "walstream-plugins"
"""The distribution that provides walstream's own plugin host (the install hint)."""

DeploymentSource = str | os.PathLike[str] | Mapping[str, Any] | None


class HostBackends(Protocol):
    """A deployment's backends, built but not started. Typed loosely because the contracts
    (:class:`walstream.wal.WriteAheadLog`, :class:`walstream.objects.ObjectStore`,
    :class:`walstream.metadata.MetadataStore`) sit in layers above this one; the host checks
    each backend against its contract when it builds it."""

    @property
    def wal(self) -> Any: ...

    @property
    def objects(self) -> Any: ...

    @property
    def metadata(self) -> Any: ...


class HostDeployment(Protocol):
    """A validated deployment, as core uses it (the CLI, ``walstream.open``, the server)."""

    @property
    def source(self) -> Path | None:
        """The YAML file it came from (None for a mapping or the embedded default)."""

    @property
    def base_dir(self) -> Path:
        """Folder relative paths were resolved against."""

    @property
    def engine_config(self) -> EngineConfig: ...

    @property
    def sections(self) -> Mapping[str, Any]:
        """Every top-level key after validation: defaults filled in, sizes in bytes, durations
        in seconds, paths absolute; backend sections keep their ``type``."""

    @property
    def factories(self) -> Mapping[BackendKind, BackendFactory[Any]]:
        """The factory each backend section names."""

    @property
    def node_id(self) -> int: ...

    @property
    def disabled_hooks(self) -> tuple[str, ...]:
        """Hook extensions the deployment disables (``hooks.disable``)."""

    def build_context(self) -> BuildContext:
        """What a factory of this deployment gets besides its options."""

    def build_backends(self) -> HostBackends:
        """Create the WAL, object store and metadata store (not started)."""


class BackendListing(Protocol):
    """One installed backend, as ``walstream plugins`` lists it."""

    @property
    def kind(self) -> BackendKind: ...

    @property
    def name(self) -> str: ...

    @property
    def dist(self) -> str | None:
        """Distribution that publishes it (None when unknown)."""

    @property
    def version(self) -> str | None: ...

    @property
    def description(self) -> str: ...

    @property
    def options(self) -> tuple[Option, ...]: ...

    @property
    def error(self) -> str | None:
        """Why it cannot be loaded, if it cannot."""


@runtime_checkable
class PluginHost(Protocol):
    """What core needs from a plugin host. Every method raises
    :class:`~walstream.errors.ConfigError` for a bad deployment or a missing backend, with a
    message that names the key and what to do."""

    def load_deployment(self, source: DeploymentSource) -> HostDeployment:
        """Read and validate a deployment: the path of a YAML file, a parsed mapping, a
        deployment object of this host (returned as is), or None for the embedded default in
        ``./walstream-data``. Touches no medium."""

    def installed_backends(self) -> Sequence[BackendListing]:
        """Every backend a deployment can name; ones that fail to load carry ``error``."""

    def load_factory(self, kind: BackendKind, name: str) -> BackendFactory[Any]:
        """The factory for ``<kind>.type: <name>``."""

    def make_hooks(self, disabled: Sequence[str] = ()) -> Any:
        """The engine's hooks object (a :class:`walstream.engine.events.EngineHooks`) with every
        installed hook extension except ``disabled``."""

    def metrics_renderer(self, hooks: Any) -> Callable[[], str] | None:
        """A function returning the Prometheus exposition of the metrics that ``hooks`` (made
        by :meth:`make_hooks`) collect, or None when no metrics extension is loaded."""


@functools.cache
def _installed_entry_points() -> Any:
    """Every installed entry point, from one scan of the installed distributions (an
    ``EntryPoints``; Python 3.11 wraps it in ``SelectableGroups``, which selects the same way)."""
    return importlib.metadata.entry_points()


def entry_points_in(group: str) -> list[importlib.metadata.EntryPoint]:
    """The installed entry points of ``group`` (nothing is imported). The installed
    distributions are scanned once per process for every group (a scan reads each one's
    metadata and would otherwise add to the start of each command); :func:`forget_entry_points`
    scans again."""
    return list(_installed_entry_points().select(group=group))


def forget_entry_points() -> None:
    """Scan the installed distributions again at the next look-up (for plugins installed, or
    put on ``sys.path``, while the process runs)."""
    _installed_entry_points.cache_clear()


def _host_entry_points() -> list[importlib.metadata.EntryPoint]:
    """The entry points of :data:`HOST_GROUP`."""
    return entry_points_in(HOST_GROUP)


def _dist_label(entry_point: importlib.metadata.EntryPoint) -> str:
    dist = entry_point.dist
    if dist is None:
        return f"entry point {entry_point.name} ({entry_point.value})"
    return f"{dist.metadata['Name']} {dist.version}"


def find_host(
    need: str = "this needs the walstream plugin host", *, advice: str = ""
) -> PluginHost:
    """The installed plugin host, loaded through the :data:`HOST_GROUP` entry point.

    ``need`` says what the caller was doing: a missing host raises :class:`ConfigError`
    ``"<need>: pip install walstream-plugins<advice>"``.
    """
    found = _host_entry_points()
    distinct = {(entry_point.value, _dist_label(entry_point)) for entry_point in found}
    if not found:
        raise ConfigError(f"{need}: pip install {HOST_DIST}{advice}")
    if len(distinct) > 1:
        listing = "; ".join(f"{label} ({value})" for value, label in sorted(distinct))
        raise ConfigError(
            f"several plugin hosts are installed in entry-point group {HOST_GROUP}: "
            f"{listing}. Uninstall all but one."
        )
    entry_point = found[0]
    try:
        host = entry_point.load()
    except Exception as error:
        raise ConfigError(
            f"the plugin host from {_dist_label(entry_point)} failed to load "
            f"({entry_point.value}): {type(error).__name__}: {error}. "
            f"Reinstall or upgrade {HOST_DIST}."
        ) from error
    if not isinstance(host, PluginHost):
        raise ConfigError(
            f"the plugin host from {_dist_label(entry_point)} ({entry_point.value}) is a "
            f"{type(host).__name__}, not a walstream plugin host; upgrade {HOST_DIST}"
        )
    return host
