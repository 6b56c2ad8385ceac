"""The saved benchmark profiles name code, never the machine they were taken on."""

from __future__ import annotations

from pathlib import Path

from common import profile

BENCH = Path(__file__).resolve().parents[1]


def test_a_top_list_has_no_machine_paths_and_no_process_frames(tmp_path: Path) -> None:
    raw = tmp_path / "raw.txt"
    raw.write_text(
        'process 4242:"/home/someone/checkout/.venv/bin/python /home/someone/checkout/bench/'
        'engine_local.py --quick";appender (/home/someone/checkout/bench/engine_local.py:138);'
        "append (/home/someone/checkout/core/src/walstream/engine/append.py:202);"
        "submit (/home/someone/checkout/.venv/lib/python3.11/site-packages/libaio/__init__.py:461)"
        " 7\n"
        'process 4242:"/usr/bin/python3 x.py";checksum (/opt/elsewhere/deep/walstream/format/'
        "object.py:234) 3\n"
    )
    text = profile.top_list(raw, "engine_local")
    assert "/home/" not in text and "/opt/" not in text and "process 4242" not in text
    assert "libaio/__init__.py:461" in text
    assert "walstream/engine/append.py" in text
    assert "70.0%" in text, "the submit line holds 7 of the 10 busy samples"


def test_saved_profiles_carry_no_absolute_paths() -> None:
    saved = sorted((BENCH / "figures").glob("profile_*.txt"))
    assert saved, "make bench names these files for the targets it does not meet"
    for path in saved:
        text = path.read_text()
        assert "/work/" not in text and "/home/" not in text and "/tmp/" not in text, path.name
        assert "process " not in text or ':"' not in text, path.name
