"""examples/pipeline runs green on small data: streaming result == batch replay."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pipeline" / "run.py"


@pytest.mark.slow
def test_spark_pipeline_example_streaming_equals_replay(
    spark: Any, tmp_path: Path, capsys: Any
) -> None:
    spec = importlib.util.spec_from_file_location("walstream_pipeline_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    status = module.main(["--data", str(tmp_path / "pipeline"), "--events", "3000"], spark=spark)
    output = capsys.readouterr().out
    assert status == 0, output
    assert "3000 clicks in 10 minutes; streaming result equals the batch replay" in output
