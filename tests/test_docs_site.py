"""The documentation site keeps up with the code.

* Every ``docs/…`` page that code, configuration or a docs page names by path exists, and no
  module cites the old outside design ("DESIGN §n") or ARCHITECTURE.md any more.
* The generated reference pages (``tools/docs/reference.py``, added to the site at build time)
  describe everything the code has: every key of every deployment section and installed backend,
  every command and option of ``walstream``, every route of the OpenAPI document, every error.
  The generators walk the code, so these tests fail when a generator starts leaving something
  out (a filter too many, a kind of parser entry it does not walk).

``make docs`` (run by ``make test``) builds the site itself with ``--strict``.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Files whose text may name docs pages: code, tests, configuration, the docs themselves.
SCANNED_SUFFIXES = {".py", ".toml", ".md", ".yml", ".yaml", ".cfg", ".mjs", ".ts"}
SKIPPED_PARTS = {".venv", "node_modules", "build", ".git", "__pycache__", "results"}
DOCS_PATH = re.compile(r"(?<![\w/.-])docs/[\w./-]+?\.md\b")


def repository_files() -> Iterator[Path]:
    for path in ROOT.rglob("*"):
        relative = path.relative_to(ROOT)
        if path.is_file() and path.suffix in SCANNED_SUFFIXES:
            if not SKIPPED_PARTS & set(relative.parts[:-1]):
                yield path


def load_reference() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "walstream_docs_reference", ROOT / "tools" / "docs" / "reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def reference() -> ModuleType:
    return load_reference()


@pytest.mark.slow
def test_every_docs_page_named_by_path_exists() -> None:
    generated = set(load_reference().PAGES)
    missing = []
    cited = 0
    for path in repository_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for found in DOCS_PATH.finditer(text):
            page = found.group(0).removeprefix("docs/")
            cited += 1
            if not (ROOT / "docs" / page).is_file() and page not in generated:
                line = text.count("\n", 0, found.start()) + 1
                missing.append(f"{path.relative_to(ROOT)}:{line}: {found.group(0)}")
    assert cited > 20, "the scan found almost no citations: is the pattern broken?"
    assert not missing, "pages cited but missing:\n" + "\n".join(missing)


@pytest.mark.slow
def test_no_module_cites_the_outside_design_documents() -> None:
    stale = []
    for path in repository_files():
        if path.suffix not in {".py", ".toml"} or path == Path(__file__).resolve():
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if "DESIGN §" in line or "ARCHITECTURE.md" in line:
                stale.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not stale, "cite a docs/architecture/ page instead:\n" + "\n".join(stale)


def test_the_configuration_reference_has_every_key_of_every_section_and_backend(
    reference: ModuleType,
) -> None:
    from walstream.config.engine import CLUSTER_OPTIONS, ENGINE_SECTIONS
    from walstream_plugins.deployment import TOP_LEVEL_KEYS
    from walstream_plugins.registry import installed_backends

    page = reference.configuration_page()
    for key in TOP_LEVEL_KEYS:
        assert f"### `{key}`" in page, key
    for section, options in {**ENGINE_SECTIONS, "cluster": CLUSTER_OPTIONS}.items():
        for option in options:
            assert f"| `{option.name}` |" in page.split(f"### `{section}`", 1)[1], option.name
    from walstream.config.listeners import listener_section_names, load_listener

    for name in listener_section_names():
        section = page.split(f"### `{name}`", 1)[1].split("\n### ", 1)[0]
        for option in load_listener(name).options:
            assert f"| `{option.name}` |" in section, f"{name}.{option.name}"
    backends = installed_backends()
    assert {"ebs", "s3", "s3express", "nvme-quorum", "postgres", "sqlite", "local"} <= {
        backend.name for backend in backends
    }
    for backend in backends:
        heading = f"### `{backend.kind}: {{type: {backend.name}}}`"
        assert heading in page, heading
        section = page.split(heading, 1)[1].split("\n### ", 1)[0]
        for option in backend.options:
            assert f"| `{option.name}` |" in section, f"{backend.name}.{option.name}"


def test_defaults_are_written_as_a_user_writes_them(reference: ModuleType) -> None:
    assert reference.format_size(256 << 20) == "256MiB"
    assert reference.format_size(4096) == "4KiB"
    assert reference.format_size(1000) == "1000"
    assert reference.format_duration(0.25) == "250ms"
    assert reference.format_duration(0.0005) == "500us"
    assert reference.format_duration(30.0) == "30s"
    assert reference.format_duration(600.0) == "10m"
    page = reference.configuration_page()
    assert "| `log_cache_bytes` | size | `256MiB` |" in page
    assert "| `max_interval` | duration | `250ms` |" in page


def _commands(
    parser: argparse.ArgumentParser, prefix: str
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield f"{prefix} {name}".strip(), sub
                yield from _commands(sub, f"{prefix} {name}")


def test_the_cli_reference_has_every_command_and_option(reference: ModuleType) -> None:
    from walstream.cli import build_parser

    page = reference.cli_page()
    commands = list(_commands(build_parser(), ""))
    assert len(commands) > 15
    for name, parser in commands:
        assert f"`walstream {name}`" in page, name
        if parser.get_default("extra_command") is not None:
            continue  # its options come from its own parser, checked below
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
                continue
            for flag in action.option_strings:
                assert f"`{flag}" in page, f"walstream {name} {flag}"
    conformance = reference._extra_command_parser("conformance")
    assert conformance is not None
    for action in conformance._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        for flag in action.option_strings:
            assert f"`{flag}" in page, f"walstream conformance {flag}"


def test_the_http_reference_has_every_route_and_schema(reference: ModuleType) -> None:
    from walstream.server.s2.openapi import document

    page = reference.http_api_page()
    spec = document()
    for path, item in spec["paths"].items():
        for method in ("get", "put", "post", "patch", "delete"):
            if method in item:
                assert f"## `{method.upper()} {path}`" in page, f"{method} {path}"
    for name in spec["components"]["schemas"]:
        assert f"### `{name}`" in page, name


def test_the_error_reference_has_every_error_with_its_answers(reference: ModuleType) -> None:
    import walstream.errors as errors

    page = reference.errors_page()
    for name in errors.__all__:
        assert f"## `{name}`" in page, name
    assert (
        "| [`StreamNotFound`](#streamnotfound) | `WalstreamError`, `LookupError` | no | `404 stream_not_found` | 1 |"
        in page
    )
    assert (
        "| [`ConfigError`](#configerror) | `WalstreamError`, `ValueError` | no | `422 invalid` | 2 |"
        in page
    )
    assert "| [`AmbiguousError`](#ambiguouserror) | `WalstreamError` | **yes** |" in page


def test_a_top_level_key_the_generator_cannot_describe_fails_the_build(
    reference: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    from walstream_plugins import deployment

    monkeypatch.setattr(deployment, "TOP_LEVEL_KEYS", (*deployment.TOP_LEVEL_KEYS, "mqtt"))
    with pytest.raises(RuntimeError, match="'mqtt'"):
        reference.configuration_page()
