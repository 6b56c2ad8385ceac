"""walstream installs outside a checkout: every dist of the workspace builds a wheel and an sdist
(what ``make dist`` runs), and the built wheels installed into a fresh virtual environment in a
temporary folder, not editable, run ``walstream demo`` and ``walstream conformance --wal memory``
there. Core's extras name every plugin dist, so ``pip install 'walstream[…]'`` reaches each."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
DISTS = sorted(path.parent for path in ROOT.glob("*/pyproject.toml"))


def _run(command: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=900, check=False
    )
    assert done.returncode == 0, (
        f"{' '.join(command)} exited {done.returncode}\nstdout:\n{done.stdout[-4000:]}\n"
        f"stderr:\n{done.stderr[-4000:]}"
    )
    return done.stdout


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every dist's wheel and sdist, built once for this module (as ``make dist`` builds them:
    ``python -m build --no-isolation``)."""
    out = tmp_path_factory.mktemp("dist")
    for dist in DISTS:
        _run(
            [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(dist)], ROOT
        )
    return out


@pytest.fixture(scope="module")
def installed(built: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A fresh virtual environment outside the checkout with ``walstream[conformance]``
    installed from the built wheels; the environment a user's shell would have in it."""
    home = tmp_path_factory.mktemp("user")
    venv = home / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], home)
    env = {
        "PATH": f"{venv / 'bin'}{os.pathsep}/usr/local/bin{os.pathsep}/usr/bin{os.pathsep}/bin",
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "VIRTUAL_ENV": str(venv),
    }
    _run(
        [
            str(venv / "bin" / "pip"),
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--find-links",
            str(built),
            "walstream[conformance]==0.1.0",
        ],
        home,
        {**env, "PIP_CACHE_DIR": os.environ.get("PIP_CACHE_DIR", str(Path.home() / ".cache/pip"))},
    )
    yield {**env, "WORKDIR": str(home)}


def test_every_dist_builds_a_wheel_and_an_sdist(built: Path) -> None:
    names = {path.name for path in built.iterdir()}
    for dist in DISTS:
        project = tomllib.loads((dist / "pyproject.toml").read_text())["project"]
        stem = f"{re.sub(r'[-.]+', '_', project['name'])}-{project['version']}"
        assert f"{stem}-py3-none-any.whl" in names, (dist.name, sorted(names))
        assert f"{stem}.tar.gz" in names, (dist.name, sorted(names))


def _name(requirement: str) -> str:
    return re.split(r"[\[~=<>! ;]", requirement, maxsplit=1)[0]


def test_core_extras_reach_every_plugin_dist() -> None:
    """Every dist of the workspace is a dependency of walstream or of one of its extras, and
    ``walstream[all]`` installs them all (a new dist without an extra fails here)."""
    core = tomllib.loads((ROOT / "core" / "pyproject.toml").read_text())["project"]
    extras: dict[str, list[str]] = core["optional-dependencies"]
    (everything,) = extras["all"]
    chosen = re.fullmatch(r"walstream\[(.*)\]", everything)
    assert chosen is not None, everything
    in_all = {_name(r) for r in core["dependencies"]}
    for extra in chosen.group(1).split(","):
        in_all |= {_name(r) for r in extras[extra.strip()]}
    for dist in DISTS:
        name = tomllib.loads((dist / "pyproject.toml").read_text())["project"]["name"]
        if name != "walstream":
            assert name in in_all, f"walstream[all] does not install {name}: add an extra"


def test_installed_wheels_run_the_demo_and_the_conformance_suite(installed: dict[str, str]) -> None:
    env = dict(installed)
    workdir = Path(env.pop("WORKDIR"))
    python = str(Path(env["VIRTUAL_ENV"]) / "bin" / "python")
    # Installed from wheels into the venv: not editable, not the checkout.
    located = json.loads(
        _run(
            [
                python,
                "-c",
                "import json, walstream, walstream_plugins, walstream_wal_ebs, "
                "walstream_conformance, importlib.metadata as m; "
                "print(json.dumps({'files': [walstream.__file__, walstream_plugins.__file__, "
                "walstream_wal_ebs.__file__, walstream_conformance.__file__], "
                "'direct': m.distribution('walstream').read_text('direct_url.json')}))",
            ],
            workdir,
            env,
        )
    )
    for path in located["files"]:
        assert path.startswith(env["VIRTUAL_ENV"]) and not path.startswith(str(ROOT)), path
    assert located["direct"] is None or '"editable": true' not in located["direct"]

    demo = _run(
        ["walstream", "demo", "--streams", "2", "--records", "2000", "--no-progress"], workdir, env
    )
    assert "verification              OK (4,000 records) / after restart: OK" in demo, demo

    done = subprocess.run(
        ["walstream", "conformance", "--wal", "memory"],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    # 3: nothing failed, but the memory WAL's medium-failure invariant needs a fixture only a
    # backend's own tests define (the summary says so).
    assert done.returncode == 3, done.stdout[-4000:] + done.stderr[-2000:]
    assert "  failed        0" in done.stdout
    assert "needs fixture walstream_wal_medium_fault" in done.stdout


def test_the_spark_wheel_points_spark_workers_at_the_environment_run_without_activation(
    built: Path, tmp_path: Path
) -> None:
    """walstream-spark's wheel ships walstream-spark.pth: a virtual environment's Python run by
    its path (not on PATH, PYSPARK_PYTHON unset) sets PYSPARK_PYTHON to itself at start, so
    Spark's workers find format("walstream") instead of DATA_SOURCE_NOT_FOUND; an activated
    environment or a PYSPARK_PYTHON already set is left alone."""
    (wheel,) = built.glob("walstream_spark-*.whl")
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], tmp_path)
    _run([str(venv / "bin" / "pip"), "install", "--quiet", "--no-deps", str(wheel)], tmp_path)
    python = str(venv / "bin" / "python")
    probe = [python, "-c", "import os; print(os.environ.get('PYSPARK_PYTHON'))"]
    base = {"HOME": str(tmp_path), "LANG": "C.UTF-8"}
    not_activated = _run(probe, tmp_path, {**base, "PATH": "/usr/local/bin:/usr/bin:/bin"})
    assert not_activated.strip() == python
    activated = _run(probe, tmp_path, {**base, "PATH": f"{venv / 'bin'}:/usr/bin:/bin"})
    assert activated.strip() == "None"
    chosen = _run(probe, tmp_path, {**base, "PATH": "/usr/bin:/bin", "PYSPARK_PYTHON": "/opt/py"})
    assert chosen.strip() == "/opt/py"
