"""The ``walstream`` console script, run as a real process against a temporary deployment."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

WALSTREAM = shutil.which("walstream", path=str(Path(sys.executable).parent)) or "walstream"
HAS_EBS = importlib.util.find_spec("walstream_wal_ebs") is not None
HAS_CONFORMANCE = importlib.util.find_spec("walstream_conformance") is not None
HAS_CONFORMANCE_CLI = HAS_CONFORMANCE and (
    importlib.util.find_spec("walstream_conformance.cli") is not None
)

WAL_SECTION = (
    "wal: {type: ebs, path: data/wal.img, capacity: 64MiB}\n"
    if HAS_EBS
    else "wal: {type: memory}\n"
)
DEPLOYMENT = (
    "node: {id: 1}\n" + WAL_SECTION + "object_store: {type: local, root: data/objects}\n"
    "metadata: {type: sqlite, path: data/meta.db}\n"
    "upload: {max_bytes: 1MiB, max_interval: 100ms}\n"
)

Cli = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def deployment(tmp_path: Path) -> Path:
    path = tmp_path / "deploy.yaml"
    path.write_text(DEPLOYMENT)
    return path


@pytest.fixture
def cli(tmp_path: Path, deployment: Path) -> Cli:
    """``cli(*args, input=..., config=..., expect=0)`` runs ``walstream --config deploy.yaml``
    in ``tmp_path`` and asserts the exit status."""

    def run(
        *args: str,
        input: str | None = None,
        config: Path | None = deployment,
        expect: int | None = 0,
    ) -> subprocess.CompletedProcess[str]:
        command = [WALSTREAM, *(["--config", str(config)] if config is not None else []), *args]
        result = subprocess.run(
            command,
            input=input,
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=120,
        )
        if expect is not None:
            assert result.returncode == expect, (
                f"{command} exited {result.returncode}\nstdout:\n{result.stdout}\n"
                f"stderr:\n{result.stderr}"
            )
        return result

    return run


def json_lines(text: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def object_files(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "data" / "objects").rglob("*.wso"))


def assert_one_line_error(result: subprocess.CompletedProcess[str], error_class: str) -> None:
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("walstream: error:")]
    assert lines, result.stderr
    assert lines[0].startswith(f"walstream: error: {error_class}: "), result.stderr


@pytest.mark.slow
def test_streams_create_list_delete(cli: Cli) -> None:
    assert "created stream 'orders'" in cli("streams", "create", "orders").stdout
    cli("streams", "create", "payments")
    cli("streams", "create", "orders-eu")

    listed = json_lines(cli("streams", "list", "--json").stdout)
    assert sorted(str(entry["name"]) for entry in listed) == ["orders", "orders-eu", "payments"]
    prefixed = json_lines(cli("streams", "list", "--prefix", "orders", "--json").stdout)
    assert sorted(str(entry["name"]) for entry in prefixed) == ["orders", "orders-eu"]
    table = cli("streams", "list").stdout
    assert "NAME" in table and "payments" in table

    taken = cli("streams", "create", "orders", expect=1)
    assert_one_line_error(taken, "StreamExists")

    cli("streams", "delete", "orders")
    names = [entry["name"] for entry in json_lines(cli("streams", "list", "--json").stdout)]
    assert sorted(str(name) for name in names) == ["orders-eu", "payments"]
    gone = cli("streams", "delete", "orders", expect=1)
    assert_one_line_error(gone, "StreamNotFound")


@pytest.mark.slow
def test_streams_create_in_bulk_and_list_in_pages(cli: Cli, tmp_path: Path) -> None:
    """``streams create A B …`` and ``--from-file`` create in one transaction (all or none);
    ``streams list --limit/--start-after`` pages by name and says where the next page starts."""
    assert "created 3 streams" in cli("streams", "create", "b", "a", "c").stdout
    names = tmp_path / "names.txt"
    names.write_text("".join(f"n{i:04d}\n" for i in range(2_500)))
    made = cli("streams", "create", "--from-file", str(names))
    assert "created 2500 streams" in made.stdout
    cli("streams", "create", "--from-file", "-", input="d\ne\n")
    refused = cli("streams", "create", "f", "a", "g", expect=1)
    assert_one_line_error(refused, "StreamExists")
    every = [str(e["name"]) for e in json_lines(cli("streams", "list", "--json").stdout)]
    assert every == sorted(["a", "b", "c", "d", "e"] + [f"n{i:04d}" for i in range(2_500)])
    assert "f" not in every and "g" not in every  # the refused call created nothing

    first = cli("streams", "list", "--limit", "2", "--json")
    assert [e["name"] for e in json_lines(first.stdout)] == ["a", "b"]
    assert "--start-after b" in first.stderr
    after = cli("streams", "list", "--start-after", "b", "--limit", "3", "--json")
    assert [e["name"] for e in json_lines(after.stdout)] == ["c", "d", "e"]
    tail = cli("streams", "list", "--prefix", "n", "--start-after", "n2497", "--json")
    assert [e["name"] for e in json_lines(tail.stdout)] == ["n2498", "n2499"]
    assert "more streams follow" not in tail.stderr
    assert cli("streams", "list", "--limit", "0", expect=2).returncode == 2


@pytest.mark.slow
def test_append_from_stdin_and_file_then_read_json(cli: Cli, tmp_path: Path) -> None:
    cli("streams", "create", "events")
    appended = cli("append", "events", input="alpha\nbeta\nγάμμα\n")
    assert appended.stdout.splitlines() == ["offsets 0..2"]

    lines_file = tmp_path / "lines.txt"
    lines_file.write_text("".join(f"line {index}\n" for index in range(250)))
    from_file = cli(
        "append", "events", "--file", str(lines_file), "--key", "user-7", "--batch", "100"
    )
    assert from_file.stdout.splitlines() == [
        "offsets 3..102",
        "offsets 103..202",
        "offsets 203..252",
    ]
    assert "appended 250 records in 3 batches" in from_file.stderr

    cli("append", "events", "--header", "source=cli", "--header", "n=2", input="with headers\n")
    records = json_lines(cli("read", "events", "--format", "json").stdout)
    with_headers = records.pop()
    assert with_headers["offset"] == 253 and with_headers["value"] == "with headers"
    assert with_headers["headers"] == [["source", "cli"], ["n", "2"]]
    assert [record["offset"] for record in records] == list(range(253))
    assert [record["value"] for record in records[:3]] == ["alpha", "beta", "γάμμα"]
    assert all(record["key"] is None for record in records[:3])
    assert [record["value"] for record in records[3:]] == [f"line {i}" for i in range(250)]
    assert all(record["key"] == "user-7" for record in records[3:])

    page = cli("read", "events", "--start", "10", "--limit", "3").stdout
    assert page.splitlines() == ["10\tline 7", "11\tline 8", "12\tline 9"]
    last = json_lines(cli("read", "events", "--tail-offset", "2", "--format", "json").stdout)
    assert [record["offset"] for record in last] == [252, 253]
    hex_lines = cli("read", "events", "--start", "0", "--limit", "1", "--format", "hex").stdout
    assert hex_lines.splitlines() == [f"0\t\t{b'alpha'.hex()}"]


@pytest.mark.slow
def test_binary_values_survive_json(cli: Cli, tmp_path: Path) -> None:
    cli("streams", "create", "raw")
    data = tmp_path / "raw.bin"
    data.write_bytes(b"\xff\xfe\x00ok\n")
    cli("append", "raw", "--file", str(data), "--no-progress")
    (record,) = json_lines(cli("read", "raw", "--format", "json").stdout)
    assert record["value"] == {"base64": "//4Ab2s="}


@pytest.mark.slow
def test_trim_then_reading_an_old_offset_fails_cleanly(cli: Cli) -> None:
    cli("streams", "create", "log")
    cli("append", "log", input="".join(f"{index}\n" for index in range(300)))
    cli("trim", "log", "100")

    old = cli("read", "log", "--start", "50", expect=1)
    assert_one_line_error(old, "OutOfRangeError")
    assert old.stdout == ""

    remaining = cli("read", "log").stdout.splitlines()
    assert remaining[0] == "100\t100"
    assert len(remaining) == 200

    verbose = cli("read", "log", "--start", "50", "-v", expect=1)
    assert "Traceback" in verbose.stderr


@pytest.mark.slow
def test_inspect_object_decodes_the_index_and_verifies(cli: Cli, tmp_path: Path) -> None:
    cli("streams", "create", "sensors")
    cli("append", "sensors", "--batch", "50", input="".join(f"reading {i}\n" for i in range(400)))
    files = object_files(tmp_path)
    assert files, "closing the client uploads every record into objects"

    described = cli("inspect", "object", str(files[0])).stdout
    assert "index:" in described
    assert "block: stream" in described and "crc ok" in described
    assert "verified" in described

    key = files[0].relative_to(tmp_path / "data" / "objects").as_posix()
    by_key = cli("inspect", "object", key).stdout
    assert "block: stream" in by_key

    listed = cli("inspect", "metadata").stdout
    assert "sensors" in listed and "committed" in listed and "running" not in listed


@pytest.mark.slow
def test_inspect_object_with_a_flipped_byte_fails_with_corruption_error(
    cli: Cli, tmp_path: Path
) -> None:
    cli("streams", "create", "sensors")
    cli("append", "sensors", input="".join(f"reading {i}\n" for i in range(400)))
    original = object_files(tmp_path)[0]
    damaged = tmp_path / "damaged.wso"
    data = bytearray(original.read_bytes())
    data[40] ^= 0x01  # inside the first data block
    damaged.write_bytes(bytes(data))

    result = cli("inspect", "object", str(damaged), expect=1)
    assert_one_line_error(result, "CorruptionError")
    assert "BAD" in result.stdout


@pytest.mark.slow
def test_misspelled_key_and_unknown_wal_exit_2_naming_them(cli: Cli, tmp_path: Path) -> None:
    misspelled = tmp_path / "misspelled.yaml"
    misspelled.write_text(DEPLOYMENT.replace("object_store:", "object_stor:"))
    result = cli("streams", "list", config=misspelled, expect=2)
    assert_one_line_error(result, "ConfigError")
    assert "object_stor" in result.stderr

    bad_option = tmp_path / "bad_option.yaml"
    bad_option.write_text(DEPLOYMENT.replace("path: data/meta.db", "pth: data/meta.db"))
    result = cli("streams", "list", config=bad_option, expect=2)
    assert "metadata.pth" in result.stderr

    unknown_wal = tmp_path / "unknown_wal.yaml"
    unknown_wal.write_text(DEPLOYMENT.replace(WAL_SECTION, "wal: {type: floppy-disk}\n"))
    result = cli("append", "x", input="a\n", config=unknown_wal, expect=2)
    assert_one_line_error(result, "ConfigError")
    assert "floppy-disk" in result.stderr and "memory" in result.stderr


@pytest.mark.slow
def test_usage_errors_exit_2(cli: Cli) -> None:
    result = cli("read", expect=2)
    assert "usage:" in result.stderr
    result = cli("read", "s", "--start", "1", "--tail-offset", "2", expect=2)
    assert "not allowed with" in result.stderr
    result = cli("append", "s", "--batch", "0", input="a\n", expect=2)
    assert "--batch" in result.stderr and "at least 1" in result.stderr
    result = cli("append", "s", "--header", "novalue", input="a\n", expect=2)
    assert "NAME=VALUE" in result.stderr


@pytest.mark.slow
def test_plugins_lists_the_builtin_backends(cli: Cli) -> None:
    text = cli("plugins").stdout
    for name in ("memory", "local", "sqlite"):
        assert f"  {name} " in text
    assert "walstream 0.1.0" in text
    entries = json_lines(cli("plugins", "--json").stdout)
    names = {(str(entry["kind"]), str(entry["name"])) for entry in entries}
    assert {("wal", "memory"), ("object_store", "local"), ("metadata", "sqlite")} <= names
    sqlite = next(entry for entry in entries if entry["name"] == "sqlite")
    assert any(option["name"] == "path" for option in sqlite["options"])  # type: ignore[union-attr]


@pytest.mark.slow
def test_help_documents_every_command_with_examples(cli: Cli) -> None:
    top = cli("--help", config=None).stdout
    for command in (
        "streams",
        "append",
        "read",
        "tail",
        "trim",
        "plugins",
        "inspect",
        "conformance",
        "demo",
        "examples:",
    ):
        assert command in top
    for command in (
        ["append"],
        ["read"],
        ["tail"],
        ["trim"],
        ["streams", "list"],
        ["inspect", "object"],
        ["demo"],
    ):
        text = cli(*command, "--help", config=None).stdout
        assert "--config" in text and "example" in text


@pytest.mark.slow
def test_conformance_delegates_or_explains_how_to_install(cli: Cli) -> None:
    if HAS_CONFORMANCE_CLI:
        assert "usage:" in cli("conformance", "--help").stdout
    elif HAS_CONFORMANCE:
        result = cli("conformance", expect=2)
        assert "has no command line" in result.stderr
    else:
        result = cli("conformance", expect=2)
        assert "pip install walstream-conformance" in result.stderr


@pytest.mark.slow
def test_tail_prints_the_last_records_and_follow_exits_0_on_ctrl_c(
    cli: Cli, tmp_path: Path, deployment: Path
) -> None:
    cli("streams", "create", "feed")
    cli("append", "feed", input="".join(f"item {i}\n" for i in range(30)))
    last = cli("tail", "feed", "-n", "3").stdout.splitlines()
    assert last == ["27\titem 27", "28\titem 28", "29\titem 29"]

    follower = subprocess.Popen(
        [WALSTREAM, "--config", str(deployment), "tail", "feed", "-f", "--start", "25"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert follower.stdout is not None
        seen = [follower.stdout.readline().rstrip("\n") for _ in range(5)]
        assert seen == [f"{i}\titem {i}" for i in range(25, 30)]
        time.sleep(0.3)
        follower.send_signal(signal.SIGINT)
        _, stderr = follower.communicate(timeout=30)
    finally:
        if follower.poll() is None:
            follower.kill()
    assert follower.returncode == 0, stderr
    assert "Traceback" not in stderr


@pytest.mark.slow
@pytest.mark.skipif(not HAS_EBS, reason="needs the walstream-wal-ebs dist (wal type 'ebs')")
def test_inspect_wal_decodes_the_ebs_file(cli: Cli, tmp_path: Path) -> None:
    cli("streams", "create", "w")
    cli("append", "w", input="a\nb\n")
    result = cli("inspect", "wal", str(tmp_path / "data" / "wal.img"), "--type", "ebs")
    assert result.stdout.strip()


@pytest.mark.slow
def test_demo_verifies_and_repeats_with_fresh_streams(cli: Cli) -> None:
    arguments: Sequence[str] = (
        "demo",
        "--streams",
        "2",
        "--records",
        "1500",
        "--value-bytes",
        "64",
        "--no-progress",
    )
    first = cli(*arguments)
    for label in (
        "records",
        "append p50",
        "append p99",
        "objects written",
        "read MiB/s",
        "verification",
    ):
        assert label in first.stdout
    assert "3,000" in first.stdout
    assert "OK" in first.stdout and "FAILED" not in first.stdout
    second = cli(*arguments)
    assert "demo-0002-0" in second.stdout
    names = {entry["name"] for entry in json_lines(cli("streams", "list", "--json").stdout)}
    assert {"demo-0001-0", "demo-0001-1", "demo-0002-0", "demo-0002-1"} <= names


def test_default_deployment_lives_in_walstream_data(cli: Cli, tmp_path: Path) -> None:
    if not HAS_EBS:
        pytest.skip("the embedded default uses the ebs WAL, which is not installed")
    cli("streams", "create", "here", config=None)
    assert (tmp_path / "walstream-data" / "meta.db").exists()
    assert os.path.exists(tmp_path / "walstream-data")


# -- what a new user runs into --------------------------------------------------------------------


@pytest.mark.slow
def test_tail_n_prints_the_last_n_records_even_past_one_reads_byte_limit(
    cli: Cli, tmp_path: Path
) -> None:
    """One read returns at most 1 MiB; ``tail -n`` pages until it has printed the last N."""
    cli("streams", "create", "big")
    values = tmp_path / "values.txt"
    values.write_text("".join(f"{index:05d}{'x' * 995}\n" for index in range(3000)))  # ~3 MB
    cli("append", "big", "--file", str(values), "--batch", "1000", "--no-progress")

    last = cli("tail", "big", "-n", "2500").stdout.splitlines()
    assert len(last) == 2500
    assert [int(line.split("\t")[0]) for line in last] == list(range(500, 3000))
    assert last[-1].split("\t")[1].startswith("02999x")

    everything = cli("tail", "big", "-n", "100000").stdout.splitlines()
    assert [int(line.split("\t")[0]) for line in everything] == list(range(3000))
    via_read = cli("read", "big", "--tail-offset", "100000").stdout.splitlines()
    assert via_read == everything

    cli("trim", "big", "1000")
    after_trim = cli("tail", "big", "-n", "100000").stdout.splitlines()
    assert [int(line.split("\t")[0]) for line in after_trim] == list(range(1000, 3000))


@pytest.mark.slow
def test_trim_before_the_start_says_nothing_was_trimmed(cli: Cli) -> None:
    cli("streams", "create", "orders")
    cli("append", "orders", input="".join(f"{index}\n" for index in range(600)))
    assert "offsets before 500 are gone" in cli("trim", "orders", "500").stdout

    again = cli("trim", "orders", "100")
    assert "nothing trimmed" in again.stdout and "already starts at offset 500" in again.stdout
    assert "are gone" not in again.stdout
    assert cli("read", "orders", "--limit", "1").stdout == "500\t500\n"
    assert "nothing trimmed" in cli("trim", "orders", "500").stdout


@pytest.mark.slow
def test_inspect_object_of_a_missing_file_says_so_and_how_to_find_objects(cli: Cli) -> None:
    missing = cli(
        "inspect", "object", "./walstream-data/objects/51/99/0000000000000001.wso", expect=1
    )
    assert_one_line_error(missing, "NotFound")
    assert "no such file" in missing.stderr and "walstream inspect metadata" in missing.stderr
    assert "path segment" not in missing.stderr
    unknown_key = cli("inspect", "object", "00/00/0000000000000042.wso", expect=1)
    assert_one_line_error(unknown_key, "NotFound")


@pytest.mark.slow
def test_append_messages_plurals_and_input_file_spellings(cli: Cli, tmp_path: Path) -> None:
    cli("streams", "create", "s")
    one = cli("append", "s", input="only\n")
    assert "appended 1 record in 1 batch to 's'" in one.stderr
    lines = tmp_path / "lines.txt"
    lines.write_text("a\nb\nc\n")
    short = cli("append", "s", "-i", str(lines), "-b", "2", "--no-progress")
    assert "appended 3 records in 2 batches" in short.stderr
    former = cli("append", "s", "-f", str(lines), "--no-progress")  # the old spelling still works
    assert "appended 3 records in 1 batch to" in former.stderr

    missing = cli("append", "s", "--file", "no-such-file.txt", expect=2)
    assert "Traceback" not in missing.stderr and "FileNotFoundError" not in missing.stderr
    assert "walstream: error: append --file no-such-file.txt: no such file" in missing.stderr
    assert cli("read", "s", "-n", "2").stdout.splitlines() == ["0\tonly", "1\ta"]


def test_a_missing_stream_points_at_the_streams_list_command(cli: Cli) -> None:
    result = cli("read", "nope", expect=1)
    assert_one_line_error(result, "StreamNotFound")
    assert "walstream streams list" in result.stderr and "list_streams()" not in result.stderr


@pytest.mark.slow
def test_help_names_every_deployment_section_and_json_lines(cli: Cli) -> None:
    from walstream_plugins.deployment import TOP_LEVEL_KEYS

    top = " ".join(cli("--help").stdout.split())
    config_help = top[top.index("--config FILE") :]
    config_help = config_help[: config_help.index("-v, --verbose")]
    for key in TOP_LEVEL_KEYS:
        assert key in config_help, (key, config_help)
    assert "-vv" in top
    for command in (("streams", "list"), ("plugins",), ("read",)):
        text = " ".join(cli(*command, "--help").stdout.split())
        assert "JSON lines" in text, (command, text)
    append_help = cli("append", "--help").stdout
    assert "-i F" in append_help and "-f F" not in append_help


LOGGING_PROBE = """
import logging, sys
from walstream.cli import runner
runner.configure_logging(int(sys.argv[1]))
logging.getLogger("botocore.endpoint").debug("third-party debug")
logging.getLogger("botocore.endpoint").info("third-party info")
logging.getLogger("walstream.engine.client").debug("core debug")
logging.getLogger("walstream_wal_s3.wal").debug("plugin debug")
"""


@pytest.mark.parametrize(
    ("verbosity", "shown", "hidden"),
    [
        (0, [], ["third-party info", "core debug", "plugin debug", "third-party debug"]),
        (1, ["third-party info", "core debug", "plugin debug"], ["third-party debug"]),
        (2, ["third-party info", "core debug", "plugin debug", "third-party debug"], []),
    ],
)
def test_verbose_keeps_third_party_debug_logging_for_vv(
    verbosity: int, shown: list[str], hidden: list[str]
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", LOGGING_PROBE, str(verbosity)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    for message in shown:
        assert message in done.stderr
    for message in hidden:
        assert message not in done.stderr


def test_python_read_of_a_negative_offset_is_invalid_argument(deployment: Path) -> None:
    import walstream.blocking
    from walstream import Record
    from walstream.errors import InvalidArgument

    with walstream.blocking.open(str(deployment)) as client:
        stream = client.create_stream("neg")
        stream.append([Record(b"a")])
        with pytest.raises(InvalidArgument, match=r"start: must be between 0 and .*, got -1"):
            stream.read(start=-1)
