"""walstream plugin host: backend discovery (stevedore), lifecycle hooks (pluggy) and YAML
deployments that assemble a node from installed plugins."""

from __future__ import annotations

from .deployment import Backends, Deployment, default_deployment, load_deployment
from .hooks import PluggyHooks, hookimpl, make_plugin_manager
from .host import HOST, PluginsHost
from .metrics import Metrics, get_metrics
from .registry import BackendDescription, installed_backends, load_factory, register_factory

__all__ = [
    "HOST",
    "BackendDescription",
    "Backends",
    "Deployment",
    "Metrics",
    "PluggyHooks",
    "PluginsHost",
    "default_deployment",
    "get_metrics",
    "hookimpl",
    "installed_backends",
    "load_deployment",
    "load_factory",
    "make_plugin_manager",
    "register_factory",
]
