"""Fixtures of the plugin host tests.

``third_party_dist`` installs a real distribution for the duration of one test without pip: it
writes a module and a ``*.dist-info`` folder (METADATA + entry_points.txt) into a temporary
folder and puts that folder on ``sys.path`` — exactly what an installed wheel looks like to
``importlib.metadata`` and stevedore.
"""

from __future__ import annotations

import importlib
import itertools
import sys
import textwrap
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest
import stevedore._cache
from walstream_plugins import registry

_dist_counter = itertools.count()

MakeDist = Callable[..., str]


@pytest.fixture
def third_party_dist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[MakeDist]:
    """``make(dist_name, version, modules={name: source}, entry_points={group: {name: target}})``
    installs a dist; returns the unique suffix appended to module names (``{suffix}`` in the
    sources and targets is replaced by it, so modules never collide across tests)."""
    site = tmp_path / "site"
    site.mkdir()
    # Keep stevedore's on-disk entry-point cache out of it: these dists vanish after the test.
    monkeypatch.setattr(stevedore._cache._c, "_disable_caching", True, raising=False)
    monkeypatch.syspath_prepend(str(site))
    imported: list[str] = []

    def make(
        dist_name: str,
        version: str = "1.0.0",
        *,
        modules: Mapping[str, str] | None = None,
        entry_points: Mapping[str, Mapping[str, str]] | None = None,
    ) -> str:
        suffix = f"_{next(_dist_counter)}_{tmp_path.name[-8:]}".replace("-", "_")
        for module_name, source in (modules or {}).items():
            real_name = module_name.replace("{suffix}", suffix)
            imported.append(real_name)
            (site / f"{real_name}.py").write_text(
                textwrap.dedent(source).replace("{suffix}", suffix)
            )
        dist_info = site / f"{dist_name.replace('-', '_')}-{version}.dist-info"
        dist_info.mkdir()
        (dist_info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {dist_name}\nVersion: {version}\n"
        )
        lines = []
        for group, names in (entry_points or {}).items():
            lines.append(f"[{group}]")
            lines.extend(
                f"{name} = {target.replace('{suffix}', suffix)}" for name, target in names.items()
            )
            lines.append("")
        (dist_info / "entry_points.txt").write_text("\n".join(lines))
        importlib.invalidate_caches()
        registry.refresh()
        return suffix

    yield make
    for module_name in imported:
        sys.modules.pop(module_name, None)
    registry.refresh()


@pytest.fixture
def write_yaml(tmp_path: Path) -> Callable[[str, str], Path]:
    """Write a deployment file (dedented) under ``tmp_path`` and return its path."""

    def write(text: str, name: str = "deploy.yaml") -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
        return path

    return write
