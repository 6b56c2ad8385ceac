"""README snippets run as written (the first step towards running every snippet in CI)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def python_block(heading: str) -> str:
    text = README.read_text()
    found = re.search(rf"## {re.escape(heading)}\n\n```python\n(.*?)```", text, re.S)
    assert found, f"README has no python block under '## {heading}'"
    return found.group(1)


def test_python_in_ten_lines_runs_as_written_and_again(tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(python_block("Python in ten lines"))
    outputs = []
    for _ in range(2):  # a second run finds the stream it created
        done = subprocess.run(
            [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout.strip())
    assert outputs == [
        "[(0, b'first'), (1, b'second')] tail 2",
        "[(2, b'first'), (3, b'second')] tail 4",
    ]
