"""Consumer groups (Kafka's classic group protocol): FindCoordinator, JoinGroup, SyncGroup,
Heartbeat, LeaveGroup, OffsetCommit, OffsetFetch, ListGroups, DescribeGroups.

**Coordinator.** A group's coordinator is one live node, chosen from the group id (every node
names the same one while the set of live nodes is the same). A group request that reaches
another node is answered ``NOT_COORDINATOR`` and the client asks FindCoordinator again.

**State.** A group lives in the metadata store's key/value table (namespace ``kafka.groups``,
one entry per group, every write a compare-and-set): its protocol type, its committed offsets
(written before OffsetCommit is answered) and its last stable generation: the generation
number, protocol, leader and every member (id, client, timeouts, protocols, assignment),
written before the leader's SyncGroup hands out the assignments and when the group empties.
The coordinator keeps a copy in memory for heartbeats and rebalances in progress. When the
coordinator dies, its successor loads the group from the table the first time a request names
it: the members carry on with the same member ids and generation (their heartbeats and commits
are accepted, no rebalance), each getting a full session timeout from the load to reach the new
coordinator; one that does not is removed as a session timeout and the group rebalances.
OffsetFetch and ListGroups read the table, so committed offsets are found on any node after
any crash.

**Fencing.** A node writes a group's entry only at the version it last read or wrote. A write
that finds another version means another node coordinated the group meanwhile (the live-node
set changed): this node drops its copy and answers ``NOT_COORDINATOR``, and the client asks
FindCoordinator again. A node also drops the copies of groups it no longer coordinates.

**Rebalance.** A JoinGroup (or a member leaving, or a session expiring) moves the group to
PreparingRebalance; it completes when every member has joined again, or when the longest
rebalance timeout passes (members that did not rejoin are removed). The leader's SyncGroup
hands out the assignments and the group is Stable. Heartbeats during a rebalance answer
``REBALANCE_IN_PROGRESS``, which makes the members rejoin. JoinGroup v4+ asks a new member to
rejoin with the member id it is given (``MEMBER_ID_REQUIRED``), as Kafka does.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

from walstream_kafka import codes
from walstream_kafka.broker import KafkaBroker
from walstream_kafka.kv import VersionConflict
from walstream_kafka.wire import DecodedRequest

__all__ = [
    "GROUPS_NAMESPACE",
    "handle_describe_groups",
    "handle_find_coordinator",
    "handle_heartbeat",
    "handle_join_group",
    "handle_leave_group",
    "handle_list_groups",
    "handle_offset_commit",
    "handle_offset_fetch",
    "handle_sync_group",
]

log = logging.getLogger(__name__)

GROUPS_NAMESPACE = "kafka.groups"
_REAP_INTERVAL_S = 0.25
_MAX_GROUP_ID = 255
_COMMIT_ATTEMPTS = 50


@dataclass
class _Member:
    member_id: str
    client_id: str
    client_host: str
    session_timeout_s: float
    rebalance_timeout_s: float
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    instance_id: str | None = None
    assignment: bytes = b""
    last_seen: float = field(default_factory=time.monotonic)
    join: asyncio.Future[dict[str, Any]] | None = None
    sync: asyncio.Future[dict[str, Any]] | None = None


@dataclass
class _Group:
    group_id: str
    state: str = "Empty"
    generation: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str | None = None
    members: dict[str, _Member] = field(default_factory=dict)
    pending: set[str] = field(default_factory=set)
    """Member ids handed out by MEMBER_ID_REQUIRED that have not joined yet."""
    rebalance_deadline: float = 0.0
    next_member: int = 0
    version: int = 0
    """The version of the group's key/value entry this node last read or wrote."""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Held across each read-modify-write of the entry (this node's writes in turn)."""


class Coordinator:
    """The groups this node coordinates (one per broker)."""

    def __init__(self, broker: KafkaBroker) -> None:
        self.broker = broker
        self.groups: dict[str, _Group] = {}
        self._reaper: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[bool]] = set()

    async def group(self, group_id: str) -> _Group:
        """The group in memory, loaded from the key/value table the first time."""
        found = self.groups.get(group_id)
        if found is None:
            stored, version = await _stored(self.broker, group_id)
            found = self.groups.get(group_id)  # another request loaded it meanwhile
            if found is None:
                found = self.groups[group_id] = _restore(group_id, stored, version)
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.ensure_future(self._reap())
        return found

    async def existing(self, group_id: str) -> _Group | None:
        """The group if it has members (loaded from the table when not in memory)."""
        if group_id in self.groups:
            return self.groups[group_id]
        found = await self.group(group_id)
        return found if found.members else None

    def drop(self, group: _Group) -> None:
        """Forget this node's copy of ``group`` (another node coordinates it): waiting joins
        and syncs are answered ``NOT_COORDINATOR``."""
        if self.groups.get(group.group_id) is group:
            del self.groups[group.group_id]
        for member in group.members.values():
            for future in (member.join, member.sync):
                if future is not None and not future.done():
                    future.set_result(
                        {**_join_error(codes.NOT_COORDINATOR, member.member_id), "assignment": b""}
                    )

    def forget_all(self) -> None:
        """Drop every group's copy (the node rejoined: the table is the truth)."""
        for group in list(self.groups.values()):
            self.drop(group)

    async def persist(self, group: _Group) -> bool:
        """Write ``group``'s generation and members at the version this node knows; False
        (and the copy dropped) when another node wrote the entry meanwhile."""
        async with group.lock:
            if self.groups.get(group.group_id) is not group:
                return False
            try:
                stored, version = await _stored(self.broker, group.group_id)
                if version != group.version:
                    raise VersionConflict(f"group {group.group_id!r} moved on to {version}")
                stored["group"] = _snapshot(group)
                if group.protocol_type:
                    stored["protocol_type"] = group.protocol_type
                group.version = await self.broker.kv.kv_put(
                    GROUPS_NAMESPACE, group.group_id, json.dumps(stored).encode(), version
                )
                return True
            except VersionConflict:
                log.info(
                    "kafka: group %r was coordinated by another node meanwhile; this node "
                    "drops its copy",
                    group.group_id,
                )
            except Exception as error:
                log.warning("kafka: storing group %r failed: %s", group.group_id, error)
            self.drop(group)
            return False

    def persist_later(self, group: _Group) -> None:
        """:meth:`persist` in the background (a transition made outside a request)."""
        task = asyncio.ensure_future(self.persist(group))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _reap(self) -> None:
        """Expire members whose session ran out; finish rebalances whose time ran out."""
        while not self.broker.shutting_down.is_set() and self.groups:
            await asyncio.sleep(_REAP_INTERVAL_S)
            now = time.monotonic()
            for group in list(self.groups.values()):
                expired = [
                    member
                    for member in group.members.values()
                    if member.join is None and now - member.last_seen > member.session_timeout_s
                ]
                for member in expired:
                    log.info(
                        "kafka: group %r: member %s left (session timeout)",
                        group.group_id,
                        member.member_id,
                    )
                    self.remove(group, member.member_id)
                if group.state == "PreparingRebalance" and now >= group.rebalance_deadline:
                    self.complete_rebalance(group, force=True)
                if group.state == "Empty" and not group.members and not group.pending:
                    self.groups.pop(group.group_id, None)
                elif await _not_here(self.broker, group.group_id):
                    self.drop(group)

    # -- transitions -----------------------------------------------------------------------------

    def prepare_rebalance(self, group: _Group) -> None:
        if group.state == "CompletingRebalance":
            for member in group.members.values():
                if member.sync is not None and not member.sync.done():
                    member.sync.set_result({"error_code": codes.REBALANCE_IN_PROGRESS})
                member.sync = None
        if group.state != "PreparingRebalance":
            group.state = "PreparingRebalance"
            longest = max(
                (member.rebalance_timeout_s for member in group.members.values()), default=1.0
            )
            group.rebalance_deadline = time.monotonic() + longest

    def remove(self, group: _Group, member_id: str) -> None:
        member = group.members.pop(member_id, None)
        if member is None:
            return
        for future in (member.join, member.sync):
            if future is not None and not future.done():
                future.set_result({"error_code": codes.UNKNOWN_MEMBER_ID})
        if group.members:
            self.prepare_rebalance(group)
            self.complete_rebalance(group)
        else:
            group.state = "Empty"
            group.generation += 1
            group.leader = None
            group.protocol_name = None
            self.persist_later(group)

    def complete_rebalance(self, group: _Group, force: bool = False) -> None:
        """Finish the rebalance when every member has joined (or ``force``: time is up)."""
        if group.state != "PreparingRebalance":
            return
        if not force and any(member.join is None for member in group.members.values()):
            return
        for member_id in [m.member_id for m in group.members.values() if m.join is None]:
            group.members.pop(member_id)
        if not group.members:
            group.state = "Empty"
            group.generation += 1
            self.persist_later(group)
            return
        group.generation += 1
        group.state = "CompletingRebalance"
        members = list(group.members.values())
        group.protocol_name = _common_protocol(members)
        if group.leader not in group.members:
            group.leader = members[0].member_id
        for member in members:
            member.assignment = b""
            answer = {
                "error_code": codes.NONE,
                "generation_id": group.generation,
                "protocol_type": group.protocol_type,
                "protocol_name": group.protocol_name,
                "leader": group.leader,
                "member_id": member.member_id,
                "skip_assignment": False,
                "members": [
                    {
                        "member_id": other.member_id,
                        "group_instance_id": other.instance_id,
                        "metadata": dict(other.protocols).get(group.protocol_name or "", b""),
                    }
                    for other in members
                ]
                if member.member_id == group.leader
                else [],
            }
            assert member.join is not None
            if not member.join.done():
                member.join.set_result(answer)
            member.join = None
            member.last_seen = time.monotonic()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _snapshot(group: _Group) -> dict[str, Any]:
    """What the key/value entry keeps of ``group``'s membership (its ``group`` field)."""
    return {
        "generation": group.generation,
        "protocol_name": group.protocol_name,
        "leader": group.leader,
        "members": [
            {
                "member_id": member.member_id,
                "client_id": member.client_id,
                "client_host": member.client_host,
                "session_timeout_s": member.session_timeout_s,
                "rebalance_timeout_s": member.rebalance_timeout_s,
                "protocol_type": member.protocol_type,
                "protocols": [[name, _b64(metadata)] for name, metadata in member.protocols],
                "instance_id": member.instance_id,
                "assignment": _b64(member.assignment),
            }
            for member in group.members.values()
        ],
    }


