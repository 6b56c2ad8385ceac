"""The metadata contract (docs/architecture/contracts.md): streams, objects and nodes, changed only by transactions."""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from walstream.stream_config import StreamConfig

__all__ = [
    "MAX_CLAIM_STREAMS",
    "MAX_CREATE_STREAMS",
    "MAX_LIST_STREAMS",
    "BasinInfo",
    "DataLossGap",
    "KvEntry",
    "KvValue",
    "MetadataStore",
    "NodeInfo",
    "NodeState",
    "ObjectCommit",
    "ObjectInfo",
    "ObjectKind",
    "ObjectState",
    "StreamInfo",
    "StreamRange",
    "StreamState",
    "page_key",
]

#: The largest page :meth:`MetadataStore.list_streams` returns.
MAX_LIST_STREAMS = 10_000
#: The most streams :meth:`MetadataStore.create_streams` creates in one call.
MAX_CREATE_STREAMS = 10_000
#: The most streams :meth:`MetadataStore.claim_streams` and ``adopt_streams`` claim in one call.
MAX_CLAIM_STREAMS = 10_000


class StreamState(enum.Enum):
    ACTIVE = "active"
    DELETED = "deleted"


class ObjectState(enum.Enum):
    PREPARED = "prepared"
    COMMITTED = "committed"
    MARK_DESTROYED = "mark_destroyed"


class ObjectKind(enum.Enum):
    STREAM = "stream"
    """Holds one stream's contiguous range."""
    STREAM_SET = "stream_set"
    """Holds ranges of several streams."""


class NodeState(enum.Enum):
    RUNNING = "running"
    STOPPED = "stopped"
    """Closed cleanly: its WAL holds nothing uncommitted."""
    FAILING_OVER = "failing_over"
    """Another node is recovering its WAL."""
    FAILED_OVER = "failed_over"
    """Its WAL was recovered by another node; its streams are released."""


@dataclass(frozen=True, slots=True)
class StreamInfo:
    stream_id: int
    name: str | None
    epoch: int
    """Bumped each time a node claims the stream for writing."""
    start_offset: int
    """First readable offset (moved by trim)."""
    committed_end: int
    """End of the data committed to object storage; the node's tail can be ahead of it."""
    state: StreamState
    owner_node_id: int | None
    fencing_token: str | None = None
    created_ms: int = 0
    config: StreamConfig = field(default_factory=StreamConfig)
    """The stream's configuration (invariant 16): retention, timestamping, delete-on-empty,
    storage class, cipher."""
    creation_token: str | None = None
    """What the creator gave to make its create idempotent (S2's ``s2-request-token``, as a
    digest), or None; kept as given."""
    lifecycle_due_ms: int | None = None
    """When the stream's lifecycle work (retention, delete-on-empty) is next due, in Unix
    milliseconds; None: nothing due. Set by :meth:`MetadataStore.set_lifecycle_due`, by a
    reconfigure of those settings (due at once) and by a commit of a stream with retention
    (due no later than its oldest committed record's expiry)."""


def page_key(info: StreamInfo) -> str | int:
    """Where the next page of :meth:`MetadataStore.list_streams` starts when ``info`` ends this
    one: its name, or its id when it has none."""
    return info.stream_id if info.name is None else info.name


@dataclass(frozen=True, slots=True)
class StreamRange:
    """A contiguous range ``[start_offset, end_offset)`` of one stream inside one object."""

    stream_id: int
    start_offset: int
    end_offset: int
    epoch: int = 0
    """Stream epoch of the writer that uploaded it (checked at commit)."""
    min_timestamp_ms: int = 0
    max_timestamp_ms: int = 0


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    object_id: int
    key: str
    kind: ObjectKind
    state: ObjectState
    size: int
    index_size: int
    """Bytes of index block + footer at the object's end: one suffix GET reads both."""
    ranges: tuple[StreamRange, ...] = ()
    committed_ms: int = 0


