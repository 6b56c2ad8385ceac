"""A write-ahead log replicated over N replicas with quorum writes (docs/architecture/wal-plugins.md).

This package holds everything about quorums that does not depend on the medium, so every quorum
WAL (local-disk chunk servers, zonal object-store buckets, ...) shares one protocol. A medium
implements :class:`Replica`; :class:`QuorumWal` builds the WAL on N of them.

Modules: ``chunk`` (the chunk format), ``replica`` (the :class:`Replica` contract and its rules),
``memory`` (the reference replica), ``resolve`` (rule 3, pure), ``fanout`` (one request on many
replicas, timeouts, quorum waits), ``recovery`` (verified resolution and settling, rules 3-4),
``options`` (the options every quorum plugin shares) and ``wal`` (:class:`QuorumWal`). Import the
public names from here.

Vocabulary
----------

- A **chunk** is one group-commit group: the records of concurrent appends packed together
  (:func:`encode_chunk`). Chunks are numbered by a **seq** that starts at 1 and grows by one per
  chunk, with no gaps. The WAL offset of record ``i`` of chunk ``seq`` is
  ``seq * RECORDS_PER_CHUNK + i`` (:func:`chunk_offset`), so offsets strictly increase.
- Every writer owns the log under an **epoch** (the node epoch). A replica remembers the highest
  epoch that *claimed* it and refuses requests of older epochs with :class:`FencedError`.
- A **seal** ``(epoch E, end_seq)`` is recovery's decision: "the chunks written before epoch E
  end at ``end_seq``". It invalidates every chunk of an epoch ``< E`` at a seq ``> end_seq``.

The protocol (N replicas, write quorum W, claim/read quorum ``R = max(N - W + 1, N // 2 + 1)``)
---------------------------------------------------------------------------------------------

1. *Write*: a chunk ``(E, seq)`` is sent to all N replicas in parallel; it is durable once W
   accepted it. Acknowledgements complete in seq order (:class:`GroupCommitWal`). A replica that
   fails or is slow does not hold the acknowledgement up while W others answer; it is marked
   *lagging* and a background catch-up copies what it misses when it answers again.
2. *Claim*: recovery at epoch E claims the log on at least R replicas. A claimed replica refuses
   every later request of an older epoch, so an old writer can reach at most ``N - R < W``
   replicas: it never gets another acknowledgement (fencing).
3. *Resolve*: the claim replies are listings of R replicas. Because ``R + W > N``, every chunk
   that was ever acknowledged appears in at least one of them. Starting after the trim point,
   recovery walks seq = trim+1, trim+2, ... and keeps a seq as long as some listing holds a
   *valid* chunk for it (one that no known seal invalidates); it stops at the first seq nobody
   holds. Acknowledgements are in order, so every acknowledged chunk lies in that prefix; chunks
   after the first hole were never acknowledged and are discarded.
4. *Settle*: before yielding anything, recovery copies every kept chunk that fewer than W of the
   listed replicas hold to the others (tagged with epoch E), then writes the seal
   ``(E, end_seq)`` to at least W replicas. Only then are records returned.
5. The new writer continues at ``end_seq + 1`` with epoch E; a replica replaces a chunk of an
   older epoch at the same seq (the seal already invalidated it).

Why two recoveries never disagree: a recovery returns records only after its kept chunks and its
seal sit on at least W replicas. Any later recovery reads R replicas, ``R + W > N``, so it sees
the seal and at least one copy of each kept chunk; the seal invalidates the chunks the first
recovery discarded (they all have an older epoch and a seq beyond ``end_seq``), so the walk
finds exactly the same chunks up to ``end_seq``. Two recoveries running at once cannot both
settle: each claims a majority, so the older one meets a replica claimed by the newer one and
cannot gather W acceptances for its repairs or its seal; it fails before returning anything.
The content at a (valid) seq is unique: a writer writes each seq once, a repair copies the chosen
content, and a new writer only writes seqs above its own seal.

Records whose append failed may be recovered or not (an ambiguous failure); after a recovery
decided to discard them, their offsets may be reused by the next writer, but acknowledged
offsets never repeat.

Identity (WAL invariant 12)
---------------------------

A WAL bound to a deployment (:meth:`~walstream.wal.WriteAheadLog.bind_deployment`) stamps every
chunk with a :class:`LogIdentity` (deployment id and node id, chunk format 2) and passes it to
``claim``. A replica records the identity of a log with its first identified claim and refuses
a claim with another identity with :class:`IdentityMismatch` *before* changing anything (a
misconfigured node must not fence another deployment's writer); listings report the recorded
identity, so a read-only open checks it too. A chunk whose identity differs from the WAL's is
treated like a damaged copy: it is never yielded nor copied. Chunks of format 1 and logs without
a recorded identity (written before identities existed, or by an unbound WAL) are accepted as
ours; an unbound WAL checks nothing, as before.

Damage versus a torn tail (WAL invariant 11)
--------------------------------------------

Listings say what a replica *claims* to hold; recovery trusts only bytes it read back and
verified (the chunk checksum, the listing's checksum, the identity). For every seq it tries the
listed copies, newest epoch first, until one verifies. A copy that fails is simply not a holder:
rule 4 repairs the chunk from the verified copy, so one bad copy is never a loss.

A seq with *no* verified copy among the replicas read is either a write that was in flight at a
crash (never acknowledged: dropping it is correct) or an acknowledged chunk whose every copy was
damaged (dropping it silently would break invariant 11). Recovery tells them apart by evidence
that the chunk was committed, and only by evidence:

- *Watermarks.* Every chunk of format 2 carries the writer's ``acked_through`` when the chunk
  was formed: the highest seq that it and all before it had reached W replicas. A verified
  chunk with watermark ``c`` proves every seq ``<= c`` was committed. The chunks that can be in
  flight at a crash are exactly those above the watermark of every later chunk (the writer had
  not yet seen them reach W), so this is the uncertain window and nothing outside it.
- *Seals.* A seal ``(E, end_seq)`` was written only after recovery E kept (or reported) every
  seq up to ``end_seq``: those seqs were committed.
- *Quorum listings.* A seq listed by at least W of the replicas read reached W replicas: a
  write that completes on W is committed by the protocol (any later recovery would keep it),
  and a per-replica write is atomic, so it cannot be a torn one.

A seq without a verified copy but with such evidence is **damage**: it becomes a damaged link
of the chain (nothing to repair from), recovery continues after it, and the first record
yielded after the damaged region carries ``damage_before`` naming the chunks, the replicas and
what failed on each. Damage with no valid record after it is reported by a pure damage report
(an empty record whose ``offset`` is the end of the damage). A seq without evidence ends the
chain, as before: it and everything after it lie in the uncertain window, no acknowledgement
can depend on them (acknowledgements complete in seq order) and the seal invalidates them.
The next writer continues after the damaged links, so they keep being reported (the evidence
stays: later chunks' watermarks and the seal) until a trim passes them.

A replica that lost data it once held (a chunk server that found a segment file shorter than
it wrote it) says so in its listings (``incomplete``) until its log is sealed again. Absence on
such a replica proves nothing. When fewer than ``N - W + 1`` intact replicas were read, an
acknowledged chunk at the end of the log may have lived only on the replicas that lost data, so
the end of the log is itself uncertain *and not because of a crash*: recovery appends a **damage
marker** (a chunk without records that carries the reason, format 0xC3) after its chain and
settles it like a repair. The marker is reported as damage (a pure damage report at the end)
by this and every later recovery, until a trim passes it.

A replica that cannot answer a read is not evidence of anything: when a seq has no verified
copy and some replica failed for a reason other than bad or missing bytes, recovery fails with
:class:`BackendUnavailable` instead of guessing.
"""

