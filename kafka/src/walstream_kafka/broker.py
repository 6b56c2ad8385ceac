"""One node's Kafka broker: the state every connection of the listener shares.

- **Brokers** are the live nodes. A node's Kafka address (``kafka.advertise``) is registered in
  the key/value namespace ``kafka.brokers`` when its listener starts; Metadata lists the live
  nodes that registered one (this node always).
- **Leaders.** A partition's leader is the node that owns its stream when that node is live. A
  partition nobody owns (never written, or its owner stopped or was failed over) is led by a
  live node chosen by the stream id (every node names the same one), which claims the stream at
  its first produce. A Produce or Fetch that reaches a node that does not lead the partition is
  answered ``NOT_LEADER_OR_FOLLOWER``: Kafka clients then refresh their Metadata and go to the
  leader, which is how Kafka itself moves clients (the S2 API forwards instead).
- **Topics** are the streams named by :mod:`walstream_kafka.mapping`: there is no separate
  topic catalogue to keep in step with the streams.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from walstream.engine.client import Client, Stream
from walstream.errors import StreamNotFound
from walstream.metadata.contract import NodeState, StreamInfo
from walstream.stream_config import StreamConfig

from walstream_kafka.kv import KeyValueStore, VersionConflict, open_kv
from walstream_kafka.mapping import STREAM_PREFIX, parse_stream_name, stream_name

__all__ = ["BrokerAddress", "KafkaBroker", "Partition"]

log = logging.getLogger(__name__)

BROKERS_NAMESPACE = "kafka.brokers"
#: How long the live-node view is trusted before it is read again.
NODES_CACHE_S = 1.0
#: How long a partition's stream handle (and owner) is trusted.
OWNER_CACHE_S = 1.0


@dataclass(frozen=True, slots=True)
class BrokerAddress:
    node_id: int
    host: str
    port: int


@dataclass(slots=True)
class Partition:
    """A topic partition this node knows of."""

    topic: str
    index: int
    stream: Stream


@dataclass
class _NodesView:
    at: float = -1.0
    brokers: dict[int, BrokerAddress] = field(default_factory=dict)
    live: list[int] = field(default_factory=list)


class KafkaBroker:
    """What the listener's connections share (see the module docstring)."""

    def __init__(
        self,
        client: Client,
        kv: KeyValueStore,
        *,
        advertise: BrokerAddress,
        default_partitions: int,
        auto_create_topics: bool,
        token: str | None,
    ) -> None:
        self.client = client
        self.kv = kv
        self.advertise = advertise
        self.default_partitions = default_partitions
        self.auto_create_topics = auto_create_topics
        self.token = token
        self.shutting_down = asyncio.Event()
        self._streams: dict[str, Stream] = {}
        self._nodes = _NodesView()
        self.cluster_id = ""
        self.producer_tables: dict[int, Any] = {}
        """Per stream id: its idempotent producers' sequences (:mod:`.producer_ids`)."""

    @property
    def node_id(self) -> int:
        return self.client.node_id

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        deployment_id = self.client.deployment_id
        self.cluster_id = str(uuid.UUID(bytes=bytes(deployment_id[:16]).ljust(16, b"\0")))
        await self.register()

    async def register(self) -> None:
        """Record this node's Kafka address in ``kafka.brokers`` (kept across epochs)."""
        key = str(self.node_id)
        value = json.dumps({"host": self.advertise.host, "port": self.advertise.port}).encode()
        for _ in range(10):
            current = await self.kv.kv_get(BROKERS_NAMESPACE, key)
            if current is not None and current[0] == value:
                return
            try:
                await self.kv.kv_put(
                    BROKERS_NAMESPACE, key, value, 0 if current is None else current[1]
                )
                return
            except VersionConflict:
                continue

    def rebind(self, client: Client) -> None:
        """Serve ``client`` (the node rejoined with a new epoch): its metadata store's
        key/value table (the previous client's store is closed), and no state of the previous
        epoch: another node may have led its partitions and coordinated its groups meanwhile."""
        self.client = client
        self.kv = open_kv(client.metadata)
        self._streams.clear()
        self._nodes = _NodesView()
        self.producer_tables.clear()
        coordinator = getattr(self, "coordinator", None)
        if coordinator is not None:
            coordinator.forget_all()

    # -- nodes -----------------------------------------------------------------------------------

    async def _registered_brokers(self) -> list[tuple[str, bytes]]:
        """Every ``kafka.brokers`` entry, page by page (``kv_list`` returns 1,000 at most)."""
        found: list[tuple[str, bytes]] = []
        after = ""
        while True:
            page = await self.kv.kv_list(BROKERS_NAMESPACE, "", after, 1000)
            found.extend((key, value) for key, value, _ in page)
            if len(page) < 1000:
                return found
            after = page[-1][0]

    async def _view(self) -> _NodesView:
        now = time.monotonic()
        if self._nodes.at + NODES_CACHE_S > now:
            return self._nodes
        view = _NodesView(at=now)
        view.brokers[self.node_id] = self.advertise
        if self.client.cluster is None:
            view.live = [self.node_id]
        else:
            metadata = self.client.metadata
            nodes = await metadata.list_nodes()
            store_now = await metadata.store_time_ms()
            registered = {
                int(key): json.loads(value) for key, value in await self._registered_brokers()
            }
            live = {self.node_id}
            for node in nodes:
                address = registered.get(node.node_id)
                if node.node_id == self.node_id or address is None:
                    continue
                if node.state is NodeState.RUNNING and (
                    node.lease_expires_ms <= 0 or node.live(store_now)
                ):
                    live.add(node.node_id)
                    view.brokers[node.node_id] = BrokerAddress(
                        node.node_id, str(address["host"]), int(address["port"])
                    )
            view.live = sorted(live)
        self._nodes = view
        return view

    async def brokers(self) -> list[BrokerAddress]:
        view = await self._view()
        return [view.brokers[node_id] for node_id in view.live]

    async def leader_of(self, info: StreamInfo) -> int:
        """The node that leads the partition stored in ``info`` (module docstring)."""
        view = await self._view()
        owner = info.owner_node_id
        if owner is not None and owner in view.live:
            return owner
        if owner is not None and owner != self.node_id and self.client.cluster is not None:
            node = await self.client.metadata.get_node(owner)
            if node is not None and node.state is NodeState.RUNNING and node.lease_expires_ms > 0:
                store_now = await self.client.metadata.store_time_ms()
                if node.live(store_now):
                    return owner  # live but without a Kafka address: nobody else may write
        return view.live[info.stream_id % len(view.live)]

    async def leads(self, partition: Partition) -> bool:
        """True when this node leads ``partition`` (it may produce and fetch here)."""
        if self.client.cluster is None or partition.stream.owned_here:
            return True
        info = (await self.client.metadata.get_streams([partition.stream.stream_id])).get(
            partition.stream.stream_id
        )
        if info is None:
            return True  # deleted: the operation itself answers UNKNOWN_TOPIC_OR_PARTITION
        return await self.leader_of(info) == self.node_id

    # -- topics ----------------------------------------------------------------------------------

    async def list_topics(self, prefix_topic: str | None = None) -> dict[str, list[StreamInfo]]:
        """Topics (all, or only ``prefix_topic``) → their partitions' streams by index."""
        prefix = STREAM_PREFIX if prefix_topic is None else stream_name(prefix_topic, 0)[:-1]
        found: dict[str, dict[int, StreamInfo]] = {}
        for info in await self.client.list_streams(prefix):
            parsed = parse_stream_name(info.name)
            if parsed is None:
                continue
            topic, index = parsed
            if prefix_topic is not None and topic != prefix_topic:
                continue
            found.setdefault(topic, {})[index] = info
        # A topic's partitions are 0..n-1: a gap (a crash between two creates) ends the topic.
        topics: dict[str, list[StreamInfo]] = {}
        for topic, partitions in found.items():
            ordered: list[StreamInfo] = []
            while len(ordered) in partitions:
                ordered.append(partitions[len(ordered)])
            if ordered:
                topics[topic] = ordered
        return topics

    async def partition(self, topic: str, index: int) -> Partition | None:
        """The partition ``index`` of ``topic`` (None when the topic has no such partition)."""
        name = stream_name(topic, index)
        stream = self._streams.get(name)
        if stream is None:
            try:
                stream = await self.client.open_stream(name)
            except StreamNotFound:
                return None
            if len(self._streams) > 100_000:
                self._streams.clear()
            self._streams[name] = stream
        return Partition(topic, index, stream)

    def forget(self, topic: str, index: int) -> None:
        self._streams.pop(stream_name(topic, index), None)

    def forget_topic(self, topic: str) -> None:
        prefix = stream_name(topic, 0)[:-1]
        for name in [name for name in self._streams if name.startswith(prefix)]:
            if parse_stream_name(name) is not None and parse_stream_name(name)[0] == topic:  # type: ignore[index]
                del self._streams[name]

    async def create_partitions(
        self, topic: str, start: int, end: int, config: StreamConfig | None = None
    ) -> None:
        """Create the streams of partitions ``start..end-1`` of ``topic``, in order (a crash
        in between leaves a topic of the partitions made so far), with ``config`` (None: the
        deployment's ``streams:`` defaults)."""
        for index in range(start, end):
            await self.client.create_stream(stream_name(topic, index), config=config)

    async def topic_id(self, partitions: list[StreamInfo]) -> uuid.UUID:
        """A topic's id: derived from its partition 0's stream id and the deployment, so every
        node gives the same, and a topic deleted and created again gets a new one."""
        seed = self.client.deployment_id + partitions[0].stream_id.to_bytes(8, "big")
        return uuid.uuid5(uuid.NAMESPACE_OID, seed.hex())

    def describe(self) -> Mapping[str, Any]:
        return {
            "node_id": self.node_id,
            "advertise": f"{self.advertise.host}:{self.advertise.port}",
        }
