"""The plugin host core talks to: the object registered under the ``walstream.host`` entry-point
group (see :mod:`walstream.config.host`, which defines what it must offer).

Each method delegates to the module that does the work (:mod:`.deployment`, :mod:`.registry`,
:mod:`.hooks`, :mod:`.metrics`); nothing here holds state.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from walstream.config import BackendFactory, BackendKind

from .deployment import Deployment, DeploymentSource, load_deployment
from .hooks import PluggyHooks, make_plugin_manager
from .metrics import get_metrics
from .registry import BackendDescription, installed_backends, load_factory

__all__ = ["HOST", "PluginsHost"]


class PluginsHost:
    """walstream's plugin host: YAML deployments, stevedore discovery, pluggy hooks."""

    def load_deployment(self, source: DeploymentSource) -> Deployment:
        return load_deployment(source)

    def installed_backends(self) -> Sequence[BackendDescription]:
        return installed_backends()

    def load_factory(self, kind: BackendKind, name: str) -> BackendFactory[Any]:
        return load_factory(kind, name)

    def make_hooks(self, disabled: Sequence[str] = ()) -> PluggyHooks:
        return PluggyHooks(make_plugin_manager(load_entrypoints=True, disabled=disabled))

    def metrics_renderer(self, hooks: Any) -> Callable[[], str] | None:
        manager = getattr(hooks, "plugin_manager", None)
        metrics = None if manager is None else get_metrics(manager)
        return None if metrics is None else metrics.render_prometheus


HOST = PluginsHost()
"""The instance the ``walstream.host`` entry point names."""
