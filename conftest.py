"""Workspace-wide pytest options: ``--soak``, and how the suite is split across pytest-xdist
workers (``make test`` runs it with ``-n``)."""

from __future__ import annotations

import contextlib
from typing import Any

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


@pytest.hookimpl(tryfirst=True)  # before -m selects: `-m soak` sees the marker added here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test that uses the ``soak`` fixture is a soak loop: it gets the ``soak`` marker
    (``pytest --soak -m soak`` runs every loop at full length, and nothing else). Under
    ``--soak`` it also gets a 4 h limit instead of the suite's default (a ``--timeout`` given on
    the command line still wins)."""
    long_limit = config.getoption("--soak") and config.getoption("timeout", None) is None
    for item in items:
        if "soak" not in getattr(item, "fixturenames", ()):
            continue
        item.add_marker(pytest.mark.soak)
        if long_limit and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(SOAK_TEST_TIMEOUT_S))


# -- pytest-xdist ---------------------------------------------------------------------------------

WHOLE_GROUPS = ("spark/",)
"""Folders whose tests run on one xdist worker together: Spark's session fixture starts a JVM
(about 15 s and 1 GiB), once per worker that runs any of its tests."""


def xdist_scope(nodeid: str) -> str:
    """The unit of work handed to one xdist worker under ``--dist loadfile``: a test file (so a
    module-scoped fixture, e.g. a server shared by a module's tests, starts once), or a whole
    folder of :data:`WHOLE_GROUPS`."""
    path = nodeid.split("::", 1)[0]
    for folder in WHOLE_GROUPS:
        if path.startswith(folder):
            return folder
    return path


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile``, with each folder of :data:`WHOLE_GROUPS` one unit of work."""
    if config.getoption("dist", None) != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class WorkspaceScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_scope(nodeid)

    return WorkspaceScheduling(config, log)


# -- the slow marker ------------------------------------------------------------------------------

UNMARKED_SLOW_S = 2.0
"""A test not marked ``slow`` whose call took this long is named at the end of a ``-m "not slow"``
run (make test-fast): mark it, or bound it, so the inner loop stays fast. The marker's own rule
is one second in all, measured with ``--durations``; the report's threshold is higher, and
counts the call only (a module's first test also pays for its module's fixtures), because a
loaded machine stretches every test."""


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if "not slow" not in (config.option.markexpr or ""):
        return
    slow = sorted(
        (report.duration, report.nodeid)
        for reports in terminalreporter.stats.values()
        for report in reports
        if isinstance(report, pytest.TestReport)
        and report.when == "call"
        and report.duration >= UNMARKED_SLOW_S
    )
    if not slow:
        return
    terminalreporter.write_sep(
        "=", f"tests not marked slow whose call took {UNMARKED_SLOW_S:g} s or more"
    )
    for seconds, nodeid in reversed(slow):
        terminalreporter.write_line(f"{seconds:6.2f}s {nodeid}")
    terminalreporter.write_line(
        "mark them @pytest.mark.slow if they take a second or more when run alone"
    )
