"""A multi-node walstream cluster on one machine, for tests and benchmarks.

:class:`Cluster` starts a throwaway PostgreSQL (:class:`.server.PostgresServer`, the shared
catalogue), one moto S3 server (:class:`walstream_wal_s3.testing.MotoServer`, the objects and every
node's s3 WAL) and N ``walstream serve`` processes (:class:`ServeNode`), each with its own
deployment YAML in the cluster folder::

    node: {id: i, advertise: http://127.0.0.1:PORT}
    metadata: {type: postgres, dsn: ..., schema: ...}
    object_store: {type: s3, bucket: walstream, prefix: objects/, endpoint_url: <gate>, ...}
    wal: {type: s3, bucket: walstream, prefix: wal/node-i/, endpoint_url: <gate>, ...}
                                         (or ClusterSettings.wal, e.g. nvme-quorum)
    cluster: {lease_duration: ..., heartbeat_interval: ...}
    server: {token: ...}

Contract:

- every node's port is chosen before the first start (its ``node.advertise`` must name it) and
  kept across restarts;
- the nodes reach S3 through a TCP gate (a child process forwarding to moto): moto keeps its
  objects in memory, so restarting moto itself would be S3 losing every object, which no system
  on S3 survives. :meth:`Cluster.restart_s3` kills the gate and starts it again on the same port
  (connections drop, new ones are refused meanwhile, nothing stored is lost);
  :meth:`Cluster.pause_s3` / :meth:`Cluster.resume_s3` SIGSTOP / SIGCONT moto itself (S3 hangs);
- :meth:`Cluster.restart_postgres` is a crash (SIGKILL of the postmaster and every backend) and a
  start on the same port and data folder;
- :meth:`Cluster.kill` is SIGKILL of a node, :meth:`Cluster.pause` / :meth:`Cluster.resume` are
  SIGSTOP / SIGCONT (a zombie owner: it wakes up believing it still owns its streams),
  :meth:`Cluster.restart` starts a node again (its next epoch), :meth:`Cluster.drain` is SIGTERM;
- the ``node.advertise`` and ``cluster:`` keys are written only when the installed walstream has
  node leases (:func:`cluster_features_available`), so the rig runs on an older core too.

Run by hand: ``walstream local-cluster up 3`` (:mod:`.local_cluster`) starts a three-node
cluster in ``./walstream-cluster`` and serves until Ctrl-C; ``walstream local-cluster start 3``
runs it in the background.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from walstream.errors import BackendUnavailable
from walstream_conformance.harness.child import ChildServer, free_port
from walstream_conformance.harness.serve import WalstreamServe, walstream_command
from walstream_wal_s3.testing.moto import TEST_CREDENTIALS, MotoServer

from . import gate
from .server import PostgresServer

__all__ = [
    "BUCKET",
    "Cluster",
    "ClusterSettings",
    "S3Gate",
    "ServeNode",
    "cluster_features_available",
    "free_port",
    "walstream_command",
]

BUCKET = "walstream"


def cluster_features_available() -> bool:
    """True when the installed walstream has node leases (``NodeInfo.lease_expires_ms``) and
    accepts ``node.advertise`` and the ``cluster:`` section, i.e. automatic failover."""
    from walstream.config.host import find_host
    from walstream.errors import ConfigError
    from walstream.metadata import contract

    fields = {field.name for field in dataclasses.fields(contract.NodeInfo)}
    if "lease_expires_ms" not in fields:
        return False
    probe = {
        "node": {"id": 1, "advertise": "http://127.0.0.1:7400"},
        "wal": {"type": "memory", "name": "probe"},
        "object_store": {"type": "memory"},
        "metadata": {"type": "memory"},
        "cluster": {},
    }
    try:
        find_host("the cluster rig checks the deployment keys").load_deployment(probe)
    except ConfigError:
        return False
    return True


class ServeNode(WalstreamServe):
    """One ``walstream serve`` process of the cluster, on a fixed port."""

    def __init__(
        self, node_id: int, port: int, config_path: Path, log_path: Path | None = None
    ) -> None:
        # The AWS credential chain of a node: a node failing over another one opens that node's
        # s3 WAL from the configuration it registered, which carries no secrets.
        super().__init__(
            config_path,
            name=f"walstream node {node_id}",
            port=port,
            environ={
                "AWS_ACCESS_KEY_ID": TEST_CREDENTIALS["access_key_id"],
                "AWS_SECRET_ACCESS_KEY": TEST_CREDENTIALS["secret_access_key"],
            },
            log_path=log_path,
        )
        self.node_id = node_id

    @property
    def frozen(self) -> bool:
        return self._frozen

    def log_tail(self) -> str:
        """The tail of the node's stderr (its log)."""
        return self._read_log()


