"""``walstream streams move NAME --to NODE``: move one stream between running nodes, live.

The command reads the metadata store (without starting a node) for the stream's owner and the
target's advertised address, and asks the owner (or, for a stream nobody writes, the target)
over HTTP to move it: the owner holds the stream's appends, uploads and commits what it
acknowledged, releases the stream, and the target claims it before the held appends are let go
(they answer 503 and the client's retry reaches the new owner). ``/cluster`` routes are internal:
with ``WALSTREAM_CLUSTER_SECRET`` in its environment the command signs the request as the
deployment's node (:mod:`walstream.server.node_auth`); a node with a secret refuses it unsigned.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from walstream.cli.arguments import add_command
from walstream.cli.deployments import backend, load_deployment
from walstream.cli.output import out
from walstream.cli.remote import _token
from walstream.cli.runner import EXIT_OK
from walstream.errors import BackendUnavailable, FencedError, InvalidArgument
from walstream.metadata.contract import NodeInfo, NodeState
from walstream.records import parse_int_text, parse_stream_ref
from walstream.server.node_auth import credentials_from_environment

__all__ = ["add_move_command", "cmd_streams_move"]

MOVE_TIMEOUT_S = 60.0


async def cmd_streams_move(args: argparse.Namespace) -> int:
    ref = parse_stream_ref(args.name)
    to = parse_int_text(args.to, "--to", minimum=1)
    async with backend(args.config, "metadata") as metadata:
        info = await metadata.get_stream(ref)
        nodes = {node.node_id: node for node in await metadata.list_nodes()}
    target = nodes.get(to)
    if not _reachable(target):
        raise InvalidArgument(
            f"--to {to}: not a running node with an advertised address (node.advertise); "
            "`walstream cluster status` lists the nodes"
        )
    assert target is not None and target.address is not None
    owner = nodes.get(info.owner_node_id) if info.owner_node_id is not None else None
    via = owner.address if owner is not None and _reachable(owner) else target.address
    assert via is not None
    deployment = load_deployment(args.config)
    token = _token(deployment)
    target_path = f"/cluster/v1/streams/{info.stream_id}/move?to={to}"
    # An internal route: with a cluster secret the node refuses it unsigned, token or not.
    credentials = credentials_from_environment(os.environ, deployment.node_id)
    signed = {} if credentials is None else credentials.headers("POST", target_path)
    status, body = await _post(f"{via.rstrip('/')}{target_path}", token, signed)
    label = info.name if info.name is not None else f"#{info.stream_id}"
    if status != 200:
        message = body.get("message", body) if isinstance(body, dict) else body
        error = {409: FencedError, 503: BackendUnavailable}.get(status, InvalidArgument)
        raise error(f"moving stream {label!r} to node {to} failed ({status}): {message}")
    source = "no node" if info.owner_node_id is None else f"node {info.owner_node_id}"
    out(f"moved stream {label!r} (id {info.stream_id}) from {source} to node {to}")
    return EXIT_OK


def _reachable(node: NodeInfo | None) -> bool:
    return node is not None and node.state is NodeState.RUNNING and bool(node.address)


async def _post(url: str, token: str | None, extra: dict[str, str]) -> tuple[int, Any]:
    """POST ``url`` (standard library only, in a thread): (status, JSON body or text)."""
    import asyncio
    import urllib.error
    import urllib.request

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    headers.update(extra)
    request = urllib.request.Request(url, data=b"", method="POST", headers=headers)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def send() -> tuple[int, bytes]:
        try:
            with opener.open(request, timeout=MOVE_TIMEOUT_S) as answer:
                return int(answer.status), bytes(answer.read())
        except urllib.error.HTTPError as failed:
            return failed.code, failed.read()
        except (urllib.error.URLError, OSError) as failed:
            raise BackendUnavailable(f"{url} cannot be reached: {failed}") from None

    status, raw = await asyncio.to_thread(send)
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode("utf-8", "replace")


def add_move_command(streams_commands: Any, common: argparse.ArgumentParser) -> None:
    """Add ``streams move`` to the ``streams`` subcommands."""
    move = add_command(
        streams_commands,
        "move",
        "move a stream to another running node, live (no acknowledged record is lost)",
        cmd_streams_move,
        common,
        "example:\n  walstream streams move orders --to 2\n\n"
        "The owner uploads and commits what it acknowledged for the stream, releases it, and\n"
        "node NODE claims it; appends in flight meanwhile answer 503 and are retried by S2\n"
        "clients at the new owner. Both nodes must run `walstream serve` with node.advertise.",
    )
    move.add_argument("name", help="stream name (or #ID)")
    move.add_argument("--to", required=True, metavar="NODE", help="the target node's id")