@dataclass(frozen=True, slots=True)
class ObjectCommit:
    object_id: int
    key: str
    kind: ObjectKind
    size: int
    index_size: int
    ranges: tuple[StreamRange, ...]


@dataclass(frozen=True, slots=True)
class NodeInfo:
    node_id: int
    node_epoch: int
    state: NodeState
    wal_config: dict[str, Any] = field(default_factory=dict)
    updated_ms: int = 0
    address: str | None = None
    """The node's advertised base URL (``node.advertise``), or None: not reachable by others."""
    lease_expires_ms: int = 0
    """When the node's lease ends, on the store's clock (:meth:`MetadataStore.store_time_ms`);
    while FAILING_OVER, when the failover lease of the node replaying it ends (then the failover
    may be claimed again); 0: no lease (it never renewed one, a restart ended it, or the failover
    was begun by hand with :meth:`MetadataStore.begin_failover`)."""

    def live(self, store_now_ms: int) -> bool:
        """Whether the node is *live* at ``store_now_ms`` (a :meth:`MetadataStore.store_time_ms`
        reading): RUNNING and its lease not yet expired."""
        return self.state is NodeState.RUNNING and self.lease_expires_ms > store_now_ms


@dataclass(frozen=True, slots=True)
class DataLossGap:
    """Offsets ``[start_offset, end_offset)`` of a stream recorded as lost by an operator.

    Recorded by ``walstream recover --accept-loss`` when a WAL held damaged, acknowledged records.
    Reads of these offsets raise :class:`~walstream.errors.DataLossError`; they are never reused.
    """

    stream_id: int
    start_offset: int
    end_offset: int
    reason: str
    recorded_ms: int = 0


@dataclass(frozen=True, slots=True)
class BasinInfo:
    """A basin: a named namespace of streams (the S2 API's basins, :mod:`walstream.server.s2`).

    The name follows the basin-name rule (:func:`walstream.metadata.rules.check_basin_name`).
    ``config`` is the basin's configuration as a JSON object, stored and returned as given (the
    service that owns it validates it); the store sets ``created_ms``.
    """

    name: str
    config: dict[str, Any] = field(default_factory=dict)
    created_ms: int = 0


class KvValue(NamedTuple):
    """A key's value and its version (:meth:`MetadataStore.kv_get`)."""

    value: bytes
    version: int
    """Positive; never given twice by the store (see :meth:`MetadataStore.kv_put`)."""


class KvEntry(NamedTuple):
    """One key of a namespace as :meth:`MetadataStore.kv_list` returns it."""

    key: str
    value: bytes
    version: int