from walstream.wal.quorum.chunk import (
    RECORDS_PER_CHUNK,
    Chunk,
    LogIdentity,
    chunk_crc,
    chunk_offset,
    decode_chunk,
    encode_chunk,
    encode_damage_marker,
    offset_seq,
    parse_chunk,
)
from walstream.wal.quorum.memory import MemoryReplica
from walstream.wal.quorum.options import (
    GROUP_DELAY_DOC,
    QuorumOptions,
    quorum_option_set,
    quorum_wal_options,
    write_quorum_of,
)
from walstream.wal.quorum.replica import (
    MAX_SEALS,
    ChunkInfo,
    LogListing,
    Replica,
    Seal,
    identity_mismatch,
)
from walstream.wal.quorum.resolve import ChainLink, Resolution, resolve
from walstream.wal.quorum.wal import QuorumWal

__all__ = [
    "GROUP_DELAY_DOC",
    "MAX_SEALS",
    "RECORDS_PER_CHUNK",
    "ChainLink",
    "Chunk",
    "ChunkInfo",
    "LogIdentity",
    "LogListing",
    "MemoryReplica",
    "QuorumOptions",
    "QuorumWal",
    "Replica",
    "Resolution",
    "Seal",
    "chunk_crc",
    "chunk_offset",
    "decode_chunk",
    "encode_chunk",
    "encode_damage_marker",
    "identity_mismatch",
    "offset_seq",
    "parse_chunk",
    "quorum_option_set",
    "quorum_wal_options",
    "resolve",
    "write_quorum_of",
]
