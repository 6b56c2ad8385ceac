"""Any node serves any stream: which node a stream request goes to.

Placement rule: a stream is written by the node that owns it in metadata. A stream without a
live owner (never written, released by a node that stopped or drained, or failed over) is
claimed by the first node that receives a write for it. A request for a stream owned by another
live node is forwarded to that node's advertised address (``node.advertise``) and its answer is
relayed (:mod:`walstream.server.s2.forwarding`, :mod:`walstream.server.s2.forward`). A read whose
answer lies wholly in committed data is answered here from object storage
(:func:`walstream.server.s2.reads.read_committed_here`);
other reads go to the owner, so that a read sees every acknowledged record and the tail the
writer reports. A stream nobody owns is read here, straight from object storage.

No answer is older than an acknowledged append: a node answers reads and tails of a stream it
writes from its own view only while it holds its lease (:attr:`walstream.Stream.owned_here`);
past its lease it may have been failed over, so the stream's owner is looked up afresh and the
request forwarded there, or refused with 503 ``unavailable`` when there is none to forward to.

A node is *live* when it is RUNNING, advertises an address, and its lease (when it holds one)
has not expired on the metadata store's clock. A forwarded request that reaches a node which
does not own its stream is answered 503 ``unavailable`` with a retry hint, never forwarded again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from walstream.metadata.contract import MetadataStore, NodeInfo, NodeState
from walstream.server.s2.errors import S2Error
from walstream.server.s2.lru import Lru

if TYPE_CHECKING:
    from walstream.engine.client import Client

__all__ = ["Owner", "Router", "advertised", "not_owner_here"]

#: How long a stream's owner, once looked up, is trusted before it is looked up again. A stale
#: owner costs one 503 (the old owner refuses a stream it no longer owns), never a wrong write.
OWNER_CACHE_S = 1.0


@dataclass(frozen=True, slots=True)
class Owner:
    """The other node that owns a stream, and where it is reached: ``address`` None when it is
    not live (lease expired, or being failed over) and nobody may serve the stream until it is
    failed over (its WAL may hold acknowledged records no other node can read yet)."""

    node_id: int
    address: str | None


class Router:
    """Looks up, and briefly remembers, which other live node owns a stream."""

    def __init__(self, client: Client, cache_s: float = OWNER_CACHE_S) -> None:
        self.client = client
        self.cache_s = cache_s
        self._owners: Lru[int, tuple[float, Owner]] = Lru()
        self.forwarded = 0
        """Requests relayed to another node (for tests and metrics)."""
        self.served_committed = 0
        """Reads of streams other nodes write answered here from committed data."""

    def rebind(self, client: Client) -> None:
        """Look owners up through ``client`` from now on (a rejoined node's new epoch); what
        was remembered through the old client is dropped."""
        self.client = client
        self._owners.clear()

    def forget(self, stream_id: int) -> None:
        """Drop what is remembered about ``stream_id``'s owner (it did not answer)."""
        self._owners.pop(stream_id, None)

    async def owner_elsewhere(self, stream_id: int, *, fresh: bool = False) -> Owner | None:
        """The other node that owns ``stream_id``, or None when this node may serve it: it owns
        it, nobody owns it, its owner stopped or was failed over (it released its streams), or
        its owner is RUNNING but advertises no address (reads here see what is committed;
        writes are refused by the claim)."""
        now = self.client.clock.monotonic()
        remembered = self._owners.get(stream_id)
        if remembered is not None and not fresh and remembered[0] > now:
            return remembered[1]
        self._owners.pop(stream_id, None)
        metadata = self.client.metadata
        info = (await metadata.get_streams([stream_id])).get(stream_id)
        owner_id = None if info is None else info.owner_node_id
        if owner_id is None or owner_id == self.client.node_id:
            return None
        node = await metadata.get_node(owner_id)
        if node is None or node.state in (NodeState.STOPPED, NodeState.FAILED_OVER):
            return None
        if node.state is not NodeState.RUNNING or await _lease_expired(metadata, node):
            return Owner(owner_id, None)
        address = advertised(node)
        if address is None:
            return None
        owner = Owner(owner_id, address)
        self._owners[stream_id] = (now + self.cache_s, owner)
        return owner


def advertised(node: NodeInfo) -> str | None:
    """The node's advertised base URL (None when it advertises none)."""
    return node.address or None


async def _lease_expired(metadata: MetadataStore, node: NodeInfo) -> bool:
    """True when the node holds a lease that has expired on the store's clock. A RUNNING node
    with no lease yet (it registered and has not renewed, or runs without heartbeats) counts as
    reachable: if it is gone, forwarding fails fast with 503 and the client retries."""
    if node.lease_expires_ms <= 0:
        return False
    return not node.live(await metadata.store_time_ms())


def not_owner_here(owner: Owner | None, node_id: int, *, forwarded: bool = False) -> S2Error:
    """503 for a stream request this node cannot serve: it was forwarded here on a stale view of
    who owns the stream, or the stream's owner is not live yet not failed over."""
    if forwarded:
        where = "another node" if owner is None else f"node {owner.node_id} at {owner.address}"
        message = (
            f"node {node_id} does not own this stream ({where} does) and does not forward a "
            "forwarded request again; retry, the next attempt is routed afresh"
        )
    else:
        message = (
            f"node {node_id} cannot write this stream: another node owns it and is not "
            "reachable (not live, or not failed over yet); retry shortly"
        )
    return S2Error(503, "unavailable", message)