def _restore(group_id: str, stored: dict[str, Any], version: int) -> _Group:
    """The group as its key/value entry (at ``version``) left it: Stable with its members,
    each given a full session timeout from now, or Empty."""
    group = _Group(group_id, version=version, protocol_type=stored.get("protocol_type"))
    snapshot = stored.get("group")
    if not snapshot:
        return group
    group.generation = int(snapshot["generation"])
    now = time.monotonic()
    for item in snapshot["members"]:
        member = _Member(
            str(item["member_id"]),
            str(item["client_id"]),
            str(item["client_host"]),
            float(item["session_timeout_s"]),
            float(item["rebalance_timeout_s"]),
            str(item["protocol_type"]),
            [(str(name), base64.b64decode(data)) for name, data in item["protocols"]],
            item.get("instance_id"),
            base64.b64decode(item["assignment"]),
            last_seen=now,
        )
        group.members[member.member_id] = member
    if group.members:
        group.state = "Stable"
        group.protocol_name = snapshot.get("protocol_name")
        group.leader = snapshot.get("leader")
    return group


def _common_protocol(members: list[_Member]) -> str | None:
    names = [name for name, _ in members[0].protocols]
    for name in names:
        if all(name in dict(member.protocols) for member in members):
            return name
    return None


def coordinator_of(broker: KafkaBroker) -> Coordinator:
    found: Coordinator | None = getattr(broker, "coordinator", None)
    if found is None:
        found = Coordinator(broker)
        broker.coordinator = found  # type: ignore[attr-defined]
    return found


