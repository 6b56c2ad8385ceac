"""What an operator runs walstream with, checked against walstream itself:

- the metrics reference (``docs/reference/metrics.md``) is what ``/metrics`` of a running server
  exports (regenerated from a scrape; stale: the test fails and says how to regenerate);
- the Prometheus alert rules, their unit tests, the example Prometheus configuration and the
  Grafana dashboard name only metrics and labels that ``/metrics`` exports, and pass ``promtool``
  (Debian's ``prometheus`` package, which ``make install`` installs);
- the systemd unit passes ``systemd-analyze verify``, and stopping what it starts the way systemd
  stops it (its KillSignal, within its TimeoutStopSec) drains the node: exit status 0 and every
  acknowledged record committed, with a WAL in memory that would lose what a drain does not
  upload.
"""

from __future__ import annotations

import configparser
import importlib.util
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
ALERTS = DEPLOY / "prometheus" / "walstream-alerts.yml"
ALERT_TESTS = DEPLOY / "prometheus" / "walstream-alerts.test.yml"
PROMETHEUS_CONFIG = DEPLOY / "prometheus" / "prometheus.yml"
DASHBOARD = DEPLOY / "grafana" / "walstream.json"
UNIT = DEPLOY / "systemd" / "walstream.service"
WALSTREAM = shutil.which("walstream", path=str(Path(sys.executable).parent)) or "walstream"

PROMETHEUS_NAMES = {"up"}
"""Series Prometheus itself makes, which the rules may use."""
TARGET_LABELS = {"job", "instance"}
"""Labels Prometheus adds to every scraped series."""


def _load_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "metrics_reference", ROOT / "tools" / "metrics_reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclasses look their module up there)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tool() -> ModuleType:
    return _load_tool()


@pytest.fixture(scope="module")
def exported(tool: ModuleType) -> dict[str, Any]:
    """The families ``/metrics`` of a running ``walstream serve`` exports (one scrape)."""
    families: dict[str, Any] = tool.parse_exposition(tool.scrape())
    return families


def _promtool() -> str:
    found = shutil.which("promtool")
    assert found, "promtool not found: install Debian's prometheus package (make install does)"
    return found


# -- the operations pages -------------------------------------------------------------------------


def test_the_deployments_of_the_operations_pages_load() -> None:
    """Every ``yaml`` block of docs/operations is a deployment the loader accepts."""
    from walstream.config.host import find_host

    host = find_host("the operations pages' deployments")
    blocks = [
        (page.name, block)
        for page in sorted((ROOT / "docs" / "operations").glob("*.md"))
        for block in re.findall(r"^```yaml\n(.*?)^```", page.read_text(), flags=re.S | re.M)
    ]
    assert blocks
    for name, block in blocks:
        deployment = host.load_deployment(yaml.safe_load(block))
        assert deployment.node_id >= 1, name


def test_the_format_table_of_the_upgrade_notes_is_what_the_code_writes_and_reads() -> None:
    """docs/operations/upgrades.md names the version each format is written in; a change of a
    written version in the code fails here until the table (and its upgrade advice) follows."""
    from walstream.format import object as object_format
    from walstream.format.batch import BATCH_MAGIC
    from walstream.metadata.sqlite import SCHEMA_VERSION as SQLITE_SCHEMA
    from walstream_metadata_postgres import SCHEMA_VERSION as POSTGRES_SCHEMA
    from walstream_wal_ebs import layout as ebs
    from walstream_wal_s3 import layout as s3

    rows = {}
    page = (ROOT / "docs" / "operations" / "upgrades.md").read_text()
    for line in page.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 5 and cells[2][:1].isdigit():
            rows[cells[0]] = (cells[2], cells[3])

    def numbers(text: str) -> list[int]:
        return [int(number) for number in re.findall(r"(?<![x\w])\d+", text)]

    written = {
        "object": object_format.FORMAT_VERSION,
        "batch": BATCH_MAGIC & 0x0F,
        "ebs WAL header": ebs.FORMAT_VERSION,
        "s3 WAL object": s3.FORMAT_VERSION,
        "SQLite metadata schema": SQLITE_SCHEMA,
        "PostgreSQL metadata schema": POSTGRES_SCHEMA,
    }
    for name, version in written.items():
        assert name in rows, f"upgrades.md has no row {name!r}"
        assert numbers(rows[name][0])[:1] == [version], (name, rows[name], version)
    assert numbers(rows["object"][1]) == [
        object_format.LEGACY_FORMAT_VERSION,
        object_format.IDENTITY_FORMAT_VERSION,
        object_format.FORMAT_VERSION,
    ]
    assert numbers(rows["ebs WAL header"][1]) == list(ebs.READABLE_VERSIONS)


# -- the metrics reference ----------------------------------------------------------------------


