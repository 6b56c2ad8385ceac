"""What a backend declares it can do, and how a test that needs more is skipped.

The suite reads a backend's declared capabilities (``WalCapabilities`` /
``ObjectStoreCapabilities``); a test that needs a capability the backend lacks skips with a
reason naming it, so a run's skip list reads as the backend's feature sheet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NoReturn

import pytest
from walstream.config import CONTRACT_VERSION
from walstream.objects import ObjectStoreCapabilities
from walstream.wal import WalCapabilities

__all__ = [
    "SUITE_VERSION",
    "ObjectStoreRequirements",
    "WalRequirements",
    "check_version",
    "skip_missing",
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


def skip_missing(capability: str, detail: str) -> NoReturn:
    pytest.skip(f"needs capability {capability}: {detail}")


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
            skip_missing(
                "capacity_bytes",
                f"declared capacity {capacity} bytes is above the {LARGEST_TEST_ALLOCATION_BYTES} "
                "bytes a test fills; provision a smaller instance to test back-pressure",
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