async def _coordinator_node(broker: KafkaBroker, group_id: str) -> int:
    live = [address.node_id for address in await broker.brokers()]
    return live[zlib.crc32(group_id.encode()) % len(live)]


async def _not_here(broker: KafkaBroker, group_id: str) -> bool:
    """True when another node coordinates ``group_id`` (this node's copy is then dropped)."""
    if await _coordinator_node(broker, group_id) == broker.node_id:
        return False
    coordinator = coordinator_of(broker)
    stale = coordinator.groups.get(group_id)
    if stale is not None:
        coordinator.drop(stale)
    return True


# -- FindCoordinator ------------------------------------------------------------------------------


async def handle_find_coordinator(session: Any, request: DecodedRequest) -> dict[str, Any]:
    broker: KafkaBroker = session.broker
    body = request.body
    keys = list(body.coordinator_keys) if hasattr(body, "coordinator_keys") else [body.key]
    brokers = {address.node_id: address for address in await broker.brokers()}
    answers = []
    for key in keys:
        if body.key_type != 0:
            answers.append(
                {
                    "key": key,
                    "error_code": codes.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                    "error_message": "transactions are not supported by walstream",
                    "node_id": -1,
                    "host": "",
                    "port": -1,
                }
            )
            continue
        node = brokers[await _coordinator_node(broker, key)]
        answers.append(
            {
                "key": key,
                "error_code": codes.NONE,
                "error_message": None,
                "node_id": node.node_id,
                "host": node.host,
                "port": node.port,
            }
        )
    if hasattr(body, "coordinator_keys"):
        return {"throttle_time": 0, "coordinators": answers}
    first = answers[0]
    return {"throttle_time": 0, **{k: v for k, v in first.items() if k != "key"}}