def test_the_metrics_reference_is_what_metrics_exports(
    tool: ModuleType, exported: dict[str, Any]
) -> None:
    page = tool.render(exported)
    committed = tool.PAGE.read_text() if tool.PAGE.exists() else ""
    assert committed == page, (
        "docs/reference/metrics.md differs from what /metrics exports: run "
        "`python tools/metrics_reference.py` and commit the page"
    )
    # The scrape saw the families of every source: the engine hooks, the cluster and HTTP.
    for name in (
        "walstream_wal_append_latency_seconds",
        "walstream_cluster_lease_remaining_seconds",
        "walstream_http_requests_total",
    ):
        assert name in exported


# -- alert rules, Prometheus configuration, dashboard -------------------------------------------

_METRIC = re.compile(
    r"(?<![\w:$])([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?=\{|\[|\)|$|\s(?:[<>=!]|and|or|unless|/|\*|\+|-))"
)
_SELECTOR = re.compile(r"\b(walstream_[a-z0-9_]+|up)\s*\{([^}]*)\}")
_MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)")


def _alert_expressions() -> list[str]:
    document = yaml.safe_load(ALERTS.read_text())
    return [str(rule["expr"]) for group in document["groups"] for rule in group["rules"]]


def _alert_test_series() -> list[str]:
    document = yaml.safe_load(ALERT_TESTS.read_text())
    return [series["series"] for test in document["tests"] for series in test["input_series"]]


