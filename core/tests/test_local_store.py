"""LocalObjectStore: one test per ObjectStore invariant, plus cross-process conditional puts,
hashed keys, temp files and real medium errors."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from walstream.config import BuildContext
from walstream.engine.object_reader import read_index
from walstream.errors import (
    BackendUnavailable,
    ConfigError,
    InvalidArgument,
    NotFound,
    PreconditionFailed,
)
from walstream.format.batch import encode_batch
from walstream.format.object import ObjectIdentity, verify_object
from walstream.format.object_builder import ObjectBuilder
from walstream.format.object_keys import object_key
from walstream.objects.local import LOCAL_OBJECT_STORE, LocalObjectStore
from walstream.records import Record

DEPLOYMENT = bytes.fromhex("00112233445566778899aabbccddeeff")


@pytest.fixture
def store(tmp_path: Path) -> LocalObjectStore:
    return LocalObjectStore(tmp_path / "objects")


async def keys_of(store: LocalObjectStore, prefix: str = "") -> list[str]:
    return [meta.key async for meta in store.list(prefix)]


def files_under(root: Path) -> list[str]:
    """Every file below ``root`` (temporary ones included), relative, sorted."""
    return sorted(str(path.relative_to(root)) for path in root.rglob("*") if path.is_file())


# ---------------------------------------------------------------- invariant 1: put-get


async def test_put_get(store: LocalObjectStore) -> None:
    await store.put("a/b/c", b"first")
    assert await store.get("a/b/c") == b"first"
    await store.put("a/b/c", b"second, longer")
    assert await store.get("a/b/c") == b"second, longer"
    await store.put("empty", b"")
    assert await store.get("empty") == b""
    # A new instance on the same root (a restart) sees the same objects.
    assert await LocalObjectStore(store.root).get("a/b/c") == b"second, longer"
    assert files_under(store.root) == ["a/b/c", "empty"]


async def test_put_get_is_atomic_for_concurrent_readers(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path, fsync=False)
    size = 4 << 20
    versions = [bytes([fill]) * size for fill in (0x11, 0x22, 0x33)]
    await store.put("hot", versions[0])

    async def overwrite() -> None:
        for round_number in range(30):
            await store.put("hot", versions[round_number % 3])

    async def read() -> list[bytes]:
        seen = []
        for _ in range(60):
            seen.append(await store.get("hot"))
        return seen

    _, *readers = await asyncio.gather(overwrite(), read(), read())
    for data in (data for seen in readers for data in seen):
        assert data in versions  # whole old or whole new, never a mix or a short read


# ---------------------------------------------------------------- invariant 2: ranged-get


async def test_ranged_get(store: LocalObjectStore) -> None:
    data = bytes(range(256)) * 4
    await store.put("r", data)
    assert await store.get("r", 10, 20) == data[10:20]
    assert await store.get("r", 1000) == data[1000:]
    assert await store.get("r", 1000, 5000) == data[1000:]  # clamped
    assert await store.get("r", 5000) == b""
    assert await store.get("r", 5000, 6000) == b""
    assert await store.get("r", -48) == data[-48:]  # suffix read
    assert await store.get("r", -5000) == data  # suffix longer than the object
    assert await store.get("r", 30, 30) == b""
    with pytest.raises(InvalidArgument):
        await store.get("r", -10, 20)


# ---------------------------------------------------------------- invariant 3: put-if-absent


async def test_put_if_absent(store: LocalObjectStore) -> None:
    await store.put_if_absent("x/once", b"winner")
    with pytest.raises(PreconditionFailed):
        await store.put_if_absent("x/once", b"loser")
    assert await store.get("x/once") == b"winner"
    results = await asyncio.gather(
        *(store.put_if_absent("x/race", b"%d" % i) for i in range(16)), return_exceptions=True
    )
    winners = [i for i, result in enumerate(results) if result is None]
    assert len(winners) == 1
    assert all(isinstance(r, PreconditionFailed) for r in results if r is not None)
    assert await store.get("x/race") == b"%d" % winners[0]
    assert files_under(store.root) == ["x/once", "x/race"]  # losers left no temp files


_RACER = textwrap.dedent(
    """
    import asyncio, sys, time
    from pathlib import Path
    from walstream.errors import PreconditionFailed
    from walstream.objects.local import LocalObjectStore

    root, name, go_file = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    key_count = int(sys.argv[4])

    async def main() -> None:
        store = LocalObjectStore(root)
        while not go_file.exists():
            time.sleep(0.001)
        for index in range(key_count):
            try:
                await store.put_if_absent(f"race/{index:04d}", name.encode())
                print(f"won {index}", flush=True)
            except PreconditionFailed:
                print(f"lost {index}", flush=True)

    asyncio.run(main())
    """
)


@pytest.mark.slow
def test_put_if_absent_two_processes_race_exactly_one_wins(tmp_path: Path) -> None:
    root = tmp_path / "objects"
    go_file = tmp_path / "go"
    key_count = 200
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", _RACER, str(root), name, str(go_file), str(key_count)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for name in ("left", "right")
    ]
    go_file.touch()
    outputs = [racer.communicate(timeout=120)[0] for racer in racers]
    assert [racer.returncode for racer in racers] == [0, 0]
    won = [
        {int(line.split()[1]) for line in out.splitlines() if line.startswith("won")}
        for out in outputs
    ]
    lost = [
        {int(line.split()[1]) for line in out.splitlines() if line.startswith("lost")}
        for out in outputs
    ]
    everything = set(range(key_count))
    assert won[0] | won[1] == everything and not won[0] & won[1]
    assert lost[0] == everything - won[0] and lost[1] == everything - won[1]
    store = LocalObjectStore(root)
    for index in range(key_count):
        expected = b"left" if index in won[0] else b"right"
        assert asyncio.run(store.get(f"race/{index:04d}")) == expected
    assert len(files_under(root)) == key_count  # no temp file left by either racer


# ---------------------------------------------------------------- invariant 4: head


async def test_head(store: LocalObjectStore) -> None:
    await store.put("h/obj", b"12345")
    meta = await store.head("h/obj")
    assert (meta.key, meta.size) == ("h/obj", 5)
    with pytest.raises(NotFound):
        await store.head("h/missing")
    with pytest.raises(NotFound):
        await store.head("h")  # a folder is not an object
    with pytest.raises(NotFound):
        await store.head("h/obj/below")


# ---------------------------------------------------------------- invariant 5: delete-idempotent


async def test_delete_idempotent(store: LocalObjectStore) -> None:
    await store.put("d/1", b"1")
    await store.put("d/2", b"2")
    await store.delete(["d/1", "d/missing", "nowhere/at/all", "d"])
    await store.delete(["d/1"])
    await store.delete([])
    with pytest.raises(NotFound):
        await store.get("d/1")
    assert await store.get("d/2") == b"2"
    assert await keys_of(store) == ["d/2"]


# ---------------------------------------------------------------- invariant 6: list


async def test_list(store: LocalObjectStore) -> None:
    keys = ["a", "a-b", "a/b", "a/c/d", "a/c-e", "a0", "b/x", "é/1", "ab/cd/ef.wso", "ab/cd/eg"]
    keys.remove("a")  # a file "a" and a folder "a/" cannot coexist in one folder
    for key in keys:
        await store.put(key, key.encode())
    listed = [(meta.key, meta.size) async for meta in store.list()]
    assert listed == [(key, len(key.encode())) for key in sorted(keys)]
    assert await keys_of(store, "a") == sorted(k for k in keys if k.startswith("a"))
    assert await keys_of(store, "a/") == ["a/b", "a/c-e", "a/c/d"]
    assert await keys_of(store, "a/c") == ["a/c-e", "a/c/d"]
    assert await keys_of(store, "ab/cd/e") == ["ab/cd/ef.wso", "ab/cd/eg"]
    assert await keys_of(store, "ab/cd/ef.wso") == ["ab/cd/ef.wso"]
    assert await keys_of(store, "zz") == []
    assert await keys_of(store, "no/such/folder/") == []
    assert await keys_of(store, "a//") == []
    assert await keys_of(LocalObjectStore(store.root / "never-created")) == []


async def test_list_many_keys_over_hashed_folders_in_order(store: LocalObjectStore) -> None:
    keys = [object_key(object_id, DEPLOYMENT, prefix="objects/") for object_id in range(300)]
    await asyncio.gather(*(store.put(key, b"x") for key in keys))
    assert await keys_of(store) == sorted(keys)
    some_prefix = keys[0][: len("objects/") + 1]
    assert await keys_of(store, some_prefix) == sorted(k for k in keys if k.startswith(some_prefix))


# ---------------------------------------------------------------- invariant 7: writer


async def test_writer(store: LocalObjectStore) -> None:
    writer = store.writer("w/streamed")
    await writer.write(b"part one, ")
    await writer.write(b"part two")
    with pytest.raises(NotFound):
        await store.head("w/streamed")  # nothing visible before close
    assert await keys_of(store) == []
    meta = await writer.close()
    assert (meta.key, meta.size) == ("w/streamed", 18)
    assert await store.get("w/streamed") == b"part one, part two"
    with pytest.raises(InvalidArgument):
        await writer.write(b"late")

    async with store.writer("w/ctx") as ctx_writer:
        await ctx_writer.write(b"ctx")
    assert await store.get("w/ctx") == b"ctx"

    empty = store.writer("w/empty")
    assert (await empty.close()).size == 0
    assert await store.get("w/empty") == b""
    assert files_under(store.root) == ["w/ctx", "w/empty", "w/streamed"]


async def test_conditional_writer_never_replaces_an_existing_object(
    store: LocalObjectStore,
) -> None:
    await store.put("w/taken", b"first")
    writer = store.writer("w/taken", if_absent=True)
    await writer.write(b"second")
    with pytest.raises(PreconditionFailed, match="already exists"):
        await writer.close()
    assert await store.get("w/taken") == b"first"
    assert files_under(store.root) == ["w/taken"]  # the temporary file is gone too
    fresh = store.writer("w/fresh", if_absent=True)
    await fresh.write(b"new")
    assert (await fresh.close()).size == 3
    assert await store.get("w/fresh") == b"new"


async def test_abort_leaves_nothing(store: LocalObjectStore) -> None:
    writer = store.writer("gone/soon")
    await writer.write(b"x" * 100_000)
    await writer.abort()
    await writer.abort()  # idempotent
    with pytest.raises(NotFound):
        await store.get("gone/soon")
    with pytest.raises(RuntimeError):
        async with store.writer("gone/also") as failing:
            await failing.write(b"y")
            raise RuntimeError("the producer failed")
    assert files_under(store.root) == []
    assert await keys_of(store) == []


async def test_temp_files_never_listed(store: LocalObjectStore) -> None:
    await store.put("t/kept", b"k")
    (store.root / "t" / ".tmp-left-by-a-crash").write_bytes(b"junk")
    writer = store.writer("t/in-progress")
    await writer.write(b"not yet")
    assert await keys_of(store) == ["t/kept"]
    assert await keys_of(store, "t/.tmp") == []
    assert any(".tmp-" in name for name in files_under(store.root))
    await writer.close()
    assert await keys_of(store) == ["t/in-progress", "t/kept"]
    with pytest.raises(InvalidArgument):
        await store.put("t/.tmp-forged", b"x")


# ---------------------------------------------------------------- invariant 8: errors-typed


@pytest.mark.parametrize(
    "key", ["", "/abs", "a/../b", "./a", "a/./b", "a//b", "a/", "nul\x00key", ".tmp-x", "..", "."]
)
async def test_errors_typed_invalid_keys(store: LocalObjectStore, key: str) -> None:
    with pytest.raises(InvalidArgument):
        await store.put(key, b"x")
    with pytest.raises(InvalidArgument):
        await store.get(key)
    with pytest.raises(InvalidArgument):
        store.writer(key)
    assert not store.root.exists() or files_under(store.root) == []


async def test_errors_typed(store: LocalObjectStore) -> None:
    with pytest.raises(NotFound):
        await store.get("missing")
    await store.put("clash", b"file")
    with pytest.raises(InvalidArgument, match="clashes"):
        await store.put("clash/below", b"x")
    await store.put("folder/x", b"x")
    with pytest.raises(InvalidArgument, match="clashes"):
        await store.put("folder", b"x")
    with pytest.raises(InvalidArgument, match="clashes"):
        await store.put_if_absent("folder", b"x")
    with pytest.raises(NotFound):
        await store.get("folder")
    with pytest.raises(InvalidArgument):
        await store.put("x" * 300, b"too long a name")


@contextlib.contextmanager
def tiny_filesystem(mount_point: Path, size: str) -> Iterator[Path]:
    mount_point.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)],
        capture_output=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


async def test_errors_typed_disk_full_and_read_only(tmp_path: Path) -> None:
    with tiny_filesystem(tmp_path / "small", "256k") as mount:
        store = LocalObjectStore(mount / "objects")
        await store.put("fits", b"x" * 1000)
        with pytest.raises(BackendUnavailable, match="no space left") as caught:
            await store.put("too/big", b"x" * (2 << 20))
        assert str(mount) in str(caught.value)
        writer = store.writer("too/big-streamed")
        with pytest.raises(BackendUnavailable, match="no space left"):
            for _ in range(8):
                await writer.write(b"y" * (64 << 10))
            await writer.close()
        assert files_under(store.root) == ["fits"]  # failures left no temp files
        subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
        with pytest.raises(BackendUnavailable, match="read-only"):
            await store.put("later", b"x")
        assert await store.get("fits") == b"x" * 1000


# ---------------------------------------------------------------- objects in the store


async def test_hashed_object_key_round_trips(store: LocalObjectStore) -> None:
    identity = ObjectIdentity(DEPLOYMENT, 123456789)
    builder = ObjectBuilder(block_target_bytes=256, identity=identity)
    for offset in range(40):
        builder.add_batch(encode_batch(3, 1, offset, [Record(b"r%d" % offset)], [offset]))
    built = builder.finish()
    key = object_key(123456789, DEPLOYMENT, prefix="data/")
    await store.put_if_absent(key, built.data)
    assert await keys_of(store, "data/") == [key]
    assert (await store.head(key)).size == len(built.data)
    index = await read_index(store, key, len(built.data), built.index_size, expected=identity)
    assert index.identity == identity
    assert index.entries == verify_object(await store.get(key), identity).entries


async def test_a_second_create_of_an_object_key_never_replaces_the_first(
    store: LocalObjectStore,
) -> None:
    key = object_key(7, DEPLOYMENT)
    await store.put_if_absent(key, b"first")
    with pytest.raises(PreconditionFailed, match="already exists"):
        await store.put_if_absent(key, b"second")
    assert await store.get(key) == b"first"
    assert [name for name in os.listdir(store.path_of(key).parent)] == [key.rsplit("/", 1)[1]]


# ---------------------------------------------------------------- factory


async def test_factory_builds_from_a_yaml_section(tmp_path: Path) -> None:
    section = {"type": "local", "root": "objs"}
    built = LOCAL_OBJECT_STORE.build(section, BuildContext(base_dir=tmp_path), "object_store")
    assert built.root == tmp_path / "objs" and built.fsync is True
    await built.put("k", b"v")
    assert (tmp_path / "objs" / "k").read_bytes() == b"v"
    fast = LOCAL_OBJECT_STORE.build(
        {"root": str(tmp_path / "abs"), "fsync": "false"}, BuildContext(base_dir=tmp_path), "o"
    )
    assert fast.fsync is False and fast.root == tmp_path / "abs"
    with pytest.raises(ConfigError, match=r"object_store\.root"):
        LOCAL_OBJECT_STORE.build({}, BuildContext(base_dir=tmp_path), "object_store")
    with pytest.raises(ConfigError, match=r"object_store\.fsink"):
        LOCAL_OBJECT_STORE.build(
            {"root": "x", "fsink": True}, BuildContext(base_dir=tmp_path), "object_store"
        )
    assert os.fspath(built.root) in str(built.describe())
