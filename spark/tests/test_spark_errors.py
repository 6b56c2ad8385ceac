"""A user error in a Spark read reaches the user as one short message, not a Python traceback."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from walstream.errors import ConfigError
from walstream_spark.source import WalstreamReader
from walstream_spark.user_errors import in_spark_worker

# Spark's own wrapping ("[PYTHON_DATA_SOURCE_ERROR] Failed to ...: " and " SQLSTATE: 38000")
# plus our one-line message; a traceback would be dozens of lines and thousands of characters.
MAX_MESSAGE_CHARS = 400
# What Spark puts before a data source's error raised while ``load()`` resolves the schema.
SPARK_PREFIX = "[PYTHON_DATA_SOURCE_ERROR] Failed to create Python data source instance: "


def load_error(spark: Any, options: dict[str, str], *, streaming: bool = False) -> str:
    """The message of the error ``load()`` itself raises (before any query runs)."""
    from pyspark.errors import AnalysisException

    reader = (spark.readStream if streaming else spark.read).format("walstream")
    for key, value in options.items():
        reader = reader.option(key, value)
    with pytest.raises(AnalysisException) as caught:
        reader.load()
    return str(caught.value)


def assert_short(message: str, error: str, *expected: str, paths: tuple[Path, ...] = ()) -> None:
    """One line: Spark's prefix, then ``error`` (the walstream error class and its message
    start), then every ``expected`` text; no traceback. ``paths`` in the message (temporary
    folders of any length) count as one character each towards the length bound."""
    first_line = message.strip().splitlines()[0]
    assert first_line.startswith(SPARK_PREFIX + error), message
    for text in expected:
        assert text in first_line, message
    assert "Traceback" not in message, message
    compact = message
    for path in paths:
        compact = compact.replace(str(path), "P")
    assert len(compact) <= MAX_MESSAGE_CHARS, message


@pytest.mark.parametrize("streaming", [False, True], ids=["read", "readStream"])
def test_unknown_stream_fails_load_naming_the_stream_and_the_commands_that_fix_it(
    spark: Any, deployment: Path, streaming: bool
) -> None:
    message = load_error(spark, {"config": str(deployment), "streams": "nope"}, streaming=streaming)
    assert_short(
        message,
        f"walstream.errors.StreamNotFound: no stream 'nope' in the deployment {deployment}",
        f"`walstream -c {deployment} streams list`",
        f"`walstream -c {deployment} streams create nope`",
        paths=(deployment,),
    )


def test_bad_option_fails_load_naming_the_option(spark: Any, deployment: Path) -> None:
    options = {"config": str(deployment), "streams": "clicks", "startingOffsets": "{oops"}
    message = load_error(spark, options)
    assert_short(message, "walstream.errors.ConfigError: option 'startingOffsets'", "expected")


def test_missing_required_option_fails_load_with_an_example(spark: Any, deployment: Path) -> None:
    message = load_error(spark, {"config": str(deployment)})
    assert_short(
        message,
        "walstream.errors.ConfigError: option 'streams' is required",
        ".option('streams', 'clicks,orders')",
    )


def test_missing_deployment_file_fails_load_saying_where_it_was_looked_for(spark: Any) -> None:
    message = load_error(spark, {"config": "no-such-dir/deploy.yaml", "streams": "clicks"})
    assert_short(
        message,
        "walstream.errors.ConfigError: option 'config': deployment file "
        f"'no-such-dir/deploy.yaml' not found (relative to {Path.cwd()})",
        "give the path of the deployment's YAML file",
    )


def test_invalid_deployment_file_fails_load_naming_file_line_and_column(
    spark: Any, tmp_path: Path
) -> None:
    broken = tmp_path / "deploy.yaml"
    broken.write_text("node: {id: 1\nwal: [\n")
    message = load_error(spark, {"config": str(broken), "streams": "clicks"})
    assert_short(
        message, f"walstream.errors.ConfigError: {broken}:2:", "YAML syntax error", paths=(broken,)
    )


def test_reader_called_in_the_driver_keeps_its_environment(
    deployment: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Only a PySpark worker process is told to drop tracebacks; a driver calling the reader
    # directly (as here) must not have its environment, and so its Spark workers, changed.
    monkeypatch.delenv("SPARK_HIDE_TRACEBACK", raising=False)
    assert not in_spark_worker()
    with pytest.raises(ConfigError, match="option 'startingOffsets'"):
        WalstreamReader({"config": str(deployment), "streams": "a", "startingOffsets": "{oops"})
    assert "SPARK_HIDE_TRACEBACK" not in os.environ