def _dashboard_expressions() -> list[str]:
    document = json.loads(DASHBOARD.read_text())
    expressions = [
        target["expr"]
        for panel in document["panels"]
        for target in panel.get("targets", [])
        if target.get("expr")
    ]
    for variable in document["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            query = query.get("query")
        if isinstance(query, str) and query.startswith("label_values("):
            expressions.append(query.removeprefix("label_values(").split(",")[0])
    return expressions


def _family_of(name: str, exported: dict[str, Any]) -> Any:
    if name in exported:
        return exported[name]
    base = re.sub(r"_(bucket|sum|count)$", "", name)
    family = exported.get(base)
    if family is not None and family.type == "histogram":
        return family
    return None


def _check_names(expression: str, exported: dict[str, Any], where: str) -> list[str]:
    """What is wrong with the metric and label names of one expression."""
    problems = []
    names = set(re.findall(r"\bwalstream_[a-z0-9_]+\b", expression))
    for name in sorted(names):
        if _family_of(name, exported) is None:
            problems.append(f"{where}: {name} is not exported by /metrics")
    families = [_family_of(name, exported) for name in names]
    known_labels = set(TARGET_LABELS) | {"le"}
    for family in families:
        if family is not None:
            known_labels |= family.labels
    for name, matchers in _SELECTOR.findall(expression):
        family = _family_of(name, exported)
        labels = (family.labels if family is not None else set()) | TARGET_LABELS | {"le"}
        for label in _MATCHER.findall(matchers):
            if label not in labels:
                problems.append(f"{where}: {name} has no label {label!r}")
    for grouping in _GROUPING.findall(expression):
        for label in (part.strip() for part in grouping.split(",")):
            if label and label not in known_labels:
                problems.append(f"{where}: no metric of {expression!r} has the label {label!r}")
    return problems


def test_alerts_and_dashboard_name_only_exported_metrics_and_labels(
    exported: dict[str, Any],
) -> None:
    problems: list[str] = []
    checked = 0
    for where, expressions in (
        (ALERTS.name, _alert_expressions()),
        (ALERT_TESTS.name, _alert_test_series()),
        (DASHBOARD.name, _dashboard_expressions()),
    ):
        for expression in expressions:
            problems += _check_names(expression, exported, where)
            checked += len(re.findall(r"\bwalstream_[a-z0-9_]+\b", expression))
            other = set(re.findall(r"\b([a-z_]+)\s*\{", expression)) - PROMETHEUS_NAMES
            problems += [
                f"{where}: {name} is neither a walstream metric nor Prometheus' own"
                for name in sorted(other)
                if not name.startswith("walstream_")
            ]
    assert checked > 40  # every rule and panel names walstream metrics
    assert not problems, "\n".join(problems)


def test_a_renamed_metric_is_caught(exported: dict[str, Any]) -> None:
    """The check above fails on drift: a rule naming a metric /metrics no longer exports, or a
    label its family does not carry."""
    assert _check_names("rate(walstream_wal_appended_rows_total[5m]) > 0", exported, "x")
    assert _check_names('walstream_reads_total{origin="cache"}', exported, "x")
    assert _check_names("sum by (shard) (rate(walstream_reads_total[5m]))", exported, "x")
    assert not _check_names("sum by (source) (rate(walstream_reads_total[5m]))", exported, "x")


def test_alert_rules_pass_promtool_and_their_unit_tests() -> None:
    promtool = _promtool()
    for command in (["check", "rules", str(ALERTS)], ["test", "rules", str(ALERT_TESTS)]):
        done = subprocess.run(
            [promtool, *command], capture_output=True, text=True, timeout=120, cwd=ALERTS.parent
        )
        assert done.returncode == 0, f"promtool {' '.join(command)}:\n{done.stdout}{done.stderr}"


def test_the_prometheus_configuration_passes_promtool(tmp_path: Path) -> None:
    token = tmp_path / "walstream-token"
    token.write_text("s3cret\n")
    shutil.copy(ALERTS, tmp_path / ALERTS.name)
    (tmp_path / "prometheus.yml").write_text(
        PROMETHEUS_CONFIG.read_text().replace("/etc/prometheus/walstream-token", str(token))
    )
    done = subprocess.run(
        [_promtool(), "check", "config", "prometheus.yml"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 9 rules found" in done.stdout


def test_dashboard_queries_are_valid_promql(tmp_path: Path) -> None:
    """Each dashboard query, with Grafana's variables given values, parses as PromQL (promtool
    checks them as recording rules)."""
    rules = [
        {
            "record": f"walstream:dashboard_query_{index}",
            "expr": expression.replace("$__rate_interval", "5m").replace("$instance", ".*"),
        }
        for index, expression in enumerate(_dashboard_expressions())
    ]
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = subprocess.run(
        [_promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules)} rules found" in done.stdout


# -- systemd ------------------------------------------------------------------------------------


def _unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(UNIT.read_text())
    return parser


def test_the_systemd_unit_verifies(tmp_path: Path) -> None:
    systemd_analyze = shutil.which("systemd-analyze")
    assert systemd_analyze, "systemd-analyze not found: install Debian's systemd package"
    # verify checks that ExecStart's program exists: point it at this environment's walstream.
    unit = tmp_path / "walstream.service"
    unit.write_text(UNIT.read_text().replace("/opt/walstream/bin/walstream", WALSTREAM))
    done = subprocess.run(
        [systemd_analyze, "verify", str(unit)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and not (done.stdout + done.stderr).strip(), (
        done.stdout + done.stderr
    )


def _seconds(text: str) -> float:
    match = re.fullmatch(r"(\d+)(s|min)?", text.strip())
    assert match, f"unsupported duration {text!r}"
    return float(match.group(1)) * (60 if match.group(2) == "min" else 1)


@pytest.mark.slow
def test_stopping_the_unit_drains_the_node(tmp_path: Path) -> None:
    service = _unit()["Service"]
    kill_signal = signal.Signals[service.get("KillSignal", "SIGTERM")]
    timeout_s = _seconds(service["TimeoutStopSec"])
    success = {int(code) for code in service.get("SuccessExitStatus", "0").split()} | {0}
    command = shlex.split(service["ExecStart"])
    assert command[0] == "/opt/walstream/bin/walstream" and command[-1] == "serve", command
    # Uploads so rare that every acknowledged record waits in the WAL, which lives in memory:
    # whatever the drain does not upload and commit is gone when the process exits.
    deployment = tmp_path / "walstream.yaml"
    deployment.write_text(
        "node: {id: 1}\n"
        "wal: {type: memory, name: unit-drain}\n"
        f"object_store: {{type: local, root: {tmp_path / 'objects'}}}\n"
        f"metadata: {{type: sqlite, path: {tmp_path / 'meta.db'}}}\n"
        "upload: {max_bytes: 64MiB, max_interval: 1h}\n"
    )
    command[0] = WALSTREAM
    command[command.index("--config") + 1] = str(deployment)
    process = subprocess.Popen(
        [*command, "--listen", "127.0.0.1:0"],
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "WALSTREAM_TOKEN": ""},
    )
    try:
        assert process.stdout is not None
        banner = process.stdout.readline()
        url = re.search(r"listening on (http://\S+)", banner)
        assert url, banner
        base = url.group(1)

        def post(path: str, body: object) -> None:
            request = urllib.request.Request(
                base + path,
                data=json.dumps(body).encode(),
                headers={"s2-basin": "walstream", "Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=60) as answer:
                assert answer.status in (200, 201)

        post("/v1/streams", {"stream": "drained"})
        for batch in range(5):
            post(
                "/v1/streams/drained/records",
                {"records": [{"body": f"r{batch}-{index}"} for index in range(100)]},
            )
        process.send_signal(kill_signal)
        code = process.wait(timeout=timeout_s)
        stderr = process.stderr.read() if process.stderr else ""
        assert code in success, f"exit {code} after {kill_signal.name}:\n{stderr}"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    listed = subprocess.run(
        [WALSTREAM, "--config", str(deployment), "streams", "list", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert listed.returncode == 0, listed.stderr
    (stream,) = [json.loads(line) for line in listed.stdout.splitlines()]
    assert stream["committed_end"] == 500, f"the drain left records uncommitted: {stream}"
