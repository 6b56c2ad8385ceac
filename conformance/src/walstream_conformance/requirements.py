"""What a backend declares it can do, and how a test that needs more is skipped.

The suite reads a backend's declared capabilities (``WalCapabilities`` /
``ObjectStoreCapabilities``); a test that needs a capability the backend lacks skips with a
reason naming it, so a run's skip list reads as the backend's feature sheet.

Two kinds of skip, told apart by :func:`skip_kind`:

- **not claimed** (:func:`skip_missing`): the backend declares it lacks the property (a memory
  WAL does not survive its process). Nothing is promised, nothing is left unchecked.
- **not checked** (:func:`skip_unchecked`): the invariant applies to the backend, but this run
  could not test it: the test needs something the run did not provide (a fixture of the
  backend's own tests, a smaller instance). A run with such a skip certifies nothing about
  that invariant, and ``walstream conformance`` says "not certified".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NoReturn

import pytest
from walstream.config import CONTRACT_VERSION
from walstream.objects import ObjectStoreCapabilities
from walstream.wal import WalCapabilities

__all__ = [
    "NOT_CHECKED",
    "NOT_CLAIMED",
    "SUITE_VERSION",
    "ObjectStoreRequirements",
    "WalRequirements",
    "check_version",
    "skip_kind",
    "skip_missing",
    "skip_unchecked",
    "unchecked_need",
]

#: The contract version (``walstream.config.CONTRACT_VERSION``) these tests were written for.
SUITE_VERSION = 1

#: Above this, a test does not allocate a record or fill a WAL of the declared size.
LARGEST_TEST_ALLOCATION_BYTES = 64 << 20


def check_version(contract_version: int = CONTRACT_VERSION) -> None:
    """Fail loudly when the installed core speaks another contract than this suite tests."""
    if contract_version != SUITE_VERSION:
        pytest.fail(
            f"walstream-conformance tests contract version {SUITE_VERSION} but the installed "
            f"walstream core (or the backend) declares contract version {contract_version}; "
            "install matching versions of walstream and walstream-conformance",
            pytrace=False,
        )


NOT_CLAIMED = "not claimed"
NOT_CHECKED = "not checked"
_CLAIM_PREFIX = "needs capability "
_UNCHECKED_PREFIX = "not checked, needs "


def skip_missing(capability: str, detail: str) -> NoReturn:
    """Skip: the backend declares it lacks ``capability`` (not claimed, nothing unchecked)."""
    pytest.skip(f"{_CLAIM_PREFIX}{capability}: {detail}")


def skip_unchecked(need: str, detail: str) -> NoReturn:
    """Skip an invariant that applies to the backend but that this run cannot check: it needs
    ``need`` (a fixture, a smaller instance…), described by ``detail``."""
    pytest.skip(f"{_UNCHECKED_PREFIX}{need}: {detail}")


def skip_kind(reason: str) -> str | None:
    """:data:`NOT_CLAIMED`, :data:`NOT_CHECKED` or None (another skip) for a skip reason."""
    reason = reason.removeprefix("Skipped: ")
    if reason.startswith(_CLAIM_PREFIX):
        return NOT_CLAIMED
    if reason.startswith(_UNCHECKED_PREFIX):
        return NOT_CHECKED
    return None


def unchecked_need(reason: str) -> str:
    """What a "not checked" skip needs (its reason after the prefix)."""
    return reason.removeprefix("Skipped: ").removeprefix(_UNCHECKED_PREFIX)


@dataclass(frozen=True)
class WalRequirements:
    """A WAL's declared capabilities, as the suite asks about them."""

    capabilities: WalCapabilities

    def require(self, name: str) -> None:
        """Skip the running test unless the boolean capability ``name`` is declared true."""
        value: Any = getattr(self.capabilities, name)
        if not value:
            skip_missing(name, f"the backend declares {name}={value!r}")

    def require_bounded_capacity(self) -> int:
        capacity = self.capabilities.capacity_bytes
        if capacity is None:
            skip_missing("capacity_bytes", "the backend declares an unbounded WAL (None)")
        if capacity > LARGEST_TEST_ALLOCATION_BYTES:
            skip_unchecked(
                f"an instance of at most {LARGEST_TEST_ALLOCATION_BYTES >> 20} MiB",
                f"the declared capacity of {capacity} bytes is more than a test fills; "
                "configure a smaller one (--config with capacity: 32MiB, or a factory fixture "
                "that makes one) to test back-pressure",
            )
        return capacity

    def table(self) -> list[tuple[str, str]]:
        caps = self.capabilities
        rows = [
            ("max_record_bytes", str(caps.max_record_bytes)),
            (
                "capacity_bytes",
                "unbounded" if caps.capacity_bytes is None else str(caps.capacity_bytes),
            ),
            ("supports_failover", str(caps.supports_failover)),
            ("survives_process_kill", str(caps.survives_process_kill)),
            ("survives_power_loss", str(caps.survives_power_loss)),
            ("shared_between_processes", str(caps.shared_between_processes)),
        ]
        rows.extend((f"extra.{key}", repr(value)) for key, value in sorted(caps.extra.items()))
        return rows


@dataclass(frozen=True)
class ObjectStoreRequirements:
    capabilities: ObjectStoreCapabilities

    def require(self, name: str) -> None:
        value: Any = getattr(self.capabilities, name)
        if not value:
            skip_missing(name, f"the backend declares {name}={value!r}")

    def table(self) -> list[tuple[str, str]]:
        caps = self.capabilities
        rows = [
            ("conditional_put", str(caps.conditional_put)),
            ("list_page_size", str(caps.list_page_size)),
        ]
        rows.extend((f"extra.{key}", repr(value)) for key, value in sorted(caps.extra.items()))
        return rows
