"""Deployments: one YAML file (or mapping) that names a node's backends and tunes its engine.

```yaml
node: {id: 1}
wal: {type: ebs, path: ./walstream-data/wal.img, capacity: 1GiB}
object_store: {type: local, root: ./walstream-data/objects}
metadata: {type: sqlite, path: ./walstream-data/meta.db}
cache: {log_cache_bytes: 256MiB, block_cache_bytes: 128MiB}
upload: {max_bytes: 32MiB, max_interval: 250ms}
compaction: {enabled: true, interval: 30s}
append_timeout: 30s
server: {listen: 127.0.0.1:7400, token: "${WALSTREAM_TOKEN}"}
hooks: {disable: [metrics]}
```

Rules kept here:

1. Every wrong key or value fails at load time with :class:`ConfigError` naming the dotted key
   (``wal.capacity``) and what is accepted, with a did-you-mean for near misses.
2. Relative paths resolve against the folder of the YAML file (the working directory for a
   mapping, unless ``base_dir`` is given).
3. ``${VAR}`` and ``${VAR:-default}`` in string values expand from the environment; ``$${``
   stands for a literal ``${``. A missing variable without default names the key and variable.
4. Loading validates and never touches a medium; :meth:`Deployment.build_backends` creates the
   backend objects (the engine starts them).
"""

from __future__ import annotations

import difflib
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import yaml
from walstream.config import (
    BackendFactory,
    BackendKind,
    BuildContext,
    EngineConfig,
    Option,
    validate_options,
)
from walstream.config.engine import (
    APPEND_TIMEOUT,
    CLUSTER_OPTIONS,
    ENGINE_SECTIONS,
    engine_config_from_sections,
)
from walstream.config.listeners import listener_section_names, load_listener
from walstream.errors import ConfigError, WalstreamError
from walstream.metadata import MetadataStore
from walstream.objects import ObjectStore
from walstream.wal import WriteAheadLog

from .hooks import PluggyHooks, installed_hook_names, make_plugin_manager
from .registry import installed_names, load_factory

__all__ = [
    "EMBEDDED_DEFAULT",
    "TOP_LEVEL_KEYS",
    "Backends",
    "Deployment",
    "DeploymentSource",
    "default_deployment",
    "expand_environment",
    "load_deployment",
]

log = logging.getLogger(__name__)

#: The deployment ``walstream.open(None)`` uses, relative to its data folder. Change the
#: embedded default here and only here.
EMBEDDED_DEFAULT: Mapping[str, Any] = {
    "node": {"id": 1},
    "wal": {"type": "ebs", "path": "wal.img", "capacity": "512MiB"},
    "object_store": {"type": "local", "root": "objects"},
    "metadata": {"type": "sqlite", "path": "meta.db"},
}

BACKEND_KINDS: tuple[BackendKind, ...] = ("wal", "object_store", "metadata")

