"""The benchmarks' tests import ``common`` and the scripts as the scripts import each other:
``bench/`` goes first on ``sys.path``."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))
