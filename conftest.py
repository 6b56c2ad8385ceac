"""Workspace-wide pytest options."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--soak",
        action="store_true",
        default=False,
        help="run soak/crash loops at full length (CI runs a bounded version)",
    )


@pytest.fixture
def soak(request: pytest.FixtureRequest) -> bool:
    """True when the full-length soak/crash loops were asked for with --soak."""
    return bool(request.config.getoption("--soak"))
