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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import fields
from operator import attrgetter
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


class _Plan:
    """How one event type is forwarded, for one set of registered implementations: the hook
    caller, the implementations it was built for, and per implementation the function with a
    getter of its arguments from the event (None: the implementations include a wrapper, which
    needs pluggy's own call loop)."""

    __slots__ = ("caller", "calls", "hook_name", "implementations")

    def __init__(self, hook_name: str, caller: Any, event_type: type[EngineEvent]) -> None:
        self.hook_name = hook_name
        self.caller = caller
        self.implementations: list[Any] = caller.get_hookimpls()
        self.calls: list[tuple[Any, str, Callable[[Any], tuple[Any, ...]]]] | None = None
        if any(impl.wrapper or impl.hookwrapper for impl in self.implementations):
            return
        field_names = {field.name for field in fields(event_type)}
        calls = []
        # pluggy calls the most recently registered implementation first.
        for impl in reversed(self.implementations):
            names = [name for name in impl.argnames if name in field_names]
            if len(names) != len(impl.argnames):
                # An argument the event does not carry: pluggy's own call reports it.
                self.calls = None
                return
            calls.append((impl.function, impl.plugin_name, _arguments_getter(names)))
        self.calls = calls


def _arguments_getter(names: Sequence[str]) -> Callable[[Any], tuple[Any, ...]]:
    if not names:
        return lambda _event: ()
    if len(names) == 1:
        single = attrgetter(names[0])
        return lambda event: (single(event),)
    return attrgetter(*names)


class PluggyHooks:
    """The engine's :class:`walstream.engine.events.EngineHooks`, forwarding each event to the
    ``walstream_*`` hook implementations registered in ``plugin_manager``.

    ``emit`` is on the append path (one ``wal_appended`` per acknowledged batch), so the way an
    event type reaches its implementations is worked out once and kept until the registered
    implementations change (compared on each emit: a plugin may be registered at any time)."""

    def __init__(self, plugin_manager: pluggy.PluginManager) -> None:
        self.plugin_manager = plugin_manager
        self.errors = 0
        """How many hook calls raised (each was logged and ignored)."""
        self._reported: set[tuple[str, str]] = set()
        self._plans: dict[type[EngineEvent], _Plan | None] = {}

    def emit(self, event: EngineEvent) -> None:
        """Call ``walstream_<event.name>`` with the event's fields as its arguments."""
        event_type = type(event)
        plan = self._plans.get(event_type)
        if plan is None or plan.caller.get_hookimpls() != plan.implementations:
            plan = self._plan(event_type)
            if plan is None:
                return
        calls = plan.calls
        if calls is None:
            # Wrappers need pluggy's own call loop; isolation is then per call, not per impl.
            arguments = {field.name: getattr(event, field.name) for field in fields(event)}
            try:
                plan.caller(**arguments)
            except Exception:
                self._report(plan.hook_name, "(wrapped call)")
            return
        for function, plugin_name, arguments_of in calls:
            try:
                function(*arguments_of(event))
            except Exception:
                self._report(plan.hook_name, plugin_name)

    def _plan(self, event_type: type[EngineEvent]) -> _Plan | None:
        hook_name = HOOK_PREFIX + event_type.name
        caller = getattr(self.plugin_manager.hook, hook_name, None)
        if caller is None:
            # An event of a newer core that this host has no specification for: nobody can
            # implement its hook yet, and the engine must not see an error for it.
            self._plans.pop(event_type, None)
            return None
        plan = _Plan(hook_name, caller, event_type)
        self._plans[event_type] = plan
        return plan

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