# -- JoinGroup / SyncGroup / Heartbeat / LeaveGroup ------------------------------------------------


def _join_error(code: int, member_id: str = "") -> dict[str, Any]:
    return {
        "error_code": code,
        "generation_id": -1,
        "protocol_name": None,
        "leader": "",
        "member_id": member_id,
        "members": [],
    }


async def handle_join_group(session: Any, request: DecodedRequest) -> dict[str, Any]:
    broker: KafkaBroker = session.broker
    body = request.body
    group_id = body.group_id
    if not group_id or len(group_id) > _MAX_GROUP_ID:
        return _join_error(codes.INVALID_GROUP_ID)
    if await _not_here(broker, group_id):
        return _join_error(codes.NOT_COORDINATOR)
    session_timeout_s = body.session_timeout.total_seconds()
    if not 1.0 <= session_timeout_s <= 1800.0:
        return _join_error(codes.INVALID_SESSION_TIMEOUT)
    rebalance = getattr(body, "rebalance_timeout", None)
    rebalance_timeout_s = session_timeout_s if rebalance is None else rebalance.total_seconds()
    protocols = [(protocol.name, bytes(protocol.metadata)) for protocol in body.protocols]
    if not protocols or not body.protocol_type:
        return _join_error(codes.INCONSISTENT_GROUP_PROTOCOL)
    coordinator = coordinator_of(broker)
    group = await coordinator.group(group_id)
    if group.members and group.protocol_type != body.protocol_type:
        return _join_error(codes.INCONSISTENT_GROUP_PROTOCOL)
    if group.members and not any(
        all(name in dict(member.protocols) for member in group.members.values())
        for name, _ in protocols
    ):
        return _join_error(codes.INCONSISTENT_GROUP_PROTOCOL)
    member_id = body.member_id
    if not member_id:
        group.next_member += 1
        member_id = f"{request.client_id or 'member'}-{broker.node_id}-{group.next_member}-{time.monotonic_ns() % 10**9}"
        if request.api_version >= 4:
            group.pending.add(member_id)
            return _join_error(codes.MEMBER_ID_REQUIRED, member_id)
    elif member_id not in group.members and member_id not in group.pending:
        return _join_error(codes.UNKNOWN_MEMBER_ID, member_id)
    group.pending.discard(member_id)
    member = group.members.get(member_id)
    if member is None:
        member = _Member(
            member_id,
            request.client_id or "",
            session.peer,
            session_timeout_s,
            rebalance_timeout_s,
            body.protocol_type,
            protocols,
            getattr(body, "group_instance_id", None),
        )
        group.members[member_id] = member
    else:
        member.protocols = protocols
        member.session_timeout_s = session_timeout_s
        member.rebalance_timeout_s = rebalance_timeout_s
    member.last_seen = time.monotonic()
    group.protocol_type = body.protocol_type
    if member.join is not None and not member.join.done():
        member.join.set_result(_join_error(codes.UNKNOWN_MEMBER_ID, member_id))
    join: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
    member.join = join
    coordinator.prepare_rebalance(group)
    # A rebalance waits for every member's rejoin at most its deadline; a new member may
    # extend it to its own rebalance timeout.
    group.rebalance_deadline = max(
        group.rebalance_deadline, time.monotonic() + min(rebalance_timeout_s, 5.0)
    )
    coordinator.complete_rebalance(group)
    shutdown: asyncio.Future[Any] = asyncio.ensure_future(broker.shutting_down.wait())
    try:
        await asyncio.wait([join, shutdown], return_when=asyncio.FIRST_COMPLETED)
    finally:
        shutdown.cancel()
    if not join.done():
        return _join_error(codes.COORDINATOR_NOT_AVAILABLE, member_id)
    return join.result()


