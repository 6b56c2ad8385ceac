"""Extra listeners: protocols other distributions serve from ``walstream serve``, next to the
HTTP service, in the same event loop and on the same node.

A distribution publishes one object under the entry-point group :data:`LISTENERS_GROUP` that
core owns; the entry point's name is the deployment's top-level key that turns the listener on::

    [project.entry-points."walstream.listeners"]
    kafka = "<the module>:LISTENER"        # walstream-kafka: a `kafka:` section opens it

The object has the shape of :class:`ListenerExtension`: the options of its section (checked by
the plugin host like every other section, each error naming the key) and ``start``, which
``walstream serve`` awaits once the node is open and the HTTP listener is bound. What it returns
(:class:`ExtraListener`) follows the node's life: :meth:`ExtraListener.rebind` when a fenced node
rejoins with a new client, :meth:`ExtraListener.begin_shutdown` at SIGTERM together with the
HTTP service's, :meth:`ExtraListener.close` before the client closes (so everything it
acknowledged is uploaded by the client's close).

Rules kept here:

1. Nothing is imported until a deployment has the listener's section: listing and loading other
   deployments never import a listener's distribution.
2. A section whose listener is documented (:data:`KNOWN_LISTENERS`) but not installed is a
   :class:`~walstream.errors.ConfigError` saying what to install; an unknown top-level key stays
   the plugin host's "unknown key" error.
3. A listener that fails to import, or whose object is not a listener, is a ConfigError naming
   its distribution, never skipped: a deployment that asks for a protocol gets it or refuses to
   start.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from walstream.config.host import entry_points_in
from walstream.config.options import Option
from walstream.errors import ConfigError

__all__ = [
    "KNOWN_LISTENERS",
    "LISTENERS_GROUP",
    "ExtraListener",
    "ListenerContext",
    "ListenerExtension",
    "installed_listener_names",
    "listener_section_names",
    "load_listener",
]

LISTENERS_GROUP = "walstream.listeners"
"""The entry-point group of extra listeners; an entry point's name is its section's key."""

KNOWN_LISTENERS: dict[str, str] = {"kafka": "walstream-kafka"}
"""Listener sections walstream documents → the distribution that serves them (install hint)."""


@dataclass(frozen=True)
class ListenerContext:
    """What a listener gets when ``walstream serve`` starts it."""

    client: Any
    """The node's :class:`walstream.engine.client.Client` (typed loosely: core's layers put the
    engine above the configuration)."""
    section: Mapping[str, Any]
    """Its validated deployment section (defaults filled in)."""
    token: str | None
    """The server's token (``--token``, ``WALSTREAM_TOKEN`` or ``server.token``): a listener
    that authenticates clients requires it whenever it is set."""
    node_id: int
    deployment: Any
    """The deployment (a :class:`walstream.config.host.HostDeployment`)."""


class ExtraListener(Protocol):
    """A started listener, as ``walstream serve`` drives it."""

    @property
    def address(self) -> str:
        """``host:port`` it is bound to (port 0 in the section: the port chosen)."""

    def rebind(self, client: Any) -> None:
        """Serve ``client`` from now on (the node rejoined with a new epoch)."""

    def begin_shutdown(self) -> None:
        """Stop accepting connections; answer waiting long polls with what they have."""

    async def close(self, grace_s: float) -> None:
        """Let requests in progress finish (at most ``grace_s``), then close every connection."""


@runtime_checkable
class ListenerExtension(Protocol):
    """What an entry point of :data:`LISTENERS_GROUP` names."""

    @property
    def description(self) -> str:
        """One line for ``walstream plugins`` and error messages."""

    @property
    def options(self) -> tuple[Option, ...]:
        """Every key its section accepts."""

    def check(self, section: Mapping[str, Any]) -> None:
        """Cross-key checks of the validated section (ConfigError naming the key)."""

    async def start(self, context: ListenerContext) -> ExtraListener:
        """Bind and start serving; a port in use is a ConfigError naming the key."""


def _dist_label(entry_point: importlib.metadata.EntryPoint) -> str:
    dist = entry_point.dist
    return "an unknown distribution" if dist is None else f"{dist.metadata['Name']} {dist.version}"


def installed_listener_names() -> list[str]:
    """Names (section keys) of the installed listeners; nothing is imported."""
    return sorted({entry_point.name for entry_point in entry_points_in(LISTENERS_GROUP)})


def listener_section_names() -> list[str]:
    """Every top-level key a listener may own: the documented ones and the installed ones."""
    return sorted(set(KNOWN_LISTENERS) | set(installed_listener_names()))


def load_listener(name: str) -> ListenerExtension:
    """The listener that serves the section ``name`` (ConfigError when it is not installed, is
    installed twice, fails to import or is not a listener)."""
    matches = [ep for ep in entry_points_in(LISTENERS_GROUP) if ep.name == name]
    if not matches:
        dist = KNOWN_LISTENERS.get(name)
        hint = f"pip install {dist}" if dist else "install the distribution that provides it"
        raise ConfigError(
            f"{name}: this section needs the {name} listener, which is not installed; run: {hint}"
        )
    if len({ep.value for ep in matches}) > 1:
        sources = "; ".join(f"{_dist_label(ep)} ({ep.value})" for ep in matches)
        raise ConfigError(
            f"{name}: several listeners are installed for this section: {sources}. "
            "Uninstall all but one."
        )
    entry_point = matches[0]
    try:
        listener = entry_point.load()
    except Exception as error:
        raise ConfigError(
            f"{name}: the listener from {_dist_label(entry_point)} failed to load "
            f"({entry_point.value}): {type(error).__name__}: {error}; reinstall or upgrade it"
        ) from error
    if not isinstance(listener, ListenerExtension):
        raise ConfigError(
            f"{name}: the listener from {_dist_label(entry_point)} ({entry_point.value}) is a "
            f"{type(listener).__name__}, not a walstream listener; upgrade it"
        )
    return listener
