"""The deployment of ``--config`` and what a command builds from it, through the plugin host
(:mod:`walstream.config.host`): one backend without a node, or the node lock while a command
runs the node itself."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from walstream.cli.output import PROG
from walstream.config.factory import BackendKind
from walstream.config.host import HostDeployment, PluginHost, find_host

if TYPE_CHECKING:
    from walstream.engine.node_lock import LiveNode

__all__ = [
    "backend",
    "command_name",
    "holding_node",
    "live_holder",
    "load_deployment",
    "plugin_host",
    "set_command_name",
]

_running_command = "command"
"""The command being run (``read``, ``streams list``...), recorded in the node lock it holds."""


def command_name() -> str:
    return _running_command


def set_command_name(name: str) -> None:
    """Record the command being run (``read``, ``streams list``...)."""
    global _running_command
    _running_command = name


@asynccontextmanager
async def holding_node(config: str | None) -> AsyncIterator[None]:
    """Hold the node lock of ``config`` for a command that runs the node itself and has no
    way through a server (``recover``, ``demo``, ``bench``): raises
    :class:`~walstream.engine.node_lock.NodeBusy` (exit 2) naming the live process that runs the node."""
    from walstream.engine import node_lock

    deployment = load_deployment(config)
    lock = node_lock.hold(deployment, f"{PROG} {command_name()}")
    if lock is None and node_lock.lock_path(deployment) is None:
        holder = await live_holder(config, deployment)
        if holder is not None:
            raise node_lock.NodeBusy(f"{holder.describe()}: stop it first", holder)
    try:
        yield
    finally:
        if lock is not None:
            lock.release()


async def live_holder(config: str | None, deployment: HostDeployment) -> LiveNode | None:
    """The live process that runs the node of ``deployment``, or None.

    With a file-based metadata store (SQLite) that is the holder of the node lock. A shared
    store (PostgreSQL) has no lock file: there the node is live elsewhere while its row is
    RUNNING with an unexpired lease (a ``cluster:`` section), and its address is its
    ``node.advertise``. Opening such a node here would register a new epoch and fence the
    process that runs it. A node without a lease cannot be told live from crashed, and is
    opened as before.
    """
    from walstream.engine import node_lock

    path = node_lock.lock_path(deployment)
    if path is not None:
        return None if node_lock.held_here(path) else node_lock.probe(path)
    if (deployment.sections.get("metadata") or {}).get("type") == "memory":
        return None  # a memory store is never shared between processes
    async with backend(config, "metadata") as metadata:
        nodes = await metadata.list_nodes()
        now_ms = await metadata.store_time_ms()
    for node in nodes:
        if node.node_id == deployment.node_id and node.live(now_ms):
            return node_lock.LiveNode(path=None, node_id=node.node_id, url=node.address)
    return None


def plugin_host() -> PluginHost:
    """The plugin host (found through its entry point), which reads deployments and lists
    backends for every command."""
    return find_host(f"{PROG} {command_name()} reads deployments through the plugin host")


def load_deployment(config: str | None) -> HostDeployment:
    """The deployment of ``--config``, or the embedded default one."""
    return plugin_host().load_deployment(config)


@asynccontextmanager
async def backend(config: str | None, kind: BackendKind) -> AsyncIterator[Any]:
    """Build one backend (``object_store`` or ``metadata``) of the deployment without starting
    a node: inspecting must not register a node or claim a WAL."""
    deployment = load_deployment(config)
    factory = deployment.factories[kind]
    options = {key: value for key, value in deployment.sections[kind].items() if key != "type"}
    backend = factory.create(options, deployment.build_context())
    try:
        yield backend
    finally:
        await backend.close()
