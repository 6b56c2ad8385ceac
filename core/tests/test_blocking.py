"""The blocking facade ``walstream.blocking`` over a real deployment (SQLite + local objects)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import walstream.blocking
from walstream import (
    OutOfRangeError,
    Record,
    StreamExists,
    StreamNotFound,
    TailMismatchError,
)


@pytest.fixture
def deployment(tmp_path: Path) -> Path:
    path = tmp_path / "deploy.yaml"
    path.write_text(
        "node: {id: 1}\n"
        "wal: {type: memory}\n"
        "object_store: {type: local, root: data/objects}\n"
        "metadata: {type: sqlite, path: data/meta.db}\n"
        "upload: {max_bytes: 256KiB, max_interval: 50ms}\n"
    )
    return path


def loop_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "walstream-sync"]


def test_append_read_trim_and_errors_propagate_unchanged(deployment: Path) -> None:
    with walstream.blocking.open(deployment) as client:
        stream = client.create_stream("orders")
        assert stream.name == "orders"
        first = stream.append([Record(b"a", key=b"k1"), Record(b"b", headers=(("h", b"x"),))])
        assert (first.start, first.end, first.tail) == (0, 2, 2)
        second = stream.append([Record(b"c")], match_tail=2)
        assert (second.start, second.end) == (2, 3)
        assert stream.check_tail() == 3

        result = stream.read(start=0)
        assert [(r.offset, r.value, r.key) for r in result.records] == [
            (0, b"a", b"k1"),
            (1, b"b", None),
            (2, b"c", None),
        ]
        assert result.records[1].headers == (("h", b"x"),)
        assert result.tail == 3
        assert [r.offset for r in stream.read(tail_offset=1).records] == [2]
        assert [r.value for r in stream.read(start=1, limit_records=1).records] == [b"b"]

        with pytest.raises(TailMismatchError) as mismatch:
            stream.append([Record(b"late")], match_tail=0)
        assert mismatch.value.actual_tail == 3
        with pytest.raises(StreamExists):
            client.create_stream("orders")
        with pytest.raises(StreamNotFound):
            client.open_stream("nope")

        stream.trim(2)
        assert stream.start_offset() == 2
        with pytest.raises(OutOfRangeError) as trimmed:
            stream.read(start=0)
        assert trimmed.value.start_offset == 2
        assert [r.value for r in stream.read(start=2).records] == [b"c"]


def test_streams_are_listed_deleted_and_survive_a_restart(deployment: Path) -> None:
    client = walstream.blocking.open(deployment)
    try:
        for name in ("a-1", "a-2", "b-1"):
            client.create_stream(name).append([Record(name.encode())])
        assert [info.name for info in client.list_streams(prefix="a-")] == ["a-1", "a-2"]
        client.delete_stream("a-2")
        assert [info.name for info in client.list_streams()] == ["a-1", "b-1"]
        client.flush()
    finally:
        client.close()
    assert client.closed
    assert not loop_threads(), "close() stops the loop thread"
    with pytest.raises(RuntimeError, match="closed"):
        client.list_streams()

    with walstream.blocking.open(str(deployment)) as reopened:
        assert [info.name for info in reopened.list_streams()] == ["a-1", "b-1"]
        stream = reopened.open_stream("b-1")
        assert [r.value for r in stream.read(start=0).records] == [b"b-1"]
        by_id = reopened.open_stream(stream.stream_id)
        assert by_id.name == "b-1"


def test_tail_iterates_and_follows_appends_from_another_thread(deployment: Path) -> None:
    with walstream.blocking.open(deployment) as client:
        stream = client.create_stream("feed")
        stream.append([Record(b"0"), Record(b"1")])

        def append_later() -> None:
            time.sleep(0.2)
            stream.append([Record(b"2")])
            stream.append([Record(b"3")])

        writer = threading.Thread(target=append_later)
        writer.start()
        seen: list[tuple[int, bytes]] = []
        with stream.tail(start=0) as records:
            for record in records:
                seen.append((record.offset, record.value))
                if len(seen) == 4:
                    break
        writer.join()
        assert seen == [(0, b"0"), (1, b"1"), (2, b"2"), (3, b"3")]

        # Without a start, tail begins at the current tail: only later records show.
        follower = stream.tail()
        threading.Timer(0.2, lambda: stream.append([Record(b"4")])).start()
        first = next(follower)
        follower.close()
        assert (first.offset, first.value) == (4, b"4")
        with pytest.raises(StopIteration):
            next(follower)


def test_many_threads_share_one_client(deployment: Path) -> None:
    batches, batch_records = 20, 10
    with walstream.blocking.open(deployment) as client:
        streams = [client.create_stream(f"s{index}") for index in range(4)]
        failures: list[BaseException] = []

        def write(stream: walstream.blocking.SyncStream) -> None:
            try:
                for batch in range(batches):
                    records = [
                        Record(f"{stream.name}:{batch}:{i}".encode()) for i in range(batch_records)
                    ]
                    ack = stream.append(records, match_tail=batch * batch_records)
                    assert ack.start == batch * batch_records
            except BaseException as error:
                failures.append(error)

        threads = [threading.Thread(target=write, args=(stream,)) for stream in streams]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not failures, failures
        for stream in streams:
            values = []
            position = 0
            while position < batches * batch_records:
                page = stream.read(start=position).records
                values.extend(record.value for record in page)
                position = page[-1].offset + 1
            assert values == [
                f"{stream.name}:{batch}:{i}".encode()
                for batch in range(batches)
                for i in range(batch_records)
            ]


def test_open_failure_raises_the_config_error_and_leaks_no_thread(tmp_path: Path) -> None:
    from walstream import ConfigError

    bad = tmp_path / "bad.yaml"
    bad.write_text("wal: {type: no-such-wal}\n")
    with pytest.raises(ConfigError, match="no-such-wal"):
        walstream.blocking.open(bad)
    assert not loop_threads()


def test_run_executes_any_coroutine_on_the_client_loop(deployment: Path) -> None:
    with walstream.blocking.open(deployment) as client:
        client.create_stream("x").append([Record(b"v")])
        client.flush()
        objects = client.run(client.async_client.metadata.list_objects())
        assert objects, "flush() committed at least one object"


def test_the_old_module_name_still_works_and_warns() -> None:
    import importlib
    import sys

    import walstream.blocking

    sys.modules.pop("walstream.sync", None)
    with pytest.warns(DeprecationWarning, match="walstream.blocking"):
        old = importlib.import_module("walstream.sync")
    assert old.open is walstream.blocking.open
    assert old.SyncClient is walstream.blocking.SyncClient
