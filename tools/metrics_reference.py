"""The metrics reference, ``docs/reference/metrics.md``, generated from what ``/metrics`` exports.

It starts a real ``walstream serve`` (a throwaway deployment with a ``cluster:`` section, so the
cluster families are exported too), makes it do one of everything that labels a metric (create
a stream, append, upload and commit, read), scrapes ``GET /metrics`` and writes one row per
metric family: name, type, labels (the label names its samples carry) and help text. The
exposition is the source of truth, so the page cannot drift from the code: the test
``tests/test_operations.py`` regenerates it and fails when the committed page differs, and checks
the alert rules and the dashboard against the same scrape.

    python tools/metrics_reference.py            # rewrite docs/reference/metrics.md
    python tools/metrics_reference.py --check    # exit 1 when the page is stale
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["PAGE", "Family", "main", "parse_exposition", "render", "scrape"]

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "reference" / "metrics.md"
START_TIMEOUT_S = 120.0
SETTLE_TIMEOUT_S = 120.0


@dataclass
class Family:
    """One metric family of the exposition."""

    name: str
    type: str
    help: str
    labels: set[str] = field(default_factory=set)
    """Label names its samples carry (``le`` of a histogram's buckets excluded)."""


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="(?:[^"\\]|\\.)*"')


def parse_exposition(text: str) -> dict[str, Family]:
    """The families of a Prometheus text exposition, by the name its ``# TYPE`` line gives."""
    families: dict[str, Family] = {}
    helps: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, help_text = line[len("# HELP ") :].partition(" ")
            helps[name] = help_text.replace("\\n", " ").replace("\\\\", "\\")
        elif line.startswith("# TYPE "):
            name, _, kind = line[len("# TYPE ") :].partition(" ")
            families[name] = Family(name, kind.strip(), helps.get(name, ""))
        elif line and not line.startswith("#"):
            match = _SAMPLE.match(line)
            if match is None:
                continue
            sample = match.group(1)
            family = families.get(sample) or families.get(
                re.sub(r"_(bucket|sum|count|created)$", "", sample)
            )
            if family is not None and match.group(3):
                family.labels |= {name for name in _LABEL.findall(match.group(3)) if name != "le"}
    return families


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _walstream() -> str:
    return shutil.which("walstream", path=str(Path(sys.executable).parent)) or "walstream"


def _call(url: str, method: str = "GET", body: object = None) -> bytes:
    request = urllib.request.Request(
        url,
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"s2-basin": "walstream", "Content-Type": "application/json"},
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=30) as answer:
        return bytes(answer.read())


@contextmanager
def serving() -> Iterator[str]:
    """A ``walstream serve`` of a throwaway deployment (memory WAL, local objects, SQLite, a
    ``cluster:`` section); yields its URL and stops it (SIGTERM) afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="walstream-metrics-"))
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    (folder / "deploy.yaml").write_text(
        f"node: {{id: 1, advertise: '{url}'}}\n"
        "wal: {type: memory, name: metrics-reference}\n"
        "object_store: {type: local, root: data/objects}\n"
        "metadata: {type: sqlite, path: data/meta.db}\n"
        "upload: {max_interval: 20ms}\n"
        "cluster: {}\n"
    )
    process = subprocess.Popen(
        [_walstream(), "--config", "deploy.yaml", "serve", "--listen", f"127.0.0.1:{port}"],
        cwd=folder,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "WALSTREAM_TOKEN": ""},
    )
    try:
        assert process.stdout is not None
        # Log lines (a warning about the cluster secret) may come before the banner; the
        # output ends only if the server exits.
        seen: list[str] = []
        for line in process.stdout:
            seen.append(line)
            if "listening on" in line:
                break
        else:
            raise RuntimeError(f"walstream serve did not start: {''.join(seen)}")
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(folder, ignore_errors=True)


def scrape() -> str:
    """``/metrics`` of a server that has created a stream, appended, uploaded and committed,
    and served reads: every family is present, with the labels of its samples."""
    with serving() as url:
        _call(f"{url}/v1/streams", "POST", {"stream": "metrics"})
        _call(f"{url}/v1/streams/metrics/records", "POST", {"records": [{"body": "x"}]})
        _call(f"{url}/v1/streams/metrics/records?seq_num=0")  # from the hot tail
        # Wait for the upload and commit (upload.max_interval is 20 ms), then read again.
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        text = _call(f"{url}/metrics").decode()
        while "walstream_object_commits_total 0.0" in text and time.monotonic() < deadline:
            time.sleep(0.05)
            text = _call(f"{url}/metrics").decode()
        _call(f"{url}/v1/streams/metrics/records?seq_num=0")
        return _call(f"{url}/metrics").decode()


def _cell(text: str) -> str:
    return text.replace("|", "\\|").strip()


def render(families: dict[str, Family]) -> str:
    """The Markdown page."""
    lines = [
        "# Metrics reference",
        "",
        "<!-- generated by tools/metrics_reference.py from what GET /metrics exports: do not "
        "edit; run `python tools/metrics_reference.py` after changing a metric -->",
        "",
        "Every metric family `walstream serve` exports at `GET /metrics` (Prometheus text "
        "format 0.0.4), generated from a scrape of a running server, so this list is what the "
        "code exports. Counters and gauges are per process, that is per node: sum them over "
        "nodes in queries. The `walstream_cluster_*` families exist only on a node with a "
        "`cluster:` section. A histogram is exported as `NAME_bucket{le}`, `NAME_sum` and "
        "`NAME_count`. A labelled family has a sample per label value it has seen (none before "
        "the first).",
        "",
        "`hooks.disable: [metrics]` in the deployment turns the engine metrics off; "
        "`/metrics` then answers 404. The alert rules in `deploy/prometheus/` and the "
        "dashboard in `deploy/grafana/` use only these names (a test checks it): see "
        "[Monitoring](../operations/monitoring.md).",
        "",
        "| metric | type | labels | description |",
        "|---|---|---|---|",
    ]
    for name in sorted(families):
        family = families[name]
        labels = ", ".join(f"`{label}`" for label in sorted(family.labels)) or "-"
        lines.append(f"| `{name}` | {family.type} | {labels} | {_cell(family.help)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--check", action="store_true", help="exit 1 when the page differs from the code"
    )
    args = parser.parse_args(argv)
    page = render(parse_exposition(scrape()))
    if args.check:
        if not PAGE.exists() or PAGE.read_text() != page:
            print(f"{PAGE} is stale: run python tools/metrics_reference.py", file=sys.stderr)
            return 1
        print(f"{PAGE} is up to date")
        return 0
    PAGE.parent.mkdir(parents=True, exist_ok=True)
    PAGE.write_text(page)
    print(f"wrote {PAGE} ({len(page.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