async def handle_sync_group(session: Any, request: DecodedRequest) -> dict[str, Any]:
    broker: KafkaBroker = session.broker
    body = request.body
    if await _not_here(broker, body.group_id):
        return {"error_code": codes.NOT_COORDINATOR, "assignment": b""}
    coordinator = coordinator_of(broker)
    group = await coordinator.existing(body.group_id)
    member = None if group is None else group.members.get(body.member_id)
    if group is None or member is None:
        return {"error_code": codes.UNKNOWN_MEMBER_ID, "assignment": b""}
    if body.generation_id != group.generation:
        return {"error_code": codes.ILLEGAL_GENERATION, "assignment": b""}
    member.last_seen = time.monotonic()
    if group.state == "PreparingRebalance":
        return {"error_code": codes.REBALANCE_IN_PROGRESS, "assignment": b""}
    answer_common = {"protocol_type": group.protocol_type, "protocol_name": group.protocol_name}
    if group.state == "Stable":
        return {"error_code": codes.NONE, "assignment": member.assignment, **answer_common}
    member.sync = asyncio.get_running_loop().create_future()
    sync = member.sync
    if body.member_id == group.leader:
        given = {item.member_id: bytes(item.assignment) for item in body.assignments}
        generation = group.generation
        for other in group.members.values():
            other.assignment = given.get(other.member_id, b"")
        # The generation is stored before anyone is told its assignment, so a successor
        # coordinator knows every member this generation hands partitions to.
        stored = await coordinator.persist(group)
        if (
            not stored
            or group.generation != generation
            or group.state != "CompletingRebalance"
            or coordinator.groups.get(group.group_id) is not group
        ):
            # Dropped (the syncs were answered NOT_COORDINATOR), or a join started the next
            # rebalance meanwhile (answered REBALANCE_IN_PROGRESS).
            if not sync.done():
                sync.set_result({"error_code": codes.REBALANCE_IN_PROGRESS, "assignment": b""})
            return sync.result()
        group.state = "Stable"
        for other in group.members.values():
            if other.sync is not None and not other.sync.done():
                other.sync.set_result(
                    {"error_code": codes.NONE, "assignment": other.assignment, **answer_common}
                )
            other.sync = None
            other.last_seen = time.monotonic()
    shutdown: asyncio.Future[Any] = asyncio.ensure_future(broker.shutting_down.wait())
    try:
        await asyncio.wait([sync, shutdown], return_when=asyncio.FIRST_COMPLETED)
    finally:
        shutdown.cancel()
    if not sync.done():
        return {"error_code": codes.COORDINATOR_NOT_AVAILABLE, "assignment": b""}
    return sync.result()


async def handle_heartbeat(session: Any, request: DecodedRequest) -> dict[str, Any]:
    broker: KafkaBroker = session.broker
    body = request.body
    if await _not_here(broker, body.group_id):
        return {"throttle_time": 0, "error_code": codes.NOT_COORDINATOR}
    group = await coordinator_of(broker).existing(body.group_id)
    member = None if group is None else group.members.get(body.member_id)
    if group is None or member is None:
        return {"throttle_time": 0, "error_code": codes.UNKNOWN_MEMBER_ID}
    member.last_seen = time.monotonic()
    if body.generation_id != group.generation:
        code = (
            codes.REBALANCE_IN_PROGRESS
            if group.state == "PreparingRebalance"
            else codes.ILLEGAL_GENERATION
        )
        return {"throttle_time": 0, "error_code": code}
    if group.state == "PreparingRebalance":
        return {"throttle_time": 0, "error_code": codes.REBALANCE_IN_PROGRESS}
    return {"throttle_time": 0, "error_code": codes.NONE}