_SERVER_OPTIONS = (
    Option("listen", "str", "host:port the HTTP service listens on", default="127.0.0.1:7400"),
    Option("token", "str", "bearer token clients must send (use ${ENV} for secrets)"),
    Option(
        "header_timeout",
        "duration",
        "close a connection whose request head is not "
        "complete this long after it opened or after its previous response",
        default=15.0,
        minimum=0.001,
    ),
    Option(
        "body_timeout",
        "duration",
        "answer 408 and close when a request body is not complete this long after its head",
        default=60.0,
        minimum=0.001,
    ),
    Option(
        "max_connections",
        "int",
        "connections open at once; past it the longest-idle keep-alive connection is closed "
        "for the new one, and when none is idle the new one is answered 503",
        default=512,
        minimum=1,
    ),
    Option(
        "max_connections_per_address",
        "int",
        "connections one remote address may hold open; more are answered 503 (requests "
        "signed with the cluster secret are exempt)",
        default=64,
        minimum=1,
    ),
    Option(
        "max_long_polls",
        "int",
        "reads waiting at the tail (wait=, sessions) at once; more get 429",
        default=256,
        minimum=1,
    ),
    Option(
        "max_long_polls_per_address",
        "int",
        "reads waiting at the tail per remote address; more get 429 (node-to-node exempt)",
        default=64,
        minimum=1,
    ),
    Option(
        "send_timeout",
        "duration",
        "abandon an answer the client takes nothing of for this long (stream reset or "
        "connection closed, its work cancelled)",
        default=30.0,
        minimum=0.001,
    ),
    Option(
        "max_connection_output",
        "size",
        "bytes of answers built and not yet taken by the client, per connection (at least "
        "1MiB); a read waits for room before it reads",
        default=4 << 20,
        minimum=1 << 20,
    ),
    Option(
        "max_output",
        "size",
        "bytes of answers built and not yet taken by clients, for the whole server",
        default=64 << 20,
        minimum=1 << 20,
    ),
    Option(
        "max_resets_per_connection",
        "int",
        "HTTP/2 streams reset per 10 s on one connection; more: GOAWAY ENHANCE_YOUR_CALM",
        default=100,
        minimum=1,
    ),
    Option(
        "max_resets_per_address",
        "int",
        "HTTP/2 streams reset per 10 s over all connections of one remote address; more: its "
        "connections are closed and new ones refused until the budget refills",
        default=400,
        minimum=1,
    ),
    Option(
        "max_control_frames",
        "int",
        "HTTP/2 PING, SETTINGS and PRIORITY frames per 10 s on one connection; more: GOAWAY "
        "ENHANCE_YOUR_CALM",
        default=1000,
        minimum=1,
    ),
    Option(
        "tls",
        "any",
        "serve HTTPS: {certificate: PEM path, key: PEM path, client_ca: PEM path (optional: "
        "require client certificates)}; HTTP/1.1 and HTTP/2 by ALPN",
    ),
    Option(
        "http_stack",
        "str",
        "deprecated and ignored (walstream has one HTTP stack since 0.2; granian and hypercorn "
        "were removed): a warning is logged; the key is refused from the next release",
    ),
)
_TLS_OPTIONS = (
    Option("certificate", "path", "PEM certificate chain of the server", required=True),
    Option("key", "path", "PEM private key of the certificate", required=True),
    Option("client_ca", "path", "PEM CA bundle that signs the client certificates (mutual TLS)"),
)
_HOOKS_OPTIONS = (
    Option(
        "disable", "str_list", "hook extensions (walstream.hooks names) not to load", default=()
    ),
)

# The engine's sections come with their schemas from core; the server's and the host's own
# sections are checked here.
_SECTIONS: dict[str, tuple[Option, ...]] = {
    **ENGINE_SECTIONS,
    "server": _SERVER_OPTIONS,
    "hooks": _HOOKS_OPTIONS,
}

TOP_LEVEL_KEYS: tuple[str, ...] = (
    "node",
    "wal",
    "object_store",
    "metadata",
    "cache",
    "upload",
    "compaction",
    "streams",
    "append_timeout",
    "server",
    "hooks",
    "cluster",
)

_SECRET_WORDS = ("token", "secret", "password", "credential", "access_key")


class Backends(NamedTuple):
    wal: WriteAheadLog
    objects: ObjectStore
    metadata: MetadataStore


_BACKEND_TYPES: dict[BackendKind, type] = {
    "wal": WriteAheadLog,
    "object_store": ObjectStore,
    "metadata": MetadataStore,
}


