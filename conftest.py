"""Workspace-wide pytest options."""

from __future__ import annotations

import contextlib

import pytest

# kafka-python's import name is ``kafka``, the name of the Kafka listener's dist folder: pytest's
# importlib mode names that folder's test modules ``kafka.tests.…`` and would put a stand-in
# ``kafka`` module in front of kafka-python unless the real one is imported first.
with contextlib.suppress(ImportError):
    import kafka  # noqa: F401


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


SOAK_TEST_TIMEOUT_S = 4 * 3600
"""With ``--soak`` a loop runs at full length (the nemesis soak injects 200 faults, about half an
hour on 2 cores), longer than the suite's per-test limit of ``timeout`` in pyproject.toml."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``--soak``, a test that uses the ``soak`` fixture gets a 4 h limit instead of the
    suite's default (a ``--timeout`` given on the command line still wins)."""
    if not config.getoption("--soak") or config.getoption("timeout", None) is not None:
        return
    for item in items:
        if (
            "soak" in getattr(item, "fixturenames", ())
            and item.get_closest_marker("timeout") is None
        ):
            item.add_marker(pytest.mark.timeout(SOAK_TEST_TIMEOUT_S))
