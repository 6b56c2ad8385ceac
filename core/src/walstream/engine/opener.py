"""``walstream.open(config)``: a client from a deployment (YAML path, dict or Deployment).

Deployment files are assembled by the plugin host (``walstream-plugins``), which core reaches
only through the ``walstream.host`` entry-point group (:mod:`walstream.config.host`).
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import sys
from collections.abc import Generator, Mapping
from pathlib import Path
from typing import Any

from walstream.clock import Clock
from walstream.config.engine import EngineConfig, RecoveryConfig
from walstream.config.factory import BuildContext
from walstream.config.host import find_host
from walstream.engine import node_lock
from walstream.engine.client import Client
from walstream.engine.events import EngineHooks
from walstream.errors import ConfigError
from walstream.metadata.contract import NodeInfo

__all__ = ["OpenClient", "open"]


def _with_accept_loss(config: EngineConfig, accept_loss: bool) -> EngineConfig:
    if not accept_loss:
        return config
    return dataclasses.replace(config, recovery=RecoveryConfig(accept_loss=True))


def _build_client(
    config: Any, hooks: EngineHooks | None, clock: Clock | None, accept_loss: bool = False
) -> Client:
    if isinstance(config, Client):
        config.config = _with_accept_loss(config.config, accept_loss)
        return config
    if hasattr(config, "build_backends") and hooks is not None:
        deployment = config  # already assembled: the host has nothing left to do
    else:
        host = find_host(
            "walstream.open(config) assembles backends through the plugin host",
            advice=" (or build a walstream.Client from backends directly)",
        )
        deployment = config if hasattr(config, "build_backends") else host.load_deployment(config)
        if hooks is None:
            disabled = tuple(deployment.sections.get("hooks", {}).get("disable", ()) or ())
            hooks = host.make_hooks(disabled)
    # A deployment this call loaded itself (a path, a dict, the embedded default) gets the node
    # lock: a node another live process runs is refused (NodeBusy), never taken over.
    program = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"
    lock = (
        None
        if hasattr(config, "build_backends")
        else node_lock.hold(deployment, f"walstream.open in {program}")
    )
    try:
        backends = deployment.build_backends()
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    client = Client(
        wal=backends.wal,
        objects=backends.objects,
        metadata=backends.metadata,
        config=_with_accept_loss(deployment.engine_config, accept_loss),
        hooks=hooks,
        clock=clock,
    )
    client.owns_backends = True
    client.node_lock = lock
    if client.config.cluster is not None:
        _join_cluster(client, deployment)
    if config is None:
        folder = shlex.quote(os.getcwd())  # the embedded deployment lives in ./walstream-data
        client.accept_loss_command = f"cd {folder} && walstream recover --accept-loss"
    elif isinstance(config, (str, os.PathLike)):
        path = shlex.quote(str(Path(config).absolute()))
        client.accept_loss_command = f"walstream recover --accept-loss -c {path}"
    return client


_SECRET_WORDS = ("token", "secret", "password", "credential", "access_key")


def _registered_wal(section: Mapping[str, Any]) -> dict[str, Any]:
    """The deployment's ``wal`` section as a node registers it: JSON values, secrets left out
    (the node failing it over supplies its own credentials, from its environment)."""
    registered: dict[str, Any] = {}
    for key, value in section.items():
        if value is None or any(word in key.lower() for word in _SECRET_WORDS):
            continue
        if isinstance(value, Path):
            value = str(value)
        elif isinstance(value, tuple):
            value = list(value)
        registered[key] = value
    return registered


def _join_cluster(client: Client, deployment: Any) -> None:
    """Register the WAL section (so any node can rebuild this node's WAL) and let this node
    rebuild the WAL of a dead node from what that node registered, through the plugin host."""
    section = deployment.sections.get("wal")
    if not isinstance(section, Mapping) or "type" not in section:
        return
    client.wal_section = _registered_wal(section)
    base_dir = Path(deployment.base_dir)

    def build_wal(node: NodeInfo) -> Any:
        host = find_host("an automatic failover rebuilds the dead node's WAL")
        kind = node.wal_config.get("type")
        if not isinstance(kind, str):
            raise ConfigError(
                f"node {node.node_id} registered no WAL type ({node.wal_config!r}); it cannot "
                "be failed over automatically: run `walstream recover` on its own deployment"
            )
        options = {key: value for key, value in node.wal_config.items() if key != "type"}
        factory = host.load_factory("wal", kind)
        return factory.build(options, BuildContext(base_dir=base_dir, node_id=node.node_id), "wal")

    client.wal_factory = build_wal


class OpenClient:
    """Both awaitable (``client = await walstream.open(cfg)``) and an async context manager
    (``async with walstream.open(cfg) as client``)."""

    def __init__(
        self,
        config: Any,
        hooks: EngineHooks | None,
        clock: Clock | None,
        accept_loss: bool = False,
    ) -> None:
        self._config = config
        self._hooks = hooks
        self._clock = clock
        self._accept_loss = accept_loss
        self._client: Client | None = None

    async def _start(self) -> Client:
        self._client = _build_client(self._config, self._hooks, self._clock, self._accept_loss)
        try:
            return await self._client.start()
        except BaseException:
            await _close_quietly(self._client)
            raise

    def __await__(self) -> Generator[Any, None, Client]:
        return self._start().__await__()

    async def __aenter__(self) -> Client:
        return await self._start()

    async def __aexit__(self, *exc: object) -> None:
        if self._client is not None:
            await self._client.close()


async def _close_quietly(client: Client) -> None:
    try:
        await client.close()
    except Exception:
        pass


def open(
    config: str | os.PathLike[str] | Mapping[str, Any] | Any | None = None,
    *,
    hooks: EngineHooks | None = None,
    clock: Clock | None = None,
    accept_loss: bool = False,
) -> OpenClient:
    """Open a node from a deployment: a YAML file path, a dict of the same shape, a Deployment
    of the plugin host (walstream-plugins), or ``None`` for the embedded default in
    ./walstream-data.

    A deployment whose metadata is a SQLite file has a node lock: while the client is open this
    process holds it, and a node that another live process runs (``walstream serve``, a
    ``walstream`` command) raises :class:`~walstream.engine.node_lock.NodeBusy` (a ConfigError naming
    that process) instead of being taken over, which would fence the running process.

    ``accept_loss=True`` is the operator's explicit acceptance of a damaged WAL (what
    ``walstream recover --accept-loss`` does): recovery records every lost range as a data-loss
    gap instead of refusing to start (:class:`~walstream.config.RecoveryConfig`)."""
    return OpenClient(config, hooks, clock, accept_loss)
