"""What a run certified: every invariant that passed, failed, is not claimed by the backend, or
was not checked (and what checking it needs).

:class:`Certification` is a pytest plugin. ``walstream conformance`` registers one and prints its
summary; ``pytest --walstream-certify`` (the suite's pytest plugin) registers one too and adds
the summary to pytest's report. The verdict:

- **certified**: every invariant of the chosen suites ran and passed, except those the backend
  declares it lacks (not claimed);
- **not certified**: nothing failed, but an invariant that applies to the backend was skipped
  because the run could not check it (a fixture only the backend's own tests can define, a
  smaller instance) — :data:`EXIT_NOT_CERTIFIED` from ``walstream conformance``;
- **failed**: a test failed or errored.

A run narrowed with ``-k`` certifies nothing beyond what it ran: its verdict is that of the tests
it selected, and the summary says it was partial.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import pytest

from .requirements import NOT_CHECKED, NOT_CLAIMED, skip_kind, unchecked_need

__all__ = [
    "EXIT_FAILED",
    "EXIT_NOT_CERTIFIED",
    "EXIT_OK",
    "EXIT_USAGE",
    "Certification",
    "Unchecked",
]

EXIT_OK = 0
"""``walstream conformance``: certified (or, with ``-k``, every selected test passed)."""
EXIT_FAILED = 1
"""A test failed or errored (or pytest itself failed)."""
EXIT_USAGE = 2
"""Bad options, or a backend that cannot be built."""
EXIT_NOT_CERTIFIED = 3
"""Nothing failed, but an invariant that applies to the backend was not checked."""


@dataclass(frozen=True)
class Unchecked:
    """An invariant a run did not check."""

    test: str
    """The test's name (``test_acked_recovered_after_power_loss``)."""
    invariant: str
    """The invariant, as the first line of the test's docstring states it."""
    need: str
    """What checking it needs (``fixture walstream_wal_power_loss: a medium that …``)."""


@dataclass
class Certification:
    """Collects outcomes (see the module docstring)."""

    partial: bool = False
    """The run was narrowed (``-k``): it certifies only what it selected."""
    suites_not_run: list[str] = field(default_factory=list)
    """Suites of backend kinds the run did not choose (named in the summary)."""
    notes: list[str] = field(default_factory=list)
    """Lines shown just before the verdict (``JUnit XML written to …``)."""
    only_summary: bool = False
    """Replace pytest's own closing line ("13 passed, 3 skipped in 0.4s") by this summary, so
    that a run reports its result once (``walstream conformance``)."""
    passed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    not_claimed: Counter[str] = field(default_factory=Counter)
    """Skip reason of a capability the backend declares it lacks → tests."""
    unchecked: list[Unchecked] = field(default_factory=list)
    other_skips: Counter[str] = field(default_factory=Counter)
    _invariants: dict[str, tuple[str, str]] = field(default_factory=dict)

    # -- pytest hooks -------------------------------------------------------------------------

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if self.only_summary and reporter is not None:
            reporter.summary_stats = lambda: None

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            doc = getattr(getattr(item, "obj", None), "__doc__", None) or ""
            first = " ".join(doc.strip().split("\n\n")[0].split()) if doc else ""
            self._invariants[item.nodeid] = (item.name, first)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        name, invariant = self._invariants.get(
            report.nodeid, (report.nodeid.rsplit("::", 1)[-1], "")
        )
        if report.when == "call" and report.passed:
            self.passed.append(name)
        elif report.failed:
            self.failed.append(f"{name} ({report.when})")
        elif report.skipped and report.when in ("setup", "call"):
            reason = (
                str(report.longrepr[2])
                if isinstance(report.longrepr, tuple)
                else str(report.longrepr)
            ).removeprefix("Skipped: ")
            kind = skip_kind(reason)
            if kind == NOT_CHECKED:
                self.unchecked.append(Unchecked(name, invariant, unchecked_need(reason)))
            elif kind == NOT_CLAIMED:
                self.not_claimed[reason] += 1
            else:
                self.other_skips[reason] += 1

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        terminalreporter.write_line("")
        for line in self.lines():
            terminalreporter.write_line(line)

    # -- the verdict --------------------------------------------------------------------------

    @property
    def verdict(self) -> str:
        if self.failed or not self.passed:
            return "FAILED" if self.failed else "NOTHING RAN"
        if self.unchecked:
            return "NOT CERTIFIED"
        return "PASSED (partial run: -k)" if self.partial else "CERTIFIED"

    @property
    def exit_code(self) -> int:
        if self.failed or not self.passed:
            return EXIT_FAILED
        return EXIT_NOT_CERTIFIED if self.unchecked else EXIT_OK

    def lines(self) -> list[str]:
        """The summary, one line each: counts, failures, what was not checked and why, what
        the backend does not claim, the verdict."""
        lines = ["walstream conformance summary", "-----------------------------"]
        lines.append(f"  passed        {len(self.passed)}")
        lines.append(f"  failed        {len(self.failed)}")
        lines.append(f"  not checked   {len(self.unchecked)}")
        lines.append(f"  not claimed   {sum(self.not_claimed.values())}")
        if self.other_skips:
            lines.append(f"  other skips   {sum(self.other_skips.values())}")
        for test in self.failed:
            lines.append(f"  FAILED        {test}")
        if self.unchecked:
            lines.append("")
            lines.append("Invariants this run did not check (each needs what follows it):")
            for item in self.unchecked:
                invariant = f": {item.invariant}" if item.invariant else ""
                lines.append(f"  - {item.test}{invariant}")
                lines.append(f"      needs {item.need}")
        if self.not_claimed:
            lines.append("")
            lines.append("Not claimed by the backend (its declared capabilities):")
            for reason, count in sorted(self.not_claimed.items()):
                lines.append(f"  - {count} x {reason}")
        if self.other_skips:
            lines.append("")
            lines.append("Other skips:")
            for reason, count in sorted(self.other_skips.items()):
                lines.append(f"  - {count} x {reason}")
        if self.suites_not_run:
            lines.append("")
            lines.append(f"Suites not run: {'; '.join(self.suites_not_run)}")
        if self.notes:
            lines.append("")
            lines.extend(self.notes)
        lines.append("")
        lines.append(self.verdict)
        return lines
