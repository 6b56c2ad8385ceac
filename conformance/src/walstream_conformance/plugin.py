"""The pytest plugin (entry point group ``pytest11``): command-line options and default fixtures.

``pytest --walstream-wal=NAME [--walstream-wal-config=FILE]`` (likewise ``--walstream-object-store``
and ``--walstream-metadata``) runs the suites against installed backends. Without a config file,
each test gets a throwaway instance from the backend factory's ``provision`` hook; with one, each
test gets a fresh medium derived from it (``backends.isolated_section``: a new key prefix, log id,
volume name or sibling file), so no test meets a WAL that another test or run left claimed.

A backend's own test module overrides ``walstream_wal_factory`` (and friends) instead.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from walstream.config import CONTRACT_VERSION
from walstream.metadata import MetadataStore
from walstream.objects import ObjectStore
from walstream.wal import WriteAheadLog

from .backends import BackendSpec, backend_options
from .certification import Certification
from .requirements import SUITE_VERSION
from .suites.wal import WalKit

SELECTED_SUITES = Path(__file__).with_name("selected.py")
CERTIFICATION_PLUGIN = "walstream-certification"
"""The name a :class:`~.certification.Certification` is registered under (one per run)."""
DEFAULT_CRASH_CYCLES = 4


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("walstream", "walstream conformance suite")
    for kind, label in (
        ("wal", "WAL"),
        ("object-store", "object store"),
        ("metadata", "metadata store"),
    ):
        group.addoption(
            f"--walstream-{kind}",
            metavar="NAME",
            default=None,
            help=f"run the {label} suite against the installed backend NAME (entry point name)",
        )
        group.addoption(
            f"--walstream-{kind}-config",
            metavar="FILE",
            default=None,
            help=f"YAML options of the {label} backend (default: its provisioning hook)",
        )
    group.addoption(
        "--walstream-crash-cycles",
        type=int,
        default=None,
        help=f"kill/recover cycles of the crash harness (default {DEFAULT_CRASH_CYCLES}, "
        "more with --soak)",
    )
    group.addoption(
        "--walstream-seed",
        type=int,
        default=None,
        help="seed of the crash harness and fault schedules (a failure prints the seed to replay)",
    )
    group.addoption(
        "--walstream-hints",
        choices=("pytest", "cli"),
        default="pytest",
        help="which options skip reasons cite: pytest's --walstream-* (default) or those of "
        "`walstream conformance` (which passes cli)",
    )
    group.addoption(
        "--walstream-certify",
        action="store_true",
        default=False,
        help="end with the certification summary: every invariant not checked and what "
        "checking it needs (walstream conformance prints it always)",
    )
    group.addoption(
        "--walstream-epoch-base",
        type=int,
        default=0,
        help="first node epoch the WAL tests use (raise it for a configured WAL that cannot be "
        "derived afresh per test, such as a block device, and remembers earlier runs' epochs)",
    )


def pytest_configure(config: pytest.Config) -> None:
    # The crash harness and the capacity test take seconds on any backend: ``-m "not slow"``
    # leaves them out of a quick run.
    config.addinivalue_line("markers", "slow: takes seconds; -m 'not slow' leaves it out")
    if CONTRACT_VERSION != SUITE_VERSION:
        config.issue_config_time_warning(
            pytest.PytestConfigWarning(
                f"walstream-conformance {SUITE_VERSION} tests contract {SUITE_VERSION}, "
                f"installed walstream declares {CONTRACT_VERSION}"
            ),
            stacklevel=2,
        )
    selected = any(
        config.getoption(f"--walstream-{kind}") for kind in ("wal", "object-store", "metadata")
    )
    if selected and not any(
        arg.partition("::")[0] == str(SELECTED_SUITES) for arg in config.args
    ):
        # Run the whole suite against the chosen backends even when no test path was given.
        invocation = Path(str(config.invocation_params.dir))
        args = [arg for arg in config.args if Path(arg).resolve() != invocation.resolve()]
        config.args[:] = [*args, str(SELECTED_SUITES)]
    if config.getoption("--walstream-certify") and not config.pluginmanager.has_plugin(
        CERTIFICATION_PLUGIN
    ):
        config.pluginmanager.register(
            Certification(partial=bool(config.getoption("keyword"))), CERTIFICATION_PLUGIN
        )


_CLI_OPTIONS = {"wal": "--wal", "object-store": "--object-store", "metadata": "--metadata"}


def _no_backend(request: pytest.FixtureRequest, kind: str, label: str, fixture: str) -> str:
    """The skip reason of a suite with no backend chosen, citing the options of the way the
    suite was run (``walstream conformance`` or pytest)."""
    if request.config.getoption("--walstream-hints") == "cli":
        return f"no {label} to test: add {_CLI_OPTIONS[kind]} NAME to walstream conformance"
    return f"no {label} to test: pass --walstream-{kind}=NAME or define {fixture}"


def _config_path(request: pytest.FixtureRequest, kind: str) -> Path | None:
    value = request.config.getoption(f"--walstream-{kind}-config")
    return Path(value).resolve() if value else None


@pytest.fixture
def walstream_seed(request: pytest.FixtureRequest) -> int:
    """The seed of this run's random choices; ``--walstream-seed`` replays a failure."""
    value = request.config.getoption("--walstream-seed")
    if value is None:
        value = int(os.environ.get("WALSTREAM_SEED", "0")) or 20240601
    return int(value)


