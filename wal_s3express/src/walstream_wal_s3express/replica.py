"""One zonal directory bucket as a quorum replica (:class:`walstream.wal.quorum.Replica`).

Layout of one log under ``<prefix><log_id>/`` in the bucket::

    state/<version:020d>                                   control state, JSON (see below)
    successor/<epoch:020d>                                 "a newer epoch claimed over this one"
    chunks/<seq:020d>.<epoch:020d>.<crc32c:08x>.n<node>    one chunk, the bytes of encode_chunk

**Chunks** are written with a conditional create (``If-None-Match: *``): an object is never
overwritten. The key carries the seq, the writer's epoch, its node id and the chunk checksum, so a
listing alone says what a zone holds (S3 listings carry no user metadata, and a directory
bucket's ETag is not a digest). A newer epoch's chunk at the same seq is another key; the
listing reports the newest epoch per seq (a seal that invalidates it invalidates the older ones
too), and trim or seal delete the rest.

**Control state** (claimed epoch, trim point, seals) lives in numbered versions
(``state/<version>``). An update reads the newest version ``v``, refuses it when a newer epoch
has claimed the log (rule 1), and creates ``v + 1`` with a conditional create; when another
writer created it first, the update starts again from the new state. S3 offers no
compare-and-swap on one object, but "create the next number" is one: two updates never both
build on ``v``. Claims, seals and trims are therefore atomic with their epoch check, as on a
chunk server. Old versions are deleted (the newest few are kept).

**Identity.** The control state of a log records whose it is (``deployment_id`` as hex and
``node_id``, written by the first claim that carries an identity; a state without them, as
written by older versions, is still read and gets them at the next identified claim). A claim
with another identity raises :class:`IdentityMismatch` before it writes anything (no successor
marker, no state version): a node pointed at another deployment's prefix never fences that
deployment's writer. Chunks carry the identity in their bytes (chunk format 2).

**Successor markers** (``successor/<epoch>``): an update that raises the claimed epoch from
``E`` first writes ``successor/E``. So "was epoch E superseded here?" is one GET of a known key,
not a listing. The first update of an epoch on a zone (its claim, or the claim a chunk write
makes on a zone that missed it) reads the state afresh and confirms by a listing that its
version is the newest; every later update confirms by reading its epoch's successor marker
(a writer with a very stale view could otherwise create a deleted version number again).

**Fencing a chunk write.** S3 cannot make a PUT conditional on another object, so a chunk
write reads its epoch's successor marker *after* its PUT succeeded and fails with
:class:`FencedError` when it exists. A recovery claims first (marker, then state) and lists
chunks afterwards, so on every zone either the claim came first (the old writer's check sees
the marker: no acknowledgement from that zone) or the chunk came first (the recovery's listing
sees it). A recovery's claim zones and any write quorum intersect, so no chunk of the old
writer is acknowledged after the claim completed without the recovery seeing it. Concurrent
checks share one read. (This assumes a zone keeps its objects: a zone that lost its storage
and came back empty has no marker until the writer's catch-up reaches it.)

**Fence lease** (:class:`walstream.wal.fencing.FenceLease`). A check that found no successor
marker covers, for ``fence_lease_s`` from its *start*, the chunk PUTs of its epoch on that zone
that complete meanwhile: they count towards the quorum without another read (a background check
renews the lease while chunks keep completing). The control state records the lease of its
claimed epoch's writer (``fence_lease_ms``: the longest lease any writer of the log recorded
there, since a claimant that crashed while waiting leaves the older writer's lease running); a
claim over an older epoch, once its successor marker and state are in place, waits out that
lease (:func:`walstream.wal.fencing.lease_wait_s`: times a margin for the clocks' rates) before
it lists the zone. A check that missed the marker started before the marker existed, so a chunk
it covers completed before the claim's listing: the argument above holds with "checked after
the PUT" replaced by "covered by a check's lease". Lease 0: a read after every chunk.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from aiobotocore.config import AioConfig
from walstream.clock import Clock, SystemClock
from walstream.errors import (
    AmbiguousError,
    BackendUnavailable,
    CorruptionError,
    FencedError,
    NotFound,
    PreconditionFailed,
    WalstreamError,
)
from walstream.wal.fencing import FenceLease, checked_lease_s, lease_wait_s
from walstream.wal.quorum import (
    MAX_SEALS,
    ChunkInfo,
    LogIdentity,
    LogListing,
    Seal,
    chunk_crc,
    identity_mismatch,
)
from walstream_wal_s3.client import S3Client, S3Settings

__all__ = ["ZonalBucketReplica", "ZonalS3Client", "chunk_key", "parse_chunk_key"]

log = logging.getLogger(__name__)

#: Control-state versions kept besides the newest (older ones are deleted after an update).
KEPT_STATE_VERSIONS = 3
#: A trim deletes the chunks this client knows of; every so many trims it lists the zone.
SWEEP_EVERY_TRIMS = 64
_DELETE_BATCH = 1000
DEFAULT_FENCE_LEASE_S = 0.5
"""How long a successor check that found none covers chunk writes of its epoch on its zone."""
_MAX_FENCE_LEASE_S = 60.0


class ZonalS3Client(S3Client):
    """:class:`S3Client` for directory buckets. S3-compatible endpoints (moto, test servers)
    implement no ``CreateSession``, so with an ``endpoint_url`` requests are signed with plain
    SigV4 instead of S3 Express session credentials."""

    def _config(self) -> AioConfig:
        config = super()._config()
        if self.settings.endpoint_url:
            s3_options = dict(config.s3 or {})
            s3_options["disable_s3_express_session_auth"] = True
            config = config.merge(AioConfig(s3=s3_options))
        return config


def chunk_key(root: str, seq: int, epoch: int, crc: int, node_id: int) -> str:
    return f"{root}chunks/{seq:020d}.{epoch:020d}.{crc:08x}.n{node_id}"


@dataclass(frozen=True, order=True)
class _StoredChunk:
    seq: int
    epoch: int
    crc: int
    size: int
    key: str = field(compare=False)


def parse_chunk_key(key: str, size: int) -> _StoredChunk | None:
    """The chunk a key names, or ``None`` for a key that is not a chunk of this layout."""
    name = key.rsplit("/", 1)[-1]
    parts = name.split(".")
    if len(parts) != 4 or not parts[3].startswith("n"):
        return None
    try:
        return _StoredChunk(int(parts[0]), int(parts[1]), int(parts[2], 16), size, key)
    except ValueError:
        return None


@dataclass(frozen=True)
class _ControlState:
    version: int = 0
    claimed_epoch: int = 0
    trim_seq: int = 0
    trim_offset: int = -1
    seals: tuple[Seal, ...] = ()
    identity: LogIdentity | None = None
    fence_lease_ms: int = 0
    """The fence lease of the claimed epoch's writer on this zone (absent in older states: 0)."""

    def encode(self) -> bytes:
        raw: dict[str, Any] = {
            "claimed_epoch": self.claimed_epoch,
            "trim_seq": self.trim_seq,
            "trim_offset": self.trim_offset,
            "seals": [[seal.epoch, seal.end_seq] for seal in self.seals],
        }
        if self.identity is not None:
            raw["deployment_id"] = self.identity.deployment_id.hex()
            raw["node_id"] = self.identity.node_id
        if self.fence_lease_ms:
            raw["fence_lease_ms"] = self.fence_lease_ms
        return json.dumps(raw, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, version: int, data: bytes, where: str) -> _ControlState:
        try:
            raw = json.loads(data)
            identity = None
            if "deployment_id" in raw:
                identity = LogIdentity(bytes.fromhex(raw["deployment_id"]), int(raw["node_id"]))
            return cls(
                version=version,
                claimed_epoch=int(raw["claimed_epoch"]),
                trim_seq=int(raw["trim_seq"]),
                trim_offset=int(raw["trim_offset"]),
                seals=tuple(Seal(int(epoch), int(end)) for epoch, end in raw["seals"]),
                identity=identity,
                fence_lease_ms=int(raw.get("fence_lease_ms", 0)),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptionError(f"{where}: unreadable control state ({exc})") from None


@dataclass
class _Scan:
    """One listing of a log: state versions and chunks."""

    versions: list[int]
    chunks: list[_StoredChunk]


@dataclass
class _LogCache:
    state: _ControlState | None = None
    registered_epoch: int = -1
    """The epoch whose claim this client made or confirmed on this zone."""
    fence: FenceLease | None = None
    """The post-write check of ``fence_epoch`` and its lease (one per epoch: a superseded one
    stays so)."""
    fence_epoch: int = -1
    chunk_keys: dict[int, list[_StoredChunk]] = field(default_factory=dict)
    stale_keys: list[str] = field(default_factory=list)
    """Old control states to delete with the next batch of deletes."""
    trims_since_sweep: int = 0


class ZonalBucketReplica:
    """A :class:`walstream.wal.quorum.Replica` stored in one (zonal directory) bucket.

    ``node_id`` goes into the chunk keys this replica writes (for humans reading a bucket).
    Every S3 request is retried by :class:`S3Client` a few times; the quorum WAL bounds each
    call with its request timeout.
    """

    def __init__(
        self,
        client: S3Client,
        *,
        node_id: int = 0,
        name: str | None = None,
        clock: Clock | None = None,
        fence_lease_s: float = DEFAULT_FENCE_LEASE_S,
    ) -> None:
        self.fence_lease_s = checked_lease_s(fence_lease_s, _MAX_FENCE_LEASE_S)
        self.client = client
        self.name = name or client.settings.bucket
        self.node_id = node_id
        self.clock: Clock = clock or SystemClock()
        self._logs: dict[str, _LogCache] = {}
        self._identities: dict[str, LogIdentity] = {}
        """The identity each log was claimed with: every later update checks it too."""
        self._healthy = True
        self._background: set[asyncio.Task[None]] = set()

    @classmethod
    def from_settings(cls, settings: S3Settings, **kwargs: Any) -> ZonalBucketReplica:
        return cls(ZonalS3Client(settings), **kwargs)

    def healthy(self) -> bool:
        return self._healthy

    # -- S3 plumbing --------------------------------------------------------------------------------

    def _root(self, log_id: str) -> str:
        return f"{self.client.settings.prefix}{log_id}/"

    def _cache(self, log_id: str) -> _LogCache:
        return self._logs.setdefault(log_id, _LogCache())

    async def _call(self, operation: str, **params: Any) -> dict[str, Any]:
        try:
            response = await self.client.call(operation, **params)
        except (BackendUnavailable, AmbiguousError):
            self._healthy = False
            raise
        except WalstreamError:
            self._healthy = True
            raise
        self._healthy = True
        return response

    async def _list(self, prefix: str) -> list[tuple[str, int]]:
        keys: list[tuple[str, int]] = []
        token: str | None = None
        while True:
            params: dict[str, Any] = {"Prefix": prefix}
            if token:
                params["ContinuationToken"] = token
            response = await self._call("list_objects_v2", **params)
            keys.extend(
                (item["Key"], int(item.get("Size", 0))) for item in response.get("Contents", [])
            )
            if not response.get("IsTruncated"):
                return keys
            token = response.get("NextContinuationToken")

    async def _get(self, key: str) -> bytes:
        response = await self._call("get_object", Key=key, read_body=True)
        return bytes(response["Body"])

    async def _create(self, key: str, data: bytes) -> bool:
        """Conditional create; False when an object with that key exists already. A create
        whose outcome is unknown (a retried attempt may have made it) reads the key back."""
        try:
            await self._call("put_object", write=True, Key=key, Body=data, IfNoneMatch="*")
            return True
        except PreconditionFailed:
            return False

    async def _delete(self, keys: Iterable[str]) -> None:
        pending = list(keys)
        for start in range(0, len(pending), _DELETE_BATCH):
            batch = pending[start : start + _DELETE_BATCH]
            response = await self._call(
                "delete_objects",
                write=True,
                Delete={"Objects": [{"Key": key} for key in batch], "Quiet": True},
            )
            failed = [
                error
                for error in response.get("Errors", [])
                if error.get("Code") not in {"NoSuchKey", "NotFound"}
            ]
            if failed:
                raise BackendUnavailable(
                    f"zone {self.name}: could not delete {len(failed)} objects "
                    f"(first: {failed[0]}); they are removed at the next trim"
                )

    async def _scan(self, log_id: str, what: str = "") -> _Scan:
        root = self._root(log_id)
        versions: list[int] = []
        chunks: list[_StoredChunk] = []
        for key, size in await self._list(root + what):
            relative = key[len(root) :]
            if relative.startswith("state/"):
                try:
                    versions.append(int(relative[len("state/") :]))
                except ValueError:
                    continue
            elif relative.startswith("chunks/"):
                chunk = parse_chunk_key(key, size)
                if chunk is not None:
                    chunks.append(chunk)
        versions.sort()
        chunks.sort()
        cache = self._cache(log_id)
        if not what or what == "chunks/":
            cache.chunk_keys = {}
            for chunk in chunks:
                cache.chunk_keys.setdefault(chunk.seq, []).append(chunk)
        return _Scan(versions, chunks)

    # -- control state ------------------------------------------------------------------------------

    def _state_key(self, log_id: str, version: int) -> str:
        return f"{self._root(log_id)}state/{version:020d}"

    async def _state_at(self, log_id: str, versions: list[int]) -> _ControlState:
        """The state of the newest of ``versions`` (cached when already read)."""
        cache = self._cache(log_id)
        if not versions:
            return _ControlState()
        newest = versions[-1]
        if cache.state is not None and cache.state.version == newest:
            return cache.state
        key = self._state_key(log_id, newest)
        state = _ControlState.decode(newest, await self._get(key), f"zone {self.name} {key}")
        if cache.state is None or cache.state.version < newest:
            cache.state = state
        return state

    async def _current_state(self, log_id: str) -> _ControlState:
        scan = await self._scan(log_id, "state/")
        try:
            return await self._state_at(log_id, scan.versions)
        except NotFound:
            # Deleted by a concurrent update that made a newer version: read again.
            scan = await self._scan(log_id, "state/")
            return await self._state_at(log_id, scan.versions)

    def _check_epoch(self, state: _ControlState, log_id: str, epoch: int) -> None:
        if epoch < state.claimed_epoch:
            raise FencedError(
                f"zone {self.name}: log {log_id} is owned by epoch {state.claimed_epoch} > "
                f"{epoch}; this writer must stop"
            )

    def _successor_key(self, log_id: str, epoch: int) -> str:
        return f"{self._root(log_id)}successor/{epoch:020d}"

    async def _superseded(self, log_id: str, epoch: int) -> bool:
        """Whether a newer epoch claimed the log over ``epoch`` (one GET)."""
        try:
            await self._get(self._successor_key(log_id, epoch))
        except NotFound:
            return False
        return True

    def _fenced(self, log_id: str, epoch: int) -> FencedError:
        return FencedError(
            f"zone {self.name}: log {log_id} was claimed by an epoch newer than {epoch}; this "
            "writer must stop"
        )

    async def _update(
        self,
        log_id: str,
        epoch: int,
        change: Callable[[_ControlState], _ControlState],
        *,
        register: bool = False,
        confirm: bool = True,
        precheck: Callable[[_ControlState], None] | None = None,
    ) -> _ControlState:
        """Apply ``change`` to the control state as one atomic step guarded by ``epoch``.

        The first update of an epoch on this zone *registers* it: it reads the state afresh,
        and confirms with a listing that its version is the newest. Later updates build on
        the cached state and confirm by reading the epoch's successor marker (written by a
        newer claim before its own update, so it is visible once that update is).
        ``precheck`` runs on every state read before the epoch check (the identity check).
        """
        cache = self._cache(log_id)
        registering = register or cache.registered_epoch != epoch
        state = None if registering else cache.state
        if precheck is None and log_id in self._identities:
            # A seal, trim or catch-up write after the claim: never change another
            # deployment's state, even when its claim landed after ours was checked.
            precheck = self._identity_check(log_id, self._identities[log_id])
        if not registering and not confirm and await self._superseded(log_id, epoch):
            raise self._fenced(log_id, epoch)
        for _ in range(64):
            if state is None:
                state = await self._current_state(log_id)
            if precheck is not None:
                precheck(state)
            self._check_epoch(state, log_id, epoch)
            updated = change(replace(state, claimed_epoch=max(state.claimed_epoch, epoch)))
            if updated.claimed_epoch == epoch:
                # Whoever claims over this epoch waits this lease out (module doc). Never less
                # than the recorded one: a superseded writer's lease may still run while a
                # claim over it has not finished waiting (a crash of the claimant), and the
                # next claim must wait it too.
                own_ms = round(self.fence_lease_s * 1000)
                updated = replace(updated, fence_lease_ms=max(own_ms, state.fence_lease_ms))
            if updated == state and not registering:
                if await self._superseded(log_id, epoch):
                    raise self._fenced(log_id, epoch)
                return state
            if state.claimed_epoch and state.claimed_epoch < epoch:
                # Mark the superseded epoch first: its writer's post-write check reads this.
                await self._call(
                    "put_object",
                    write=True,
                    Key=self._successor_key(log_id, state.claimed_epoch),
                    Body=str(epoch).encode(),
                )
            target = replace(updated, version=state.version + 1)
            data = target.encode()
            key = self._state_key(log_id, target.version)
            created = await self._create(key, data)
            if not created:
                # Someone else made that version, or an earlier attempt of ours did.
                try:
                    created = await self._get(key) == data
                except NotFound:
                    created = False
            if created:
                if registering:
                    scan = await self._scan(log_id, "state/")
                    confirmed = bool(scan.versions) and scan.versions[-1] == target.version
                    stale = scan.versions[: -1 - KEPT_STATE_VERSIONS]
                else:
                    if confirm and await self._superseded(log_id, epoch):
                        raise self._fenced(log_id, epoch)
                    confirmed = True
                    stale = [target.version - 1 - KEPT_STATE_VERSIONS]
                if confirmed:
                    cache.state = target
                    cache.registered_epoch = epoch
                    cache.stale_keys.extend(
                        self._state_key(log_id, version) for version in stale if version > 0
                    )
                    return target
            cache.state = None
            state = None
        raise BackendUnavailable(
            f"zone {self.name}: the control state of log {log_id} kept changing under "
            "concurrent updates; retry"
        )

    def _fence(self, log_id: str, epoch: int) -> FenceLease:
        """The shared post-write check of ``epoch`` on ``log_id`` (one GET per run)."""
        cache = self._cache(log_id)
        if cache.fence is None or cache.fence_epoch != epoch:

            async def check() -> None:
                if await self._superseded(log_id, epoch):
                    raise self._fenced(log_id, epoch)

            cache.fence = FenceLease(check, self.fence_lease_s, self.clock)
            cache.fence_epoch = epoch
        return cache.fence

    # -- the Replica operations ---------------------------------------------------------------------

    def _listing(self, state: _ControlState, chunks: list[_StoredChunk]) -> LogListing:
        newest: dict[int, _StoredChunk] = {}
        for chunk in chunks:
            if chunk.seq <= state.trim_seq:
                continue
            if any(
                seal.invalidates(ChunkInfo(chunk.seq, chunk.epoch, 0, 0)) for seal in state.seals
            ):
                continue
            current = newest.get(chunk.seq)
            if current is None or (chunk.epoch, chunk.crc) > (current.epoch, current.crc):
                newest[chunk.seq] = chunk
        return LogListing(
            claimed_epoch=state.claimed_epoch,
            trim_seq=state.trim_seq,
            trim_offset=state.trim_offset,
            seals=state.seals,
            chunks={
                seq: ChunkInfo(seq, chunk.epoch, chunk.size, chunk.crc)
                for seq, chunk in sorted(newest.items())
            },
            identity=state.identity,
        )

    async def claim(
        self, log_id: str, epoch: int, identity: LogIdentity | None = None
    ) -> LogListing:
        if identity is not None:
            self._identities[log_id] = identity
        check_identity = self._identity_check(log_id, identity)

        superseded_lease_ms = [0]

        def identify(state: _ControlState) -> _ControlState:
            # The lease of the writer this claim supersedes (the state's own until updated).
            superseded_lease_ms[0] = state.fence_lease_ms
            return state if identity is None else replace(state, identity=identity)

        state = await self._update(log_id, epoch, identify, register=True, precheck=check_identity)
        if superseded_lease_ms[0]:
            # That writer's checks that missed our marker cover its chunks for this long.
            await self.clock.sleep(lease_wait_s(superseded_lease_ms[0] / 1000))
        # Listed after the claim is in place and the superseded writer's lease ran out: any
        # chunk an older writer got acknowledged here is in this listing (see the module doc).
        scan = await self._scan(log_id)
        state = await self._state_at(log_id, scan.versions) if scan.versions else state
        self._check_epoch(state, log_id, epoch)
        return self._listing(state, scan.chunks)

    def _identity_check(
        self, log_id: str, identity: LogIdentity | None
    ) -> Callable[[_ControlState], None]:
        def check_identity(state: _ControlState) -> None:
            if identity is not None and state.identity not in (None, identity):
                assert state.identity is not None
                raise identity_mismatch(f"zone {self.name}", log_id, state.identity, identity)

        return check_identity

    async def list_chunks(self, log_id: str) -> LogListing:
        scan = await self._scan(log_id)
        try:
            state = await self._state_at(log_id, scan.versions)
        except NotFound:
            state = await self._current_state(log_id)
        return self._listing(state, scan.chunks)

    async def write_chunk(self, log_id: str, epoch: int, seq: int, data: bytes) -> None:
        cache = self._cache(log_id)
        if cache.registered_epoch != epoch:
            # A zone that missed this epoch's claim (it was down) is claimed first, so that a
            # newer claim leaves a successor marker for this epoch here too.
            await self._update(log_id, epoch, lambda state: state)
        assert cache.state is not None
        self._check_epoch(cache.state, log_id, epoch)
        if seq <= cache.state.trim_seq:
            return
        crc = chunk_crc(data)
        if any(
            chunk.epoch == epoch and chunk.crc != crc for chunk in cache.chunk_keys.get(seq, ())
        ):
            raise PreconditionFailed(
                f"zone {self.name}: chunk {seq} of epoch {epoch} exists with other bytes"
            )
        key = chunk_key(self._root(log_id), seq, epoch, crc, self.node_id)
        if not await self._create(key, data):
            existing = await self._get(key)
            if existing != data:
                raise PreconditionFailed(
                    f"zone {self.name}: chunk {seq} of epoch {epoch} exists with other bytes"
                )
        cache.chunk_keys.setdefault(seq, []).append(_StoredChunk(seq, epoch, crc, len(data), key))
        # Under the fence lease it counts at once; else after a check that started after it.
        await self._fence(log_id, epoch).written()

    async def read_chunk(self, log_id: str, seq: int) -> tuple[int, bytes]:
        for attempt in range(2):
            known = self._cache(log_id).chunk_keys.get(seq)
            if not known or attempt:
                await self._scan(log_id, "chunks/")
                known = self._cache(log_id).chunk_keys.get(seq)
            if not known:
                break
            chunk = max(known)
            try:
                data = await self._get(chunk.key)
            except NotFound:
                continue
            if chunk_crc(data) != chunk.crc:
                raise CorruptionError(
                    f"zone {self.name}: chunk {seq} ({chunk.key}) does not match its checksum"
                )
            return chunk.epoch, data
        raise NotFound(f"zone {self.name}: no chunk {seq} in log {log_id}")

    async def seal(self, log_id: str, epoch: int, end_seq: int) -> None:
        new_seal = Seal(epoch, end_seq)

        def add_seal(state: _ControlState) -> _ControlState:
            if new_seal in state.seals:
                return state
            return replace(state, seals=tuple(sorted([*state.seals, new_seal]))[-MAX_SEALS:])

        state = await self._update(log_id, epoch, add_seal)
        scan = await self._scan(log_id, "chunks/")
        await self._delete(
            chunk.key
            for chunk in scan.chunks
            if any(
                seal.invalidates(ChunkInfo(chunk.seq, chunk.epoch, 0, 0)) for seal in state.seals
            )
        )

    async def trim(self, log_id: str, epoch: int, through_seq: int, trim_offset: int) -> None:
        def move_trim_point(state: _ControlState) -> _ControlState:
            return replace(
                state,
                trim_seq=max(state.trim_seq, through_seq),
                trim_offset=max(state.trim_offset, trim_offset),
            )

        # Checked before the update, not after: a trim is done the moment its state version
        # exists, so it returns right then (a trim from a writer fenced in between only drops
        # records that writer had handed off already). Deleting the chunks follows in the
        # background; listings skip trimmed chunks meanwhile.
        state = await self._update(log_id, epoch, move_trim_point, confirm=False)
        task = asyncio.ensure_future(self._delete_trimmed(log_id, state.trim_seq))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _delete_trimmed(self, log_id: str, trim_seq: int) -> None:
        cache = self._cache(log_id)
        try:
            cache.trims_since_sweep += 1
            if cache.trims_since_sweep >= SWEEP_EVERY_TRIMS or not cache.chunk_keys:
                # Now and then a listing finds chunks this client does not know (written by
                # earlier writers, or left by failed deletes).
                cache.trims_since_sweep = 0
                await self._scan(log_id, "chunks/")
            covered = [seq for seq in cache.chunk_keys if seq <= trim_seq]
            keys = [chunk.key for seq in covered for chunk in cache.chunk_keys[seq]]
            stale, cache.stale_keys = cache.stale_keys, []
            for seq in covered:
                del cache.chunk_keys[seq]
            await self._delete([*keys, *stale])
        except WalstreamError as exc:
            log.debug("zone %s: trimmed chunks stay until the next sweep: %s", self.name, exc)

    async def close(self) -> None:
        if self._background:
            await asyncio.wait(list(self._background), timeout=2.0)
        for task in list(self._background):
            task.cancel()
        for cache in self._logs.values():
            if cache.fence is not None:
                await cache.fence.close()
        await self.client.close()