async def handle_leave_group(session: Any, request: DecodedRequest) -> dict[str, Any]:
    broker: KafkaBroker = session.broker
    body = request.body
    if await _not_here(broker, body.group_id):
        return {"throttle_time": 0, "error_code": codes.NOT_COORDINATOR, "members": []}
    coordinator = coordinator_of(broker)
    group = await coordinator.existing(body.group_id)
    leaving = (
        [(member.member_id, member.group_instance_id) for member in body.members]
        if hasattr(body, "members")
        else [(body.member_id, None)]
    )
    answers = []
    for member_id, instance_id in leaving:
        if group is None or member_id not in group.members:
            answers.append(
                {
                    "member_id": member_id,
                    "group_instance_id": instance_id,
                    "error_code": codes.UNKNOWN_MEMBER_ID,
                }
            )
            continue
        coordinator.remove(group, member_id)
        answers.append(
            {"member_id": member_id, "group_instance_id": instance_id, "error_code": codes.NONE}
        )
    if not hasattr(body, "members") and answers and answers[0]["error_code"] != codes.NONE:
        return {"throttle_time": 0, "error_code": codes.UNKNOWN_MEMBER_ID}
    return {"throttle_time": 0, "error_code": codes.NONE, "members": answers}


# -- offsets ---------------------------------------------------------------------------------------


async def _stored(broker: KafkaBroker, group_id: str) -> tuple[dict[str, Any], int]:
    found = await broker.kv.kv_get(GROUPS_NAMESPACE, group_id)
    if found is None:
        return {"protocol_type": None, "offsets": {}}, 0
    return json.loads(found[0]), found[1]


async def handle_offset_commit(session: Any, request: DecodedRequest) -> dict[str, Any]:
    broker: KafkaBroker = session.broker
    body = request.body

    def answer(code: int) -> dict[str, Any]:
        return {
            "throttle_time": 0,
            "topics": [
                {
                    "name": topic.name,
                    "partitions": [
                        {"partition_index": part.partition_index, "error_code": code}
                        for part in topic.partitions
                    ],
                }
                for topic in body.topics
            ],
        }

    if not body.group_id or len(body.group_id) > _MAX_GROUP_ID:
        return answer(codes.INVALID_GROUP_ID)
    if await _not_here(broker, body.group_id):
        return answer(codes.NOT_COORDINATOR)
    coordinator = coordinator_of(broker)
    group = await coordinator.group(body.group_id)
    generation = getattr(body, "generation_id", None)
    if generation is None:
        generation = body.generation_id_or_member_epoch
    if generation >= 0 or body.member_id:
        member = group.members.get(body.member_id)
        if member is None:
            return answer(codes.UNKNOWN_MEMBER_ID)
        if generation != group.generation:
            return answer(codes.ILLEGAL_GENERATION)
        if group.state == "PreparingRebalance":
            return answer(codes.REBALANCE_IN_PROGRESS)
        member.last_seen = time.monotonic()
    elif group.members:
        # A commit without membership to a group that has members (Kafka's rule).
        return answer(codes.UNKNOWN_MEMBER_ID)
    for _ in range(_COMMIT_ATTEMPTS):
        async with group.lock:
            if coordinator.groups.get(body.group_id) is not group:
                return answer(codes.NOT_COORDINATOR)
            stored, version = await _stored(broker, body.group_id)
            if version != group.version:
                if group.members or (stored.get("group") or {}).get("members"):
                    # Another node coordinated this group meanwhile: it is not ours.
                    coordinator.drop(group)
                    return answer(codes.NOT_COORDINATOR)
                group.version = version  # another commit without membership: no conflict
            offsets: dict[str, dict[str, list[Any]]] = stored.setdefault("offsets", {})
            for topic in body.topics:
                for part in topic.partitions:
                    offsets.setdefault(topic.name, {})[str(part.partition_index)] = [
                        part.committed_offset,
                        part.committed_metadata or "",
                    ]
            if group.protocol_type:
                stored["protocol_type"] = group.protocol_type
            try:
                group.version = await broker.kv.kv_put(
                    GROUPS_NAMESPACE, body.group_id, json.dumps(stored).encode(), version
                )
            except VersionConflict:
                continue  # the next attempt reads the entry again and decides
            except Exception as error:
                log.warning(
                    "kafka: committing offsets of group %r failed: %s", body.group_id, error
                )
                return answer(codes.COORDINATOR_NOT_AVAILABLE)
            return answer(codes.NONE)
    return answer(codes.COORDINATOR_LOAD_IN_PROGRESS)


