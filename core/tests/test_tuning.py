"""walstream.tune_gc: the garbage-collector settings ``walstream serve`` applies to its process
(checked in a child process: they are process-wide)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import walstream


def test_tune_gc_freezes_what_exists_and_raises_the_young_threshold() -> None:
    script = textwrap.dedent(
        """
        import gc, walstream
        before = object.__new__(type("Before", (), {}))
        walstream.tune_gc()
        threshold = gc.get_threshold()
        frozen = gc.get_freeze_count()
        tracked = {id(o) for o in gc.get_objects()}
        print(threshold[0], threshold[1:] == (10, 10), frozen > 1000, id(before) in tracked)
        """
    )
    answer = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    assert answer.stdout.split() == ["20000", "True", "True", "False"]


def test_tune_gc_refuses_a_threshold_below_one() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        walstream.tune_gc(0)