@pytest.fixture
def walstream_crash_cycles(request: pytest.FixtureRequest) -> int:
    value = request.config.getoption("--walstream-crash-cycles")
    if value is not None:
        return int(value)
    soak = bool(request.config.getoption("--soak", default=False))
    return 200 if soak else DEFAULT_CRASH_CYCLES


# -- WAL ------------------------------------------------------------------------------------------


@pytest.fixture
def walstream_wal_spec(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BackendSpec | None]:
    """How to build the WAL under test in any process (``None``: not known)."""
    name = request.config.getoption("--walstream-wal")
    if not name:
        yield None
        return
    with backend_options(
        "wal", name, _config_path(request, "wal"), tmp_path_factory.mktemp("wal")
    ) as spec:
        yield spec


@pytest.fixture
def walstream_wal_factory(
    request: pytest.FixtureRequest, walstream_wal_spec: BackendSpec | None
) -> Callable[[], WriteAheadLog]:
    """A callable making a new WAL instance on this test's medium. Override it in a backend's
    tests; the default builds the backend chosen with ``--walstream-wal``."""
    spec = walstream_wal_spec
    if spec is None:
        pytest.skip(_no_backend(request, "wal", "WAL", "walstream_wal_factory"))

    def make() -> WriteAheadLog:
        wal: WriteAheadLog = spec.build()
        return wal

    return make


@pytest.fixture
def walstream_wal_power_loss() -> Callable[[], None] | None:
    """Override to enable the power-loss test: drop every write not yet synced."""
    return None


@pytest.fixture
def walstream_wal_medium_fault() -> Callable[[bool], None] | None:
    """Override to enable the medium-failure test: ``fault(True)`` breaks the medium,
    ``fault(False)`` heals it."""
    return None


@pytest_asyncio.fixture
async def walstream_wal_kit(
    request: pytest.FixtureRequest,
    walstream_wal_factory: Callable[[], WriteAheadLog],
    walstream_wal_spec: BackendSpec | None,
    walstream_wal_power_loss: Callable[[], None] | None,
    walstream_wal_medium_fault: Callable[[bool], None] | None,
    walstream_crash_cycles: int,
    walstream_seed: int,
) -> AsyncIterator[WalKit]:
    kit = WalKit(
        factory=walstream_wal_factory,
        spec=walstream_wal_spec,
        power_loss=walstream_wal_power_loss,
        medium_fault=walstream_wal_medium_fault,
        crash_cycles=walstream_crash_cycles,
        seed=walstream_seed,
        epoch_base=int(request.config.getoption("--walstream-epoch-base")),
    )
    try:
        yield kit
    finally:
        await kit.aclose()


# -- object store ---------------------------------------------------------------------------------


@pytest_asyncio.fixture
async def walstream_object_store(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[ObjectStore]:
    """The object store under test. Override it in a backend's tests; the default builds the
    backend chosen with ``--walstream-object-store``."""
    name = request.config.getoption("--walstream-object-store")
    if not name:
        pytest.skip(_no_backend(request, "object-store", "object store", "walstream_object_store"))
    scratch = tmp_path_factory.mktemp("objects")
    with backend_options(
        "object_store", name, _config_path(request, "object-store"), scratch
    ) as spec:
        store: ObjectStore = spec.build()
        try:
            yield store
        finally:
            await store.close()


# -- metadata -------------------------------------------------------------------------------------


@pytest.fixture
def walstream_metadata_factory(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[], MetadataStore]]:
    """A callable making a new metadata-store instance on this test's database. Override it in
    a backend's tests; the default builds the backend chosen with ``--walstream-metadata``."""
    name = request.config.getoption("--walstream-metadata")
    if not name:
        pytest.skip(
            _no_backend(request, "metadata", "metadata store", "walstream_metadata_factory")
        )
    scratch = tmp_path_factory.mktemp("metadata")
    with backend_options("metadata", name, _config_path(request, "metadata"), scratch) as spec:

        def make() -> MetadataStore:
            store: MetadataStore = spec.build()
            return store

        yield make