class S3Gate(ChildServer):
    """A TCP forwarder from a fixed port to the moto server: the S3 endpoint the nodes use
    (:mod:`.gate`)."""

    def __init__(self, upstream_port: int, port: int) -> None:
        super().__init__("s3 gate", port=port)
        self.upstream_port = upstream_port

    def command(self) -> list[str]:
        return [sys.executable, "-m", gate.MODULE, str(self.port), str(self.upstream_port)]


@dataclasses.dataclass
class ClusterSettings:
    """What :class:`Cluster` starts."""

    nodes: int = 3
    token: str = "cluster-token"
    lease_duration: str | None = None
    """``cluster.lease_duration`` (None: walstream's default)."""
    heartbeat_interval: str | None = None
    """``cluster.heartbeat_interval`` (None: walstream's default)."""
    cluster_keys: bool | None = None
    """Write ``node.advertise`` and ``cluster:`` (None: when the installed walstream has them)."""
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Sections merged into every deployment (e.g. ``upload``)."""
    wal: dict[str, Any] | None = None
    """The ``wal`` section of every node, e.g. ``{type: nvme-quorum, servers: [...]}`` (a WAL
    every node can reach, keyed by node id); None: an s3 WAL of its own per node
    (``wal/node-<id>/`` on the cluster's S3)."""
    node_logs: bool = False
    """Keep each node's stderr (its log) in ``<folder>/node-<id>.log`` (default: a temporary
    file, readable through :meth:`Cluster.node_logs`)."""


class Cluster:
    """PostgreSQL, moto and N ``walstream serve`` processes (see the module docstring)."""

    def __init__(self, settings: ClusterSettings | None = None, folder: Path | None = None) -> None:
        self.settings = settings or ClusterSettings()
        self._own_folder = folder is None
        self.folder = (
            Path(tempfile.mkdtemp(prefix="walstream-cluster-")) if folder is None else folder
        )
        self.postgres = PostgresServer()
        self.moto = MotoServer()
        self.gate: S3Gate | None = None
        self.nodes: dict[int, ServeNode] = {}
        self.cluster_keys = (
            cluster_features_available()
            if self.settings.cluster_keys is None
            else self.settings.cluster_keys
        )

    # -- addresses --------------------------------------------------------------------------------

    def url(self, node_id: int) -> str:
        return f"http://127.0.0.1:{self.nodes[node_id].port}"

    @property
    def urls(self) -> dict[int, str]:
        return {node_id: self.url(node_id) for node_id in self.nodes}

    @property
    def s3_endpoint(self) -> str:
        if self.gate is None:
            raise RuntimeError("cluster not started")
        return f"http://127.0.0.1:{self.gate.port}"

    def s3_options(self, prefix: str) -> dict[str, Any]:
        return {
            "bucket": BUCKET,
            "prefix": prefix,
            "endpoint_url": self.s3_endpoint,
            "region": "us-east-1",
            **TEST_CREDENTIALS,
        }

    def deployment(self, node_id: int, port: int) -> dict[str, Any]:
        """The deployment of node ``node_id`` listening on ``port``."""
        node: dict[str, Any] = {"id": node_id}
        document: dict[str, Any] = {
            "node": node,
            "metadata": {"type": "postgres", "dsn": self.postgres.dsn, "schema": "walstream"},
            "object_store": {"type": "s3", **self.s3_options("objects/")},
            "wal": (
                {"type": "s3", **self.s3_options(f"wal/node-{node_id}/")}
                if self.settings.wal is None
                else dict(self.settings.wal)
            ),
            "server": {"token": self.settings.token},
        }
        if self.cluster_keys:
            node["advertise"] = f"http://127.0.0.1:{port}"
            cluster: dict[str, Any] = {}
            if self.settings.lease_duration is not None:
                cluster["lease_duration"] = self.settings.lease_duration
            if self.settings.heartbeat_interval is not None:
                cluster["heartbeat_interval"] = self.settings.heartbeat_interval
            document["cluster"] = cluster
        for key, value in self.settings.extra.items():
            document[key] = {**document.get(key, {}), **value}
        return document

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self) -> None:
        """Start PostgreSQL, moto (with the bucket), the S3 gate and every node; wait for health."""
        self.postgres.start()
        self.moto.start()
        self.moto.create_bucket(BUCKET)
        self.gate = S3Gate(self.moto.port, free_port())
        self.gate.start()
        for node_id in range(1, self.settings.nodes + 1):
            port = free_port()
            path = self.folder / f"node-{node_id}.yaml"
            # The file is exactly what a user would write.
            path.write_text(yaml.safe_dump(self.deployment(node_id, port), sort_keys=False))
            log_path = self.folder / f"node-{node_id}.log" if self.settings.node_logs else None
            self.nodes[node_id] = ServeNode(node_id, port, path, log_path)
        for node_id in self.nodes:
            self.start_node(node_id)

    def stop(self) -> None:
        """Stop every node (SIGTERM), the gate, moto and PostgreSQL; delete the folder."""
        try:
            for node in self.nodes.values():
                node.thaw()
                node.stop()
        finally:
            if self.gate is not None:
                self.gate.stop()
            self.moto.stop()
            self.postgres.remove()
            if self._own_folder:
                shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> Cluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- nodes ------------------------------------------------------------------------------------

    def start_node(self, node_id: int, timeout_s: float = 60.0) -> str:
        """Start node ``node_id`` (no-op if running) and wait until ``/health`` answers."""
        node = self.nodes[node_id]
        node.start()
        self.wait_healthy(node_id, timeout_s)
        return self.url(node_id)

    def kill(self, node_id: int) -> None:
        """SIGKILL: the node dies with nothing flushed."""
        self.nodes[node_id].kill()

    def pause(self, node_id: int) -> None:
        """SIGSTOP: the node hangs with its connections open (a zombie once it wakes)."""
        self.nodes[node_id].freeze()

    def resume(self, node_id: int) -> None:
        """SIGCONT after :meth:`pause`."""
        self.nodes[node_id].thaw()

    def drain(self, node_id: int) -> None:
        """SIGTERM: the node drains and exits (SIGKILL after the node's stop timeout)."""
        self.nodes[node_id].stop()

    def restart(self, node_id: int, timeout_s: float = 60.0) -> str:
        """SIGKILL if still running, then start on the same port and wait for health."""
        self.nodes[node_id].kill()
        return self.start_node(node_id, timeout_s)

    def running(self, node_id: int) -> bool:
        return self.nodes[node_id].running

    def health(self, node_id: int, timeout_s: float = 2.0) -> dict[str, Any] | None:
        """The node's ``/health`` document, or None when it does not answer 200."""
        try:
            with urllib.request.urlopen(self.url(node_id) + "/health", timeout=timeout_s) as answer:
                body = answer.read()
        except (OSError, urllib.error.URLError):
            return None
        try:
            document = json.loads(body)
        except ValueError:
            return {"raw": body.decode(errors="replace")}
        return document if isinstance(document, dict) else {"value": document}

    def wait_healthy(self, node_id: int, timeout_s: float = 60.0) -> dict[str, Any]:
        """Wait until node ``node_id`` answers ``/health``; BackendUnavailable with its log if not."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            document = self.health(node_id)
            if document is not None:
                return document
            if not self.nodes[node_id].running:
                break
            time.sleep(0.05)
        raise BackendUnavailable(
            f"walstream node {node_id} not healthy within {timeout_s:g}s: "
            f"{self.nodes[node_id].log_tail()}"
        )

    # -- shared services --------------------------------------------------------------------------

    def restart_postgres(self, down_s: float = 0.0) -> None:
        """Crash PostgreSQL (SIGKILL of every process), stay down ``down_s``, start it again."""
        self.postgres.kill()
        if down_s:
            time.sleep(down_s)
        self.postgres.start()

    def restart_s3(self, down_s: float = 0.0) -> None:
        """Kill the S3 endpoint the nodes use, stay down ``down_s``, start it on the same port."""
        if self.gate is None:
            raise RuntimeError("cluster not started")
        self.gate.kill()
        if down_s:
            time.sleep(down_s)
        self.gate.start()

    def pause_s3(self) -> None:
        """SIGSTOP moto: every S3 request hangs until :meth:`resume_s3`."""
        self.moto.freeze()

    def resume_s3(self) -> None:
        self.moto.thaw()

    def node_logs(self) -> dict[int, str]:
        """The stderr tail of every node (for failure messages)."""
        return {node_id: node.log_tail() for node_id, node in self.nodes.items()}


def _main(argv: list[str]) -> int:
    """``python -m walstream_metadata_postgres.testing.cluster up [N]``: the rig's former
    entry, now ``walstream local-cluster up [N] --until-stdin-closes``."""
    from .local_cluster import main

    if argv[:1] != ["up"]:
        print(
            "usage: python -m walstream_metadata_postgres.testing.cluster up [N] "
            "(or: walstream local-cluster --help)",
            file=sys.stderr,
        )
        return 2
    return main([*argv, "--until-stdin-closes"])


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