@dataclass(frozen=True)
class Deployment:
    """A validated deployment: engine settings plus the chosen backend factories."""

    source: Path | None
    """The YAML file it came from (None for a mapping or the embedded default)."""
    base_dir: Path
    """Folder relative paths were resolved against."""
    engine_config: EngineConfig
    sections: Mapping[str, Any]
    """Every top-level key after validation: defaults filled in, sizes in bytes, durations in
    seconds, paths absolute. Backend sections keep their ``type``; ``append_timeout`` is a
    number of seconds."""
    factories: Mapping[BackendKind, BackendFactory[Any]] = field(repr=False)

    @property
    def node_id(self) -> int:
        return self.engine_config.node_id

    @property
    def disabled_hooks(self) -> tuple[str, ...]:
        return tuple(self.sections["hooks"]["disable"])

    def build_context(self) -> BuildContext:
        return BuildContext(base_dir=self.base_dir, node_id=self.node_id)

    def build_backends(self) -> Backends:
        """Create the WAL, object store and metadata store (not started)."""
        context = self.build_context()
        built: dict[BackendKind, Any] = {}
        for kind in BACKEND_KINDS:
            factory = self.factories[kind]
            options = {key: value for key, value in self.sections[kind].items() if key != "type"}
            try:
                backend = factory.create(options, context)
            except WalstreamError:
                raise
            except Exception as error:
                raise ConfigError(
                    f"{kind}: {factory.kind} type {factory.name!r} could not be created: "
                    f"{type(error).__name__}: {error}"
                ) from error
            if not isinstance(backend, _BACKEND_TYPES[kind]):
                raise ConfigError(
                    f"{kind}.type: plugin {factory.name!r} built a {type(backend).__name__}, "
                    f"which is not a {_BACKEND_TYPES[kind].__name__}; fix or upgrade the plugin"
                )
            built[kind] = backend
        return Backends(built["wal"], built["object_store"], built["metadata"])

    def make_hooks(self) -> PluggyHooks:
        """Engine hooks with every ``walstream.hooks`` extension except ``hooks.disable``."""
        return PluggyHooks(make_plugin_manager(disabled=self.disabled_hooks))

    def describe(self) -> dict[str, Any]:
        """JSON-friendly view for ``walstream serve`` and status pages; secrets are masked."""
        return {
            "source": str(self.source) if self.source is not None else None,
            "base_dir": str(self.base_dir),
            "sections": {
                name: (
                    {key: _printable(key, value) for key, value in section.items()}
                    if isinstance(section, Mapping)
                    else _printable(name, section)
                )
                for name, section in self.sections.items()
            },
        }


DeploymentSource = str | os.PathLike[str] | Mapping[str, Any] | Deployment | None
"""What :func:`load_deployment` accepts."""


def _printable(key: str, value: Any) -> Any:
    if value is not None and any(word in key.lower() for word in _SECRET_WORDS):
        return "***"
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [_printable("", item) for item in value]
    return value


