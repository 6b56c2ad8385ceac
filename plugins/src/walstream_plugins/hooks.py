"""Lifecycle hooks with pluggy: the hook specifications, the plugin manager that discovers
extensions in the ``walstream.hooks`` entry-point group, and :class:`PluggyHooks`, the one
forwarder the engine emits its events to (it implements
:class:`walstream.engine.events.EngineHooks`).

An engine event is a dataclass of :mod:`walstream.engine.events`; its hook is
``walstream_<event.name>`` and the hook's arguments are the event's fields (a test checks that
the specifications below and the event dataclasses agree).

Rules kept here:

1. Hook extensions are optional: one that fails to import or register is logged and skipped.
2. An exception raised by one hook implementation is logged and swallowed; the other
   implementations of the same hook still run, and the engine never sees the exception.
3. Names listed in ``disabled`` (a deployment's ``hooks.disable``) are neither imported nor
   registered later.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import fields
from typing import Any

import pluggy
from stevedore.named import NamedExtensionManager
from walstream.engine.events import EngineEvent

__all__ = [
    "HOOKS_GROUP",
    "HOOK_PREFIX",
    "PROJECT_NAME",
    "PluggyHooks",
    "WalstreamHookSpecs",
    "hookimpl",
    "hookspec",
    "installed_hook_names",
    "make_plugin_manager",
]

log = logging.getLogger(__name__)

PROJECT_NAME = "walstream"
HOOKS_GROUP = "walstream.hooks"
#: The hook of an engine event is ``HOOK_PREFIX + event.name``.
HOOK_PREFIX = "walstream_"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


class WalstreamHookSpecs:
    """What a hook extension may implement (any subset, any subset of the arguments)."""

    @hookspec
    def walstream_wal_appended(
        self, node_id: int, stream_id: int, records: int, size_bytes: int, latency_s: float
    ) -> None:
        """A batch became durable in the WAL and was acknowledged after ``latency_s``."""

    @hookspec
    def walstream_object_uploaded(
        self, node_id: int, object_id: int, key: str, size_bytes: int, kind: str
    ) -> None:
        """An object was written to the object store (not yet committed); ``kind`` is
        ``stream`` or ``stream_set``."""

    @hookspec
    def walstream_object_committed(
        self, node_id: int, object_ids: Sequence[int], size_bytes: int, wal_offset: int
    ) -> None:
        """Objects were committed to metadata and the WAL trimmed up to ``wal_offset``."""

    @hookspec
    def walstream_recovered(
        self, node_id: int, records: int, batches: int, dropped_batches: int, failover: bool
    ) -> None:
        """Restart or failover recovery finished."""

    @hookspec
    def walstream_compacted(
        self, source_object_ids: Sequence[int], new_object_ids: Sequence[int], size_bytes: int
    ) -> None:
        """Compaction replaced ``source_object_ids`` with ``new_object_ids``."""

    @hookspec
    def walstream_read_served(
        self, stream_id: int, records: int, size_bytes: int, source: str
    ) -> None:
        """A read returned records; ``source`` is ``log_cache``, ``block_cache`` or
        ``object``."""


def installed_hook_names() -> list[str]:
    """Names of the installed ``walstream.hooks`` extensions (nothing is imported)."""
    listing = NamedExtensionManager(
        HOOKS_GROUP, names=[], on_missing_entrypoints_callback=None
    ).list_entry_points()
    return sorted({entry_point.name for entry_point in listing})


def make_plugin_manager(
    load_entrypoints: bool = True, disabled: Iterable[str] = ()
) -> pluggy.PluginManager:
    """A plugin manager with walstream's hook specifications and, unless
    ``load_entrypoints`` is false, every extension of the ``walstream.hooks`` group that is not
    ``disabled``."""
    manager = pluggy.PluginManager(PROJECT_NAME)
    manager.add_hookspecs(WalstreamHookSpecs)
    disabled_names = set(disabled)
    for name in disabled_names:
        manager.set_blocked(name)
    if not load_entrypoints:
        return manager

    def skip_broken(_manager: Any, entry_point: Any, error: BaseException) -> None:
        log.warning(
            "hook extension %r (%s) could not be loaded and is skipped: %s: %s",
            entry_point.name,
            entry_point.value,
            type(error).__name__,
            error,
        )

    wanted = sorted(set(installed_hook_names()) - disabled_names)
    extensions = NamedExtensionManager(
        HOOKS_GROUP,
        names=wanted,
        on_load_failure_callback=skip_broken,
        on_missing_entrypoints_callback=None,
    )
    for extension in extensions:
        if manager.has_plugin(extension.name):
            continue
        try:
            manager.register(extension.plugin, name=extension.name)
        except Exception as error:
            log.warning(
                "hook extension %r could not be registered and is skipped: %s: %s",
                extension.name,
                type(error).__name__,
                error,
            )
    return manager


class PluggyHooks:
    """The engine's :class:`walstream.engine.events.EngineHooks`, forwarding each event to the
    ``walstream_*`` hook implementations registered in ``plugin_manager``."""

    def __init__(self, plugin_manager: pluggy.PluginManager) -> None:
        self.plugin_manager = plugin_manager
        self.errors = 0
        """How many hook calls raised (each was logged and ignored)."""
        self._reported: set[tuple[str, str]] = set()

    def emit(self, event: EngineEvent) -> None:
        """Call ``walstream_<event.name>`` with the event's fields as its arguments."""
        arguments = {field.name: getattr(event, field.name) for field in fields(event)}
        self._notify(HOOK_PREFIX + event.name, arguments)

    def _notify(self, hook_name: str, arguments: dict[str, Any]) -> None:
        caller = getattr(self.plugin_manager.hook, hook_name, None)
        if caller is None:
            # An event of a newer core that this host has no specification for: nobody can
            # implement its hook yet, and the engine must not see an error for it.
            return
        implementations = caller.get_hookimpls()
        if any(impl.wrapper or impl.hookwrapper for impl in implementations):
            # Wrappers need pluggy's own call loop; isolation is then per call, not per impl.
            try:
                caller(**arguments)
            except Exception:
                self._report(hook_name, "(wrapped call)")
            return
        # pluggy calls the most recently registered implementation first.
        for impl in reversed(implementations):
            try:
                impl.function(*[arguments[name] for name in impl.argnames])
            except Exception:
                self._report(hook_name, impl.plugin_name)

    def _report(self, hook_name: str, plugin_name: str) -> None:
        self.errors += 1
        if (hook_name, plugin_name) in self._reported:
            log.debug("hook %s of %r raised again", hook_name, plugin_name, exc_info=True)
            return
        self._reported.add((hook_name, plugin_name))
        log.warning(
            "hook %s of %r raised; ignored (further errors of it are logged at debug level)",
            hook_name,
            plugin_name,
            exc_info=True,
        )
