"""Commands that describe what is installed and stored: ``plugins``, ``inspect object``,
``inspect metadata``, ``inspect wal``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from walstream.cli.arguments import add_command
from walstream.cli.deployments import backend, plugin_host
from walstream.cli.output import enum_value, human, out, table
from walstream.cli.runner import EXIT_CORRUPT, EXIT_OK, print_error
from walstream.errors import ConfigError, CorruptionError, InvalidArgument, NotFound

__all__ = [
    "add_commands",
    "cmd_inspect_metadata",
    "cmd_inspect_object",
    "cmd_inspect_wal",
    "cmd_plugins",
]


def cmd_plugins(args: argparse.Namespace) -> int:
    backends = sorted(
        plugin_host().installed_backends(),
        key=lambda entry: (_kind_order(entry.kind), entry.name),
    )
    if args.json:
        for backend in backends:
            out(json.dumps(_backend_dict(backend)))
        return EXIT_OK

    def distribution(backend: Any) -> str:
        return f"{backend.dist} {backend.version or ''}".strip() if backend.dist else "-"

    name_width = max((len(backend.name) for backend in backends), default=0)
    dist_width = max((len(distribution(backend)) for backend in backends), default=0)
    current_kind = None
    for backend in backends:
        if backend.kind != current_kind:
            current_kind = backend.kind
            out(f"{current_kind} (entry-point group walstream.{current_kind}):")
        out(
            f"  {backend.name:<{name_width}}  {distribution(backend):<{dist_width}}  "
            f"{backend.description}"
        )
        for option in backend.options:
            out(f"      {option.describe()}")
        if backend.error:
            out(f"      (cannot be loaded: {backend.error})")
    return EXIT_OK


def _kind_order(kind: str) -> int:
    return {"wal": 0, "object_store": 1, "metadata": 2}.get(kind, 3)


def _backend_dict(backend: Any) -> dict[str, Any]:
    return {
        "kind": backend.kind,
        "name": backend.name,
        "dist": backend.dist,
        "version": backend.version,
        "description": backend.description,
        "options": [
            {
                "name": option.name,
                "kind": option.kind,
                "default": _jsonable(option.default),
                "required": option.required,
                "doc": option.doc,
            }
            for option in backend.options
        ],
        "error": backend.error,
    }


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


async def cmd_inspect_object(args: argparse.Namespace) -> int:
    from walstream.format import object as object_format

    path = Path(args.object)
    if path.is_file():
        data = path.read_bytes()
        source = str(path)
    else:
        async with backend(args.config, "object_store") as objects:
            try:
                data = await objects.get(args.object)
            except (InvalidArgument, NotFound):
                raise NotFound(
                    f"{args.object}: no such file, and no object with that key in the "
                    "configured object store; `walstream inspect metadata` lists every object "
                    "with its KEY (a local store keeps it in the file <object_store.root>/KEY)"
                ) from None
        source = f"key {args.object}"
    description = object_format.describe_object(data)
    out(f"object {source}: {len(data)} bytes")
    for line in _describe_lines(description):
        out(line)
    object_format.verify_object(data)
    out("verified: every block checksum is correct")
    return EXIT_OK


def _describe_lines(description: Any) -> list[str]:
    if isinstance(description, str):
        return description.splitlines()
    if isinstance(description, dict):
        return [f"{key}: {value}" for key, value in description.items()]
    return [str(line) for line in description]


async def cmd_inspect_metadata(args: argparse.Namespace) -> int:
    async with backend(args.config, "metadata") as metadata:
        streams = await metadata.list_streams()
        objects = await metadata.list_objects()
        nodes = await metadata.list_nodes()
        gaps = [gap for info in streams for gap in await metadata.get_data_loss(info.stream_id)]
    out(f"streams ({len(streams)} active):")
    out(
        table(
            [
                (
                    info.stream_id,
                    info.name or "-",
                    info.start_offset,
                    info.committed_end,
                    info.epoch,
                    "-" if info.owner_node_id is None else info.owner_node_id,
                    info.config.describe(),
                    "-" if info.lifecycle_due_ms is None else info.lifecycle_due_ms,
                )
                for info in streams
            ],
            ("ID", "NAME", "START", "COMMITTED_END", "EPOCH", "OWNER", "CONFIG", "DUE_MS"),
        )
    )
    out()
    total_bytes = sum(info.size for info in objects)
    out(f"objects ({len(objects)}, {human(total_bytes, 'B')}):")
    out(
        table(
            [
                (
                    info.object_id,
                    enum_value(info.kind),
                    enum_value(info.state),
                    info.size,
                    " ".join(
                        f"{rng.stream_id}:[{rng.start_offset},{rng.end_offset})"
                        for rng in info.ranges
                    )
                    or "-",
                    info.key,
                )
                for info in objects
            ],
            ("ID", "KIND", "STATE", "SIZE", "RANGES", "KEY"),
        )
    )
    out()
    out(f"nodes ({len(nodes)}):")
    out(
        table(
            [
                (
                    info.node_id,
                    info.node_epoch,
                    enum_value(info.state),
                    info.wal_config.get("type", "-") if info.wal_config else "-",
                )
                for info in nodes
            ],
            ("ID", "EPOCH", "STATE", "WAL"),
        )
    )
    if gaps:
        out()
        out(f"data-loss gaps ({len(gaps)}; reads of them raise DataLossError):")
        out(
            table(
                [(gap.stream_id, gap.start_offset, gap.end_offset, gap.reason) for gap in gaps],
                ("STREAM", "START", "END", "REASON"),
            )
        )
    return EXIT_OK


def cmd_inspect_wal(args: argparse.Namespace) -> int:
    factory = plugin_host().load_factory("wal", args.type)
    if factory.inspect is None:
        raise ConfigError(
            f"the {args.type!r} WAL cannot be inspected from a path (its factory has no inspect)"
        )
    expected: dict[str, Any] = {}
    if args.deployment_id is not None:
        try:
            expected["deployment_id"] = bytes.fromhex(args.deployment_id)
        except ValueError as exc:
            raise InvalidArgument(f"--deployment-id: not hexadecimal: {exc}") from exc
    if args.node_id is not None:
        expected["node_id"] = args.node_id
    try:
        for line in factory.inspect(Path(args.path), **expected):
            out(str(line))
    except CorruptionError as exc:
        # Damage or a foreign identity (IdentityMismatch): a distinct status for scripts.
        print_error(exc, args.verbose)
        return EXIT_CORRUPT
    return EXIT_OK


# -- parser ---------------------------------------------------------------------------------------


def add_commands(commands: Any, common: argparse.ArgumentParser) -> None:
    """Add ``plugins`` and ``inspect`` to ``commands``."""
    # plugins
    plugins = add_command(
        commands,
        "plugins",
        "list installed backends (WAL, object store, metadata) with versions and options",
        cmd_plugins,
        common,
        "example:\n  walstream plugins",
    )
    plugins.add_argument(
        "--json",
        action="store_true",
        help="JSON lines: one JSON object per backend per line (not one JSON array)",
    )

    # inspect
    inspect = commands.add_parser(
        "inspect",
        help="decode and verify objects, metadata and WALs",
        parents=[common],
        description="Decode and verify stored data.",
        epilog="examples:\n"
        "  walstream inspect metadata                  # streams, nodes, objects with their KEY\n"
        "  walstream inspect object KEY                # a KEY from that list\n"
        "  walstream inspect object ./walstream-data/objects/KEY   # the same object's file\n"
        "  walstream inspect wal walstream-data/wal.img",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    inspect_commands = inspect.add_subparsers(dest="inspect_command", metavar="WHAT", required=True)
    inspect_object = add_command(
        inspect_commands,
        "object",
        "decode an object (index, blocks) and verify every checksum; exit 1 on damage",
        cmd_inspect_object,
        common,
        "examples:\n"
        "  walstream inspect metadata      # the KEY column lists every object's key\n"
        "  walstream inspect object KEY    # fetched from the configured object store\n"
        "  walstream inspect object ./walstream-data/objects/KEY   # a local object's file",
    )
    inspect_object.add_argument(
        "object",
        metavar="FILE|KEY",
        help="a local object file, or else a key in the configured object store",
    )
    add_command(
        inspect_commands,
        "metadata",
        "print the streams, objects, nodes and data-loss gaps of the configured metadata store",
        cmd_inspect_metadata,
        common,
        "example:\n  walstream inspect metadata",
    )
    inspect_wal = add_command(
        inspect_commands,
        "wal",
        "decode and verify a WAL medium (e.g. an ebs WAL file); exit 2 on damage or a foreign "
        "identity",
        cmd_inspect_wal,
        common,
        "example:\n  walstream inspect wal ./walstream-data/wal.img --type ebs",
    )
    inspect_wal.add_argument("path", help="the WAL's file, device or folder")
    inspect_wal.add_argument(
        "--type", default="ebs", help="WAL plugin name whose inspector decodes it (default ebs)"
    )
    inspect_wal.add_argument(
        "--deployment-id",
        help="hex deployment id the WAL must belong to (exit 2 if it records another)",
    )
    inspect_wal.add_argument(
        "--node-id", type=int, help="node id the WAL must belong to (exit 2 if it records another)"
    )