class MetadataStore(ABC):
    """Durable catalogue of streams, objects and nodes.

    Invariants (the conformance suite has a test named after each):

    1. **atomic-commit** — :meth:`commit_objects` applies all of its objects and ranges or none.
    2. **continuity** — a committed range of a stream starts exactly at the stream's
       ``committed_end`` (else :class:`PreconditionFailed`), and moves it to the range's end.
    3. **epochs-fence** — a commit whose ``node_epoch`` is not the node's current epoch, or whose
       range epoch is not the stream's current epoch, raises :class:`FencedError`; so does a claim
       or trim with a stale epoch.
    4. **idempotent-commit** — repeating a commit whose objects are already committed with the
       same ranges succeeds and changes nothing.
    5. **prepared-ttl** — prepared object ids that are not committed before their TTL expire:
       :meth:`expired_prepared` lists them (their keys may hold garbage to delete) and a late
       commit of an expired id raises :class:`PreconditionFailed`.
    6. **names-unique** — at most one ACTIVE stream has a given name; ids are never reused.
    7. **trim-monotonic** — ``start_offset`` never moves backwards; objects wholly below it and
       objects of deleted streams become MARK_DESTROYED.
    8. **node-epochs** — :meth:`register_node` returns a node epoch greater than every earlier one
       of that node; a failover bumps it again, fencing the old process.
    9. **compaction-atomic** — :meth:`replace_objects` swaps source objects for their rewrite in
       one transaction, and fails with :class:`PreconditionFailed` if a source changed.
    10. **errors-typed** — failures are :mod:`walstream.errors` types.
    11. **deployment-id** — :meth:`deployment_id` returns the same 16 bytes on every call and
        from every process for the life of the store; it is created once, on first use.
    12. **data-loss-gaps** — :meth:`record_data_loss` moves ``committed_end`` past a lost range
        exactly like a commit (continuity, epochs); :meth:`get_data_loss` returns it afterwards,
        and the offsets are never assigned again.
    13. **basins** — :meth:`create_basin` refuses a taken name (:class:`BasinExists`) and a name
        that breaks the basin-name rule (:class:`InvalidArgument`); :meth:`get_basin`,
        :meth:`list_basins` (by name) and :meth:`delete_basin` see exactly the basins created
        and not deleted, across reopens; :meth:`update_basin_config` replaces a basin's config
        (keeping its name and creation time) and the new config is what is read back.
    14. **leases** — :meth:`renew_lease` with a stale epoch, or of a node that is not RUNNING,
        raises :class:`FencedError`; :meth:`claim_failover` of a live node, of a node holding
        no lease, or of a FAILING_OVER node whose failover lease still runs, returns None; of two
        concurrent claims of one expired lease or failover lease exactly one wins; once claimed,
        the old epoch's renewals (:meth:`renew_lease`, :meth:`renew_failover`) are fenced and
        :meth:`register_node` starts the node again with a newer epoch and no lease.
    15. **kv** — :meth:`kv_put` and :meth:`kv_delete` change a key only when its version is the
        expected one (0: the key must not exist), else raise
        :class:`~walstream.errors.VersionMismatchError` carrying the version found and change
        nothing; of concurrent calls expecting one version exactly one wins; a version is never
        given twice, even to a key deleted and created again; namespaces never see each other's
        keys; :meth:`kv_list` pages a namespace by key in byte order; values survive reopens.
    16. **stream-config** — the config and creation token given to :meth:`create_stream` are
        what every read of the stream returns, across reopens; :meth:`reconfigure_stream`
        changes exactly the fields it names, atomically (of concurrent reconfigures of different
        fields, each lands), and refuses unknown fields and invalid values with
        :class:`InvalidArgument`, changing nothing; no other call changes the config. A
        reconfigure that changes the config, and a commit of a stream with retention, make its
        lifecycle work due (:attr:`StreamInfo.lifecycle_due_ms`), and
        :meth:`due_streams` finds exactly the ACTIVE streams due, oldest due first.
    17. **streams-in-bulk** — :meth:`list_streams` pages joined end to end are the whole listing
        (unnamed streams by id, then names in byte order; a prefix is a prefix, deleted streams
        absent); :meth:`create_streams` creates all of its names or none; :meth:`claim_streams`
        claims exactly the streams :meth:`claim_stream` would, each epoch bumped once, and a stale
        node epoch claims nothing; :meth:`adopt_streams` pages through the streams a node owns,
        claiming each for its new epoch.
    """

    # -- identity -----------------------------------------------------------------------------------

    @abstractmethod
    async def deployment_id(self) -> bytes:
        """This deployment's identity: 16 random bytes created on first use, then fixed.

        Every WAL medium and object file of the deployment carries it, so bytes of another
        deployment sharing a bucket, folder or device are refused instead of served.
        """

    # -- streams ------------------------------------------------------------------------------------

    @abstractmethod
    async def create_stream(
        self,
        name: str | None,
        config: StreamConfig | None = None,
        *,
        creation_token: str | None = None,
    ) -> StreamInfo:
        """Create an ACTIVE stream (``StreamExists`` if the name is taken) with ``config``
        (None: the defaults) and ``creation_token`` kept with it (invariant 16). A config with
        retention or delete-on-empty makes the stream's lifecycle work due at once."""

    @abstractmethod
    async def reconfigure_stream(self, stream_id: int, changes: dict[str, Any]) -> StreamInfo:
        """Apply ``changes`` (:meth:`StreamConfig.with_changes
        <walstream.stream_config.StreamConfig.with_changes>`: field name -> value) to the
        ACTIVE stream's config in one transaction and return the stream (invariant 16):
        :class:`StreamNotFound` if there is none, :class:`InvalidArgument` for an unknown field
        or an invalid value. A change makes its lifecycle work due now (the owner reads the
        new config then)."""

    @abstractmethod
    async def due_streams(
        self, now_ms: int, limit: int = 100, start_after: tuple[int, int] | None = None
    ) -> list[StreamInfo]:
        """ACTIVE streams whose ``lifecycle_due_ms`` is at or before ``now_ms``, by
        ``(lifecycle_due_ms, stream_id)``, after ``start_after`` (such a pair: the last of the
        previous page), at most ``limit`` (1 to 1000): an index range, however many streams
        exist."""

    @abstractmethod
    async def set_lifecycle_due(
        self, stream_id: int, due_ms: int | None, *, if_due_ms: int | None = None
    ) -> bool:
        """Set the stream's ``lifecycle_due_ms`` (None: nothing due) if it is still
        ``if_due_ms`` (what the caller read; a reconfigure or commit since then wins) and the
        stream is ACTIVE; True when it was set."""

    @abstractmethod
    async def get_stream(self, name_or_id: str | int) -> StreamInfo:
        """The ACTIVE stream by name or id (``StreamNotFound`` otherwise)."""

    @abstractmethod
    async def get_streams(self, stream_ids: Sequence[int]) -> dict[int, StreamInfo]:
        """Streams by id, including DELETED ones; unknown ids are absent from the result."""

    @abstractmethod
    async def list_streams(
        self, prefix: str = "", start_after: str | int | None = None, limit: int | None = None
    ) -> list[StreamInfo]:
        """ACTIVE streams whose name starts with ``prefix``, one keyset page at a time.

        The order: streams without a name first, by id (only when ``prefix`` is empty: they
        match no other prefix), then named streams by name in byte order (of UTF-8). A page
        holds at most ``limit`` streams (1 to :data:`MAX_LIST_STREAMS`; None: every one left).
        The next page starts after the last stream of this one: ``start_after`` is its
        :func:`page_key` (its name, or its id when it has none); None starts at the beginning.
        A page is served by an index: its cost follows ``limit``, not the number of streams."""

    @abstractmethod
    async def create_streams(
        self, names: Sequence[str], config: StreamConfig | None = None
    ) -> list[StreamInfo]:
        """Create ACTIVE streams named ``names`` (1 to :data:`MAX_CREATE_STREAMS` distinct
        names), each with ``config`` (as :meth:`create_stream`), in one transaction, in that
        order: all of them, or none (``StreamExists`` naming the first name taken)."""

    @abstractmethod
    async def claim_streams(
        self, stream_ids: Sequence[int], node_id: int, node_epoch: int
    ) -> dict[int, StreamInfo]:
        """:meth:`claim_stream` of each of ``stream_ids`` (at most :data:`MAX_CLAIM_STREAMS`)
        in one transaction. The streams it may claim are claimed and returned by id; those it
        may not (unknown, deleted, owned by a node still running) are left as they were and
        absent from the result (:meth:`claim_stream` says why). A stale ``node_epoch`` raises
        :class:`FencedError` and claims nothing."""

    @abstractmethod
    async def adopt_streams(
        self, node_id: int, node_epoch: int, start_after: int = 0, limit: int = 10_000
    ) -> list[StreamInfo]:
        """Claim as ``node_epoch``, in one transaction, the ACTIVE streams ``node_id`` owns with
        ids above ``start_after``, at most ``limit`` (1 to :data:`MAX_CLAIM_STREAMS`), by id:
        a node restarted after a crash takes back what it wrote in a few transactions instead
        of one per stream. The next page starts after the last id returned."""

    @abstractmethod
    async def delete_stream(self, stream_id: int) -> None:
        """Mark DELETED; its objects' ranges are dropped (objects left empty are destroyed)."""

    @abstractmethod
    async def claim_stream(self, stream_id: int, node_id: int, node_epoch: int) -> StreamInfo:
        """Make ``node_id`` the writer: bump the stream epoch and set the owner.

        Allowed when the stream has no owner, is owned by ``node_id``, or its owner's node
        state is STOPPED or FAILED_OVER; otherwise :class:`FencedError` naming the owner.
        """

    @abstractmethod
    async def release_streams(self, node_id: int, node_epoch: int) -> None:
        """Clear ``owner_node_id`` of every stream owned by ``node_id``."""

    @abstractmethod
    async def release_stream(self, stream_id: int, node_id: int, node_epoch: int) -> StreamInfo:
        """Clear ``owner_node_id`` of one stream owned by ``node_id`` (a stream move: the owner
        committed what it holds for it first). No owner: unchanged. ``node_epoch`` must be
        current and no other node may own it, else :class:`FencedError`."""

    @abstractmethod
    async def trim_stream(self, stream_id: int, epoch: int, new_start: int) -> StreamInfo:
        """Move ``start_offset`` forward (never back); ``epoch`` must be the stream's epoch."""

    @abstractmethod
    async def set_fencing_token(self, stream_id: int, epoch: int, token: str | None) -> None: ...

    # -- objects ------------------------------------------------------------------------------------

    @abstractmethod
    async def prepare_objects(self, count: int, ttl_ms: int) -> list[int]:
        """Reserve ``count`` new, never-reused object ids, expiring after ``ttl_ms``."""

    @abstractmethod
    async def commit_objects(
        self, node_id: int, node_epoch: int, objects: Sequence[ObjectCommit]
    ) -> None:
        """Commit uploaded objects in one transaction (invariants 1–4).

        Ranges of DELETED streams are dropped; an object left with no range is MARK_DESTROYED.
        """

    @abstractmethod
    async def replace_objects(
        self, source_ids: Sequence[int], new_objects: Sequence[ObjectCommit]
    ) -> None:
        """Compaction: mark ``source_ids`` MARK_DESTROYED and commit ``new_objects`` covering the
        same ranges (the new ranges keep their streams' committed data unchanged)."""

    @abstractmethod
    async def get_objects(
        self, stream_id: int, start_offset: int, end_offset: int | None = None, limit: int = 100
    ) -> list[ObjectInfo]:
        """COMMITTED objects holding data of ``stream_id`` in ``[start_offset, end_offset)``,
        ordered by the stream's offsets; each ``ranges`` holds only that stream's range."""

    @abstractmethod
    async def list_objects(
        self, state: ObjectState | None = None, kind: ObjectKind | None = None
    ) -> list[ObjectInfo]:
        """Objects (with all their ranges), by id."""

    @abstractmethod
    async def expired_prepared(self, now_ms: int) -> list[int]:
        """Prepared ids whose TTL has passed; marks them expired (a late commit then fails)."""

    @abstractmethod
    async def forget_objects(self, object_ids: Sequence[int]) -> None:
        """Drop MARK_DESTROYED or expired-prepared objects once their keys are deleted."""

    # -- nodes --------------------------------------------------------------------------------------

    @abstractmethod
    async def register_node(
        self, node_id: int, wal_config: dict[str, Any], address: str | None = None
    ) -> NodeInfo:
        """Start a node: bump its epoch, state RUNNING, remember its WAL config and its
        advertised ``address`` (None: not reachable by other nodes); ``lease_expires_ms`` is 0
        until the first :meth:`renew_lease`. A malformed address is :class:`InvalidArgument`."""

    @abstractmethod
    async def renew_lease(self, node_id: int, node_epoch: int, lease_ms: int) -> NodeInfo:
        """Extend the node's lease to ``store_time_ms() + lease_ms`` (one conditional write).

        ``node_epoch`` must be the node's current epoch and its state RUNNING, else
        :class:`FencedError` (a failover or a newer process replaced it: stop acknowledging and
        restart). ``lease_ms`` must be positive (else :class:`InvalidArgument`). Returns the node
        afterwards. The expiry is computed on the store's clock, so every node compares it
        against the same clock; the caller must measure its own view of the lease from the
        moment it *sent* this call, since the store may have applied it at any point until the
        answer arrived.
        """

    @abstractmethod
    async def claim_failover(
        self, node_id: int, node_epoch: int, by_node_id: int, lease_ms: int
    ) -> NodeInfo | None:
        """Claim the failover of ``node_id`` for ``by_node_id``, in ONE conditional write.

        Claimable when ``node_epoch`` is the node's current epoch and either its state is
        RUNNING and its lease expired, or its state is FAILING_OVER and the failover lease of
        the node that claimed it before expired (that claimer stopped halfway) — in both cases
        ``0 < lease_expires_ms < store_time_ms()``. The claim bumps the epoch (fencing the old
        process and any earlier claimer: their commits under the older epoch fail), sets
        FAILING_OVER and gives the claimer a *failover lease*, ``lease_expires_ms =
        store_time_ms() + lease_ms``, which it extends with :meth:`renew_failover` while it
        replays; it returns the new info. Otherwise it returns None: another node claimed it
        first, it renewed, the failover lease still runs, it holds no lease (a node that never
        took a lease, or one fenced by :meth:`begin_failover`, is never claimed automatically),
        or it is unknown. Of concurrent claims of one expiry exactly one gets the info.
        ``lease_ms`` must be positive (else :class:`InvalidArgument`).
        """

    @abstractmethod
    async def renew_failover(self, node_id: int, node_epoch: int, lease_ms: int) -> NodeInfo:
        """Extend the failover lease of a claimed node to ``store_time_ms() + lease_ms`` (one
        conditional write), as :meth:`renew_lease` does for a running node.

        ``node_epoch`` must be the epoch :meth:`claim_failover` returned, still current, and
        the state FAILING_OVER, else :class:`FencedError` (another node re-claimed the
        failover after this claimer's failover lease expired, or it is finished: stop
        replaying). ``lease_ms`` must be positive (else :class:`InvalidArgument`). Returns the
        node afterwards.
        """

    @abstractmethod
    async def store_time_ms(self) -> int:
        """The store's clock in Unix milliseconds: the clock lease expiries are written and
        compared on. PostgreSQL reads the server's clock, so every node uses one clock; the
        SQLite and memory stores read their :class:`~walstream.clock.Clock`."""

    @abstractmethod
    async def get_node(self, node_id: int) -> NodeInfo | None: ...

    @abstractmethod
    async def list_nodes(self) -> list[NodeInfo]: ...

    @abstractmethod
    async def set_node_state(self, node_id: int, node_epoch: int, state: NodeState) -> None:
        """Change state if ``node_epoch`` is current (else :class:`FencedError`)."""

    @abstractmethod
    async def begin_failover(self, node_id: int) -> NodeInfo:
        """Bump the dead node's epoch (fencing it) and set FAILING_OVER; returns the new info."""

    # -- data loss ----------------------------------------------------------------------------------

    @abstractmethod
    async def record_data_loss(self, node_id: int, node_epoch: int, gap: DataLossGap) -> StreamInfo:
        """Record ``gap`` as lost (invariant 12) and return the stream afterwards.

        Like a commit of the range: ``node_epoch`` must be the node's current epoch and the
        stream must be owned by ``node_id`` (else :class:`FencedError`); ``gap.start_offset``
        must equal the stream's ``committed_end`` (else :class:`PreconditionFailed`), which moves
        to ``gap.end_offset``. Recording a gap already recorded with the same range succeeds and
        changes nothing. The store sets ``recorded_ms``. A DELETED or unknown stream raises
        :class:`StreamNotFound`; an empty or reversed range, :class:`InvalidArgument`.
        """

    @abstractmethod
    async def get_data_loss(
        self, stream_id: int, start_offset: int = 0, end_offset: int | None = None
    ) -> list[DataLossGap]:
        """Recorded gaps of ``stream_id`` overlapping ``[start_offset, end_offset)``, by offset
        (empty for a stream with none, or unknown)."""

    # -- basins -------------------------------------------------------------------------------------

    @abstractmethod
    async def create_basin(self, name: str, config: dict[str, Any] | None = None) -> BasinInfo:
        """Create a basin (invariant 13): :class:`BasinExists` if the name is taken,
        :class:`InvalidArgument` if it breaks the basin-name rule or ``config`` is not a JSON
        object. A deleted basin's name may be created again."""

    @abstractmethod
    async def get_basin(self, name: str) -> BasinInfo:
        """The basin named ``name`` (:class:`BasinNotFound` otherwise)."""

    @abstractmethod
    async def list_basins(
        self, prefix: str = "", start_after: str = "", limit: int = 1000
    ) -> list[BasinInfo]:
        """Basins whose name starts with ``prefix`` and sorts after ``start_after``, by name,
        at most ``limit`` (1 to 1000)."""

    @abstractmethod
    async def update_basin_config(self, name: str, config: dict[str, Any]) -> BasinInfo:
        """Replace the config of basin ``name`` with ``config`` (invariant 13) and return the
        basin: :class:`BasinNotFound` if there is none, :class:`InvalidArgument` if ``config`` is
        not a JSON object. The caller merges partial updates (the S2 API's reconfigure)."""

    @abstractmethod
    async def delete_basin(self, name: str) -> None:
        """Forget the basin (:class:`BasinNotFound` if there is none). Its streams are not
        touched: the caller deletes them first."""

    # -- key/value --------------------------------------------------------------------------------

    @abstractmethod
    async def kv_get(self, namespace: str, key: str) -> KvValue | None:
        """The value of ``key`` in ``namespace`` and its version, or None when it has none.

        A small, durable, versioned value for extensions that keep state of their own in the
        metadata store (a Kafka listener's consumer groups and committed offsets). ``namespace``
        (1 to 256 bytes of UTF-8) keeps one extension's keys apart from another's; ``key`` is 1
        to 1024 bytes of UTF-8; neither may hold NUL (:class:`InvalidArgument` otherwise)."""

    @abstractmethod
    async def kv_put(
        self, namespace: str, key: str, value: bytes, expected_version: int | None
    ) -> int:
        """Set ``key`` to ``value`` (at most 1 MiB) if its version is ``expected_version``, and
        return its new version (invariant 15).

        ``expected_version`` 0: the key must not exist (create); a positive version: the key's
        current version must be that one (compare-and-set); None: no condition (last writer
        wins). Otherwise :class:`~walstream.errors.VersionMismatchError`, whose
        ``actual_version`` is the version found (0: no value), and nothing changes. A version is
        positive and larger than the key's previous one, and the store never gives it again,
        to any key, even after a delete: so a compare-and-set against a version read before any
        later change always fails. Versions are not consecutive; compare them for equality."""

    @abstractmethod
    async def kv_delete(self, namespace: str, key: str, expected_version: int | None) -> None:
        """Remove ``key`` if its version is ``expected_version``, else
        :class:`~walstream.errors.VersionMismatchError` (``actual_version``: the version found,
        0 when it has no value) and nothing changes. ``expected_version`` 0 expects no value,
        so it removes nothing and only checks; None: no condition (a key with no value: nothing
        happens)."""

    @abstractmethod
    async def kv_list(
        self, namespace: str, prefix: str = "", start_after: str = "", limit: int = 1000
    ) -> list[KvEntry]:
        """Keys of ``namespace`` starting with ``prefix`` and sorting after ``start_after``,
        by key in byte order (of UTF-8), at most ``limit`` (1 to 1000), with their values and
        versions. The next page starts after the last key of this one."""

    async def close(self) -> None:
        """Release connections; idempotent."""

    def describe(self) -> dict[str, Any]:
        return {"type": type(self).__name__}