async def handle_offset_fetch(session: Any, request: DecodedRequest) -> dict[str, Any]:
    broker: KafkaBroker = session.broker
    body = request.body
    if await _not_here(broker, body.group_id):
        return {"throttle_time": 0, "topics": [], "error_code": codes.NOT_COORDINATOR}
    stored, _ = await _stored(broker, body.group_id)
    offsets: dict[str, dict[str, list[Any]]] = stored.get("offsets", {})
    if body.topics is None:
        wanted = [(name, [int(index) for index in parts]) for name, parts in offsets.items()]
    else:
        wanted = [(topic.name, list(topic.partition_indexes)) for topic in body.topics]
    topics = []
    for name, indexes in wanted:
        partitions = []
        for index in indexes:
            committed = offsets.get(name, {}).get(str(index))
            partitions.append(
                {
                    "partition_index": index,
                    "committed_offset": -1 if committed is None else committed[0],
                    "committed_leader_epoch": -1,
                    "metadata": "" if committed is None else committed[1],
                    "error_code": codes.NONE,
                }
            )
        topics.append({"name": name, "partitions": partitions})
    return {"throttle_time": 0, "topics": topics, "error_code": codes.NONE}


# -- ListGroups / DescribeGroups -------------------------------------------------------------------


async def handle_list_groups(session: Any, request: DecodedRequest) -> dict[str, Any]:
    broker: KafkaBroker = session.broker
    coordinator = coordinator_of(broker)
    states_filter = set(getattr(request.body, "states_filter", ()) or ())
    listed: dict[str, tuple[str, str]] = {}
    start_after = ""
    while True:
        rows = await broker.kv.kv_list(GROUPS_NAMESPACE, "", start_after, 1000)
        for key, value, _ in rows:
            if await _coordinator_node(broker, key) == broker.node_id:
                listed[key] = (json.loads(value).get("protocol_type") or "consumer", "Empty")
        if len(rows) < 1000:
            break
        start_after = rows[-1][0]
    for group in coordinator.groups.values():
        if group.members or group.group_id in listed:
            listed[group.group_id] = (group.protocol_type or "consumer", group.state)
    return {
        "throttle_time": 0,
        "error_code": codes.NONE,
        "groups": [
            {"group_id": group_id, "protocol_type": protocol_type, "group_state": state}
            for group_id, (protocol_type, state) in sorted(listed.items())
            if not states_filter or state in states_filter
        ],
    }


async def handle_describe_groups(session: Any, request: DecodedRequest) -> dict[str, Any]:
    broker: KafkaBroker = session.broker
    coordinator = coordinator_of(broker)
    answers = []
    for group_id in request.body.groups:
        if await _not_here(broker, group_id):
            answers.append({"error_code": codes.NOT_COORDINATOR, "group_id": group_id})
            continue
        group = await coordinator.existing(group_id)
        if group is None or not group.members:
            stored, version = await _stored(broker, group_id)
            answers.append(
                {
                    "error_code": codes.NONE,
                    "group_id": group_id,
                    "group_state": "Empty" if version else "Dead",
                    "protocol_type": stored.get("protocol_type") or "",
                    "protocol_data": "",
                    "members": [],
                    "authorized_operations": -2147483648,
                }
            )
            continue
        answers.append(
            {
                "error_code": codes.NONE,
                "group_id": group_id,
                "group_state": group.state,
                "protocol_type": group.protocol_type or "",
                "protocol_data": group.protocol_name or "",
                "members": [
                    {
                        "member_id": member.member_id,
                        "group_instance_id": member.instance_id,
                        "client_id": member.client_id,
                        "client_host": member.client_host,
                        "member_metadata": dict(member.protocols).get(
                            group.protocol_name or "", b""
                        ),
                        "member_assignment": member.assignment,
                    }
                    for member in group.members.values()
                ],
                "authorized_operations": -2147483648,
            }
        )
    return {"throttle_time": 0, "groups": answers}
