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


def load_error(spark: Any, deployment: Path, **options: str) -> str:
    reader = spark.read.format("walstream").option("config", str(deployment))
    for key, value in options.items():
        reader = reader.option(key, value)
    with pytest.raises(Exception) as caught:  # PySpark's AnalysisException, from the JVM
        reader.load().collect()
    return str(caught.value)


def assert_short(message: str, *expected: str) -> None:
    first_line = message.strip().splitlines()[0]
    for text in expected:
        assert text in first_line, message
    assert "Traceback" not in message, message
    assert len(message) <= MAX_MESSAGE_CHARS, message


def test_unknown_stream_is_one_line_naming_the_stream_and_the_fix(
    spark: Any, deployment: Path
) -> None:
    message = load_error(spark, deployment, streams="nope")
    assert_short(
        message,
        "walstream.errors.StreamNotFound: no active stream 'nope'",
        "check the name with list_streams() or create it",
    )


def test_bad_option_is_one_line_naming_the_option(spark: Any, deployment: Path) -> None:
    message = load_error(spark, deployment, streams="clicks", startingOffsets="{oops")
    assert_short(message, "walstream.errors.ConfigError: option 'startingOffsets'", "expected")


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