# -- loading --------------------------------------------------------------------------------


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (a second ``wal:`` would silently win)."""


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.Node) -> dict[Any, Any]:
    if not isinstance(node, yaml.MappingNode):
        raise yaml.constructor.ConstructorError(
            None, None, f"expected a mapping, found {type(node).__name__}", node.start_mark
        )
    loader.flatten_mapping(node)
    result: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in result:
            mark = key_node.start_mark
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", mark)
        result[key] = loader.construct_object(value_node, deep=True)
    return result


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _read_yaml(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"deployment file not found: {path} (give the path of a YAML file, or none to use "
            f"the embedded default in ./walstream-data)"
        ) from None
    except IsADirectoryError:
        raise ConfigError(f"deployment path is a folder, not a YAML file: {path}") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"cannot read deployment file {path}: {error}") from error
    try:
        return yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        problem = error.problem or error.context or "invalid YAML"
        raise ConfigError(f"{where}: YAML syntax error: {problem}") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: YAML syntax error: {error}") from None


_ENV_REFERENCE = re.compile(
    r"\$\$\{"  # escaped: a literal "${"
    r"|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}"  # ${NAME} or ${NAME:-default}
    r"|\$\{"  # anything else starting with "${" is malformed
)


def _expand_string(value: str, key: str, environ: Mapping[str, str]) -> str:
    def substitute(match: re.Match[str]) -> str:
        whole, variable, default = match.group(0), match.group(1), match.group(2)
        if whole == "$${":
            return "${"
        if variable is None:
            raise ConfigError(
                f"{key}: malformed variable reference in {value!r}; write ${{NAME}}, "
                f"${{NAME:-default}}, or $${{ for a literal ${{"
            )
        found = environ.get(variable)
        if found is not None and (found != "" or default is None):
            return found
        if default is not None:
            return default
        raise ConfigError(
            f"{key}: environment variable {variable} is not set (set it, or write "
            f"${{{variable}:-default}} to give a default)"
        )

    return _ENV_REFERENCE.sub(substitute, value)


def expand_environment(value: Any, key: str = "", environ: Mapping[str, str] | None = None) -> Any:
    """``value`` (a YAML document or part of one) with every ``${VAR}`` / ``${VAR:-default}`` in
    its strings expanded from ``environ`` (default: the process environment) and ``$${`` turned
    into a literal ``${``; a missing variable raises ConfigError naming ``key`` and the variable.
    The one expansion rule of every walstream YAML file (deployments, conformance configs)."""
    return _expand(value, key, os.environ if environ is None else environ)


def _expand(value: Any, key: str, environ: Mapping[str, str]) -> Any:
    if isinstance(value, str):
        return _expand_string(value, key, environ)
    if isinstance(value, Mapping):
        return {
            item_key: _expand(item, f"{key}.{item_key}" if key else str(item_key), environ)
            for item_key, item in value.items()
        }
    if isinstance(value, list):
        return [_expand(item, f"{key}[{index}]", environ) for index, item in enumerate(value)]
    return value


def _cluster_section(
    document: Mapping[str, Any], node: Mapping[str, Any], base_dir: Path
) -> dict[str, Any] | None:
    """The validated ``cluster`` section, or None: the node holds no lease.

    Present (even ``cluster: {}``): a lease with these options. ``cluster: false``: no lease.
    Absent: a lease at the defaults when the node advertises an address (``node.advertise``,
    what other nodes forward to, so a node of a multi-node deployment), else none. Without a
    lease a node is never failed over: a multi-node deployment that left the section out would
    keep a dead node's streams unavailable until that node came back.
    """
    if "cluster" not in document:
        if node.get("advertise") is None:
            return None
        log.debug("node.advertise is set and cluster: is absent: the node holds a lease")
        return _validate_section("cluster", {}, CLUSTER_OPTIONS, base_dir)
    cluster = document["cluster"]
    if cluster is False:
        return None
    return _validate_section("cluster", cluster, CLUSTER_OPTIONS, base_dir)


def _did_you_mean(word: str, accepted: list[str]) -> str:
    close = difflib.get_close_matches(word, accepted, n=1)
    return f" Did you mean {close[0]!r}?" if close else ""


def _as_section(value: Any, key: str, example: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{key}: expected a mapping like {example}, got {value!r}")
    for item_key in value:
        if not isinstance(item_key, str):
            raise ConfigError(
                f"{key}: keys must be strings, got {item_key!r} (quote YAML words such as "
                f"'on', 'yes' or 'null' used as keys)"
            )
    return value


def _validate_section(
    name: str, raw: Any, options: tuple[Option, ...], base_dir: Path
) -> dict[str, Any]:
    example = "{" + f"{options[0].name}: ..." + "}"
    section = _as_section(raw, name, example)
    known = {option.name: option for option in options}
    result: dict[str, Any] = {}
    for key, value in section.items():
        if key not in known:
            accepted = ", ".join(known)
            raise ConfigError(
                f"{name}.{key}: unknown key.{_did_you_mean(key, list(known))} "
                f"Accepted keys: {accepted}"
            )
        result[key] = known[key].parse(value, f"{name}.{key}", base_dir)
    for option in options:
        if result.get(option.name) is None:
            result[option.name] = option.default
    return result


def _check_listen(listen: str) -> None:
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(
            f"server.listen: expected host:port such as 127.0.0.1:7400 or [::1]:7400, "
            f"got {listen!r}"
        )


def _check_disabled_hooks(disabled: list[str]) -> None:
    """Disabling an extension that is not installed is harmless (the same file may serve hosts
    with other extensions), so a likely typo is only logged."""
    installed = installed_hook_names()
    for name in disabled:
        if name not in installed:
            log.warning(
                "hooks.disable: no hook extension %r is installed (installed: %s).%s",
                name,
                ", ".join(installed) or "none",
                _did_you_mean(name, installed),
            )


def _validate_backend(
    kind: BackendKind, raw: Any, base_dir: Path
) -> tuple[BackendFactory[Any], dict[str, Any]]:
    if raw is None:
        names = ", ".join(installed_names(kind)) or "(none installed)"
        raise ConfigError(
            f"{kind}: section missing; name a backend with {kind}: {{type: NAME, ...}} "
            f"(installed: {names})"
        )
    if isinstance(raw, str):
        raw = {"type": raw}
    section = _as_section(raw, kind, "{type: memory}")
    backend_type = section.get("type")
    if backend_type is None:
        names = ", ".join(installed_names(kind)) or "(none installed)"
        raise ConfigError(f"{kind}.type: required; installed: {names}")
    factory = load_factory(kind, backend_type)
    options = validate_options(factory, section, base_dir, kind)
    return factory, {"type": factory.name, **options}


def _from_mapping(
    document: Any, *, source: Path | None, base_dir: Path, environ: Mapping[str, str]
) -> Deployment:
    where = f" in {source}" if source is not None else ""
    if document is None:
        raise ConfigError(
            f"empty deployment{where}; expected the sections {', '.join(TOP_LEVEL_KEYS)}"
        )
    if not isinstance(document, Mapping):
        raise ConfigError(
            f"a deployment is a mapping of sections ({', '.join(TOP_LEVEL_KEYS)}); "
            f"got {type(document).__name__}{where}"
        )
    # Extra listeners (walstream.config.listeners) own a top-level key each: `kafka:`.
    listener_keys = listener_section_names()
    accepted_keys = [*TOP_LEVEL_KEYS, *listener_keys]
    for key in document:
        if key not in accepted_keys:
            raise ConfigError(
                f"{key}: unknown top-level key{where}."
                f"{_did_you_mean(str(key), accepted_keys)}"
                f" Accepted keys: {', '.join(accepted_keys)}"
            )
    document = _expand(document, "", environ)

    sections: dict[str, Any] = {}
    for name, options in _SECTIONS.items():
        sections[name] = _validate_section(name, document.get(name), options, base_dir)
    timeout_raw = document.get("append_timeout")
    append_timeout_s = (
        APPEND_TIMEOUT.default
        if timeout_raw is None
        else APPEND_TIMEOUT.parse(timeout_raw, "append_timeout", base_dir)
    )
    sections["append_timeout"] = append_timeout_s
    sections["cluster"] = _cluster_section(document, sections["node"], base_dir)
    _check_listen(sections["server"]["listen"])
    tls = sections["server"].get("tls")
    if tls is not None:
        sections["server"]["tls"] = _validate_section("server.tls", tls, _TLS_OPTIONS, base_dir)
        for option in _TLS_OPTIONS:
            if option.required and sections["server"]["tls"].get(option.name) is None:
                raise ConfigError(f"server.tls.{option.name}: required (a PEM file path)")
    if sections["server"].get("http_stack") is not None:
        log.warning(
            "server.http_stack is deprecated and ignored: walstream serves HTTP with its one "
            "stack (granian and hypercorn were removed); delete the key, it is refused from "
            "the next release"
        )
    _check_disabled_hooks(sections["hooks"]["disable"])
    cache = sections["cache"]
    if cache["readahead_min_bytes"] > cache["readahead_max_bytes"]:
        raise ConfigError(
            f"cache.readahead_min_bytes ({cache['readahead_min_bytes']}) must not exceed "
            f"cache.readahead_max_bytes ({cache['readahead_max_bytes']})"
        )

    factories: dict[BackendKind, BackendFactory[Any]] = {}
    for kind in BACKEND_KINDS:
        factories[kind], sections[kind] = _validate_backend(kind, document.get(kind), base_dir)

    _check_separate_locations(sections)
    engine_config = engine_config_from_sections(sections)
    ordered = {name: sections[name] for name in TOP_LEVEL_KEYS}
    for name in listener_keys:
        if name in document:
            ordered[name] = _validate_listener(name, document[name], base_dir)
    return Deployment(
        source=source,
        base_dir=base_dir,
        engine_config=engine_config,
        sections=ordered,
        factories=factories,
    )


def _validate_listener(name: str, raw: Any, base_dir: Path) -> dict[str, Any]:
    """The section of the extra listener ``name`` (``kafka``), checked against its options; a
    listener that is not installed is a ConfigError saying what to install."""
    listener = load_listener(name)
    section = _validate_section(name, raw, listener.options, base_dir)
    for option in listener.options:
        if option.required and section.get(option.name) is None:
            raise ConfigError(f"{name}.{option.name}: required ({option.doc})")
    listener.check(section)
    return section


def _check_separate_locations(sections: dict[str, Any]) -> None:
    """The WAL's file, the metadata file and the object store's folder must not overlap: a WAL
    file inside the object root (or equal to it) breaks reads long after the writes succeeded."""
    located: list[tuple[str, Path]] = []
    for kind, key in (("wal", "path"), ("metadata", "path"), ("object_store", "root")):
        value = sections.get(kind, {}).get(key)
        if isinstance(value, (str, Path)) and str(value):
            located.append((f"{kind}.{key}", Path(value).resolve()))
    for index, (name, path) in enumerate(located):
        for other_name, other in located[index + 1 :]:
            if path == other or path.is_relative_to(other) or other.is_relative_to(path):
                raise ConfigError(
                    f"{name} ({path}) and {other_name} ({other}) overlap: give the WAL, the "
                    "metadata file and the object store separate locations"
                )


def load_deployment(
    source: DeploymentSource,
    *,
    base_dir: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Deployment:
    """Read and validate a deployment.

    ``source`` is the path of a YAML file, an already parsed mapping, a :class:`Deployment`
    (returned as is) or None (the embedded default, see :func:`default_deployment`).
    ``base_dir`` overrides the folder relative paths resolve against; ``environ`` replaces
    ``os.environ`` for ``${VAR}`` expansion.
    """
    env: Mapping[str, str] = os.environ if environ is None else environ
    if isinstance(source, Deployment):
        return source
    if source is None:
        root = Path(base_dir) if base_dir is not None else Path("walstream-data")
        return default_deployment(root)
    if isinstance(source, Mapping):
        folder = Path(base_dir) if base_dir is not None else Path.cwd()
        return _from_mapping(source, source=None, base_dir=folder.absolute(), environ=env)
    if not isinstance(source, (str, os.PathLike)):
        raise ConfigError(
            f"a deployment is a YAML file path or a mapping, got {type(source).__name__}"
        )
    path = Path(source).expanduser().absolute()
    document = _read_yaml(path)
    folder = Path(base_dir).absolute() if base_dir is not None else path.parent
    return _from_mapping(document, source=path, base_dir=folder, environ=env)


def default_deployment(root: Path = Path("walstream-data")) -> Deployment:
    """The embedded default: node 1, an ``ebs`` WAL file, a ``local`` object store and a
    ``sqlite`` metadata store, all inside ``root`` (relative to the working directory)."""
    return _from_mapping(
        EMBEDDED_DEFAULT,
        source=None,
        base_dir=Path(root).expanduser().absolute(),
        environ={},
    )
