"""Lifecycle hooks through pluggy and the metrics extension: real calls through PluggyHooks,
isolation of failing hook implementations, discovery of hook extensions, and Prometheus text
that parses line by line."""

from __future__ import annotations

import dataclasses
import inspect
import logging
import math
import re
from collections.abc import Callable
from typing import Any, ClassVar

import pytest
from walstream.engine.events import (
    EVENT_TYPES,
    Compacted,
    EngineEvent,
    EngineHooks,
    ObjectCommitted,
    ObjectUploaded,
    ReadServed,
    Recovered,
    WalAppended,
)
from walstream_plugins import Metrics, PluggyHooks, get_metrics, hookimpl, make_plugin_manager
from walstream_plugins import metrics as metrics_module
from walstream_plugins.hooks import HOOK_PREFIX, WalstreamHookSpecs

MakeDist = Callable[..., str]  # the third_party_dist fixture (conftest.py)


def fresh_hooks() -> tuple[PluggyHooks, Metrics]:
    manager = make_plugin_manager(load_entrypoints=False)
    metrics = Metrics(latency_window=100)
    manager.register(metrics, name="metrics")
    return PluggyHooks(manager), metrics


def drive(hooks: EngineHooks) -> None:
    """The calls an engine makes for a small workload on node 3."""
    for index, latency_s in enumerate([0.0004, 0.002, 0.002, 0.03, 0.7]):
        hooks.emit(WalAppended(3, 10 + index % 2, 4, 400, latency_s))
    hooks.emit(ObjectUploaded(3, 1, "a1/000001.obj", 5000, "stream_set"))
    hooks.emit(ObjectUploaded(3, 2, "b2/000002.obj", 7000, "stream"))
    hooks.emit(ObjectCommitted(3, [1, 2], 12000, 4096))
    hooks.emit(Recovered(3, 20, 5, 1, False))
    hooks.emit(Recovered(4, 8, 2, 0, True))
    hooks.emit(Compacted([1, 2], [3], 11000))
    hooks.emit(ReadServed(10, 4, 400, "log_cache"))
    hooks.emit(ReadServed(10, 6, 600, "log_cache"))
    hooks.emit(ReadServed(11, 2, 200, "object"))


def test_hook_specifications_match_the_engine_events() -> None:
    """Every event dataclass has a hook ``walstream_<name>`` whose arguments are its fields, in
    order, and there is no hook without an event."""
    specs = {
        name: list(inspect.signature(function).parameters)[1:]  # without self
        for name, function in vars(WalstreamHookSpecs).items()
        if name.startswith(HOOK_PREFIX)
    }
    events = {
        HOOK_PREFIX + event.name: [field.name for field in dataclasses.fields(event)]
        for event in EVENT_TYPES
    }
    assert specs == events
    assert len({event.name for event in EVENT_TYPES}) == len(EVENT_TYPES)


class RecordEverything:
    """A hook extension written the way third parties write them: every argument by name."""

    def __init__(self) -> None:
        self.seen: dict[str, dict[str, Any]] = {}

    @hookimpl
    def walstream_wal_appended(
        self, node_id: int, stream_id: int, records: int, size_bytes: int, latency_s: float
    ) -> None:
        self.seen["walstream_wal_appended"] = dict(
            node_id=node_id,
            stream_id=stream_id,
            records=records,
            size_bytes=size_bytes,
            latency_s=latency_s,
        )

    @hookimpl
    def walstream_object_uploaded(
        self, node_id: int, object_id: int, key: str, size_bytes: int, kind: str
    ) -> None:
        self.seen["walstream_object_uploaded"] = dict(
            node_id=node_id, object_id=object_id, key=key, size_bytes=size_bytes, kind=kind
        )

    @hookimpl
    def walstream_object_committed(
        self, node_id: int, object_ids: list[int], size_bytes: int, wal_offset: int
    ) -> None:
        self.seen["walstream_object_committed"] = dict(
            node_id=node_id, object_ids=object_ids, size_bytes=size_bytes, wal_offset=wal_offset
        )

    @hookimpl
    def walstream_recovered(
        self, node_id: int, records: int, batches: int, dropped_batches: int, failover: bool
    ) -> None:
        self.seen["walstream_recovered"] = dict(
            node_id=node_id,
            records=records,
            batches=batches,
            dropped_batches=dropped_batches,
            failover=failover,
        )

    @hookimpl
    def walstream_compacted(
        self, source_object_ids: list[int], new_object_ids: list[int], size_bytes: int
    ) -> None:
        self.seen["walstream_compacted"] = dict(
            source_object_ids=source_object_ids,
            new_object_ids=new_object_ids,
            size_bytes=size_bytes,
        )

    @hookimpl
    def walstream_read_served(
        self, stream_id: int, records: int, size_bytes: int, source: str
    ) -> None:
        self.seen["walstream_read_served"] = dict(
            stream_id=stream_id, records=records, size_bytes=size_bytes, source=source
        )


def test_every_event_reaches_its_hook_with_every_argument() -> None:
    samples = [
        WalAppended(1, 2, 3, 4, 0.5),
        ObjectUploaded(1, 2, "k", 3, "stream"),
        ObjectCommitted(1, [2, 3], 4, 5),
        Recovered(1, 2, 3, 4, True),
        Compacted([1], [2], 3),
        ReadServed(1, 2, 3, "object"),
    ]
    assert {type(event) for event in samples} == set(EVENT_TYPES)
    recorder = RecordEverything()
    manager = make_plugin_manager(load_entrypoints=False)
    manager.register(recorder, name="recorder")
    hooks = PluggyHooks(manager)
    for event in samples:
        hooks.emit(event)
    assert recorder.seen == {
        HOOK_PREFIX + event.name: dataclasses.asdict(event) for event in samples
    }
    assert hooks.errors == 0


def test_an_event_without_a_hook_specification_is_ignored() -> None:
    @dataclasses.dataclass
    class FromANewerEngine(EngineEvent):
        name: ClassVar[str] = "something_new"
        node_id: int

    hooks, metrics = fresh_hooks()
    hooks.emit(FromANewerEngine(1))
    hooks.emit(WalAppended(1, 1, 1, 10, 0.001))
    assert hooks.errors == 0
    assert metrics.appends == 1


def test_pluggy_hooks_satisfies_the_engine_protocol() -> None:
    hooks: EngineHooks = fresh_hooks()[0]
    assert callable(hooks.emit)


def test_metrics_count_real_calls_through_pluggy_hooks() -> None:
    hooks, metrics = fresh_hooks()
    drive(hooks)
    summary = metrics.summary()
    assert summary["wal"]["appends"] == 5
    assert summary["wal"]["records"] == 20
    assert summary["wal"]["bytes"] == 2000
    assert summary["wal"]["latency_p50_s"] == 0.002
    assert summary["wal"]["latency_p99_s"] == 0.7
    assert summary["wal"]["latency_buckets"]["0.0005"] == 1
    assert summary["wal"]["latency_buckets"]["0.0025"] == 3
    assert summary["wal"]["latency_buckets"]["0.5"] == 4
    assert summary["wal"]["latency_buckets"]["+Inf"] == 5
    assert summary["objects"]["uploaded"] == {"stream_set": 1, "stream": 1}
    assert summary["objects"]["uploaded_bytes"] == {"stream_set": 5000, "stream": 7000}
    assert (summary["objects"]["commits"], summary["objects"]["committed"]) == (1, 2)
    assert summary["objects"]["committed_bytes"] == 12000
    assert summary["objects"]["committed_wal_offset"] == {3: 4096}
    assert summary["recoveries"] == {
        "restart": 1,
        "failover": 1,
        "records": 28,
        "batches": 7,
        "dropped_batches": 1,
    }
    assert summary["compactions"] == {
        "runs": 1,
        "source_objects": 2,
        "new_objects": 1,
        "bytes": 11000,
    }
    assert summary["reads"] == {
        "log_cache": {"reads": 2, "records": 10, "bytes": 1000},
        "object": {"reads": 1, "records": 2, "bytes": 200},
    }
    assert hooks.errors == 0


def test_latency_quantiles_follow_the_most_recent_window() -> None:
    hooks, metrics = fresh_hooks()  # window of 100
    for _ in range(100):
        hooks.emit(WalAppended(1, 1, 1, 10, 0.5))
    for millis in range(1, 101):
        hooks.emit(WalAppended(1, 1, 1, 10, millis / 1000))
    quantiles = metrics.latency_quantiles()
    assert quantiles[0.5] == pytest.approx(0.050)
    assert quantiles[0.99] == pytest.approx(0.099)
    assert metrics.summary()["wal"]["appends"] == 200  # the histogram keeps everything


def test_no_appends_yet_means_no_quantiles() -> None:
    metrics = Metrics()
    assert metrics.summary()["wal"]["latency_p50_s"] is None
    assert "quantile=" not in metrics.render_prometheus()


class Exploding:
    @hookimpl
    def walstream_wal_appended(self, records: int) -> None:
        raise RuntimeError("metrics backend down")

    @hookimpl
    def walstream_read_served(self, source: str) -> None:
        raise KeyError(source)


def test_a_failing_hook_is_logged_and_does_not_starve_the_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    hooks, metrics = fresh_hooks()
    hooks.plugin_manager.register(Exploding(), name="exploding")
    with caplog.at_level(logging.WARNING, logger="walstream_plugins.hooks"):
        for _ in range(3):
            hooks.emit(WalAppended(1, 1, 2, 20, 0.001))
        hooks.emit(ReadServed(1, 2, 20, "object"))
    assert metrics.appends == 3
    assert metrics.reads == {"object": 1}
    assert hooks.errors == 4
    warnings = [record for record in caplog.records if record.levelno == logging.WARNING]
    # One warning per (hook, plugin), with the traceback; repeats go to debug.
    assert len(warnings) == 2
    assert "walstream_wal_appended" in warnings[0].getMessage()
    assert "'exploding'" in warnings[0].getMessage()
    assert warnings[0].exc_info is not None


def test_wrappers_go_through_pluggy_and_failures_are_still_contained() -> None:
    hooks, metrics = fresh_hooks()
    seen: list[int] = []

    class Wrapper:
        @hookimpl(wrapper=True)
        def walstream_wal_appended(self, stream_id: int) -> Any:
            seen.append(stream_id)
            result = yield
            raise RuntimeError("wrapper fails after the call")
            return result  # pragma: no cover

    hooks.plugin_manager.register(Wrapper(), name="wrapper")
    hooks.emit(WalAppended(1, 42, 1, 10, 0.001))
    assert seen == [42]
    assert metrics.appends == 1
    assert hooks.errors == 1


def test_entry_point_extensions_are_loaded_and_can_be_disabled() -> None:
    manager = make_plugin_manager()
    assert get_metrics(manager) is metrics_module.plugin
    hooks = PluggyHooks(manager)
    before = metrics_module.plugin.appends
    hooks.emit(WalAppended(1, 1, 1, 10, 0.001))
    assert metrics_module.plugin.appends == before + 1

    disabled = make_plugin_manager(disabled=["metrics"])
    assert get_metrics(disabled) is None
    assert disabled.is_blocked("metrics")
    assert disabled.register(Metrics(), name="metrics") is None  # stays blocked


def test_broken_hook_extension_is_skipped_quietly(
    third_party_dist: MakeDist, caplog: pytest.LogCaptureFixture
) -> None:
    third_party_dist(
        "acme-hooks",
        modules={
            "acme_hooks{suffix}": "import acme_missing_telemetry_sdk  # noqa: F401\n",
            "acme_audit{suffix}": """
                from walstream_plugins import hookimpl

                CALLS = []

                @hookimpl
                def walstream_object_committed(object_ids):
                    CALLS.append(list(object_ids))
            """,
        },
        entry_points={
            "walstream.hooks": {
                "telemetry": "acme_hooks{suffix}:plugin",
                "audit": "acme_audit{suffix}",
            }
        },
    )
    with caplog.at_level(logging.WARNING, logger="walstream_plugins.hooks"):
        manager = make_plugin_manager()
    names = {name for name, _ in manager.list_name_plugin()}
    assert {"metrics", "audit"} <= names
    assert "telemetry" not in names
    assert any(
        "telemetry" in record.getMessage() and "acme_missing_telemetry_sdk" in record.getMessage()
        for record in caplog.records
    )
    PluggyHooks(manager).emit(ObjectCommitted(1, [5, 6], 100, 10))
    audit = manager.get_plugin("audit")
    assert audit.CALLS == [[5, 6]]


def test_disabled_extension_is_not_even_imported(third_party_dist: MakeDist) -> None:
    suffix = third_party_dist(
        "acme-hooks",
        modules={"acme_loud{suffix}": "raise SystemExit('imported although disabled')\n"},
        entry_points={"walstream.hooks": {"loud": "acme_loud{suffix}"}},
    )
    manager = make_plugin_manager(disabled=["loud"])
    assert manager.get_plugin("loud") is None
    assert f"acme_loud{suffix}" not in __import__("sys").modules


# -- Prometheus text exposition format 0.0.4 ----------------------------------------------------

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\\\|\\"|\\n)*"'
_SAMPLE = re.compile(
    rf"^(?P<name>{_NAME})(?:\{{(?P<labels>{_LABEL}(?:,{_LABEL})*)?\}})?"
    r" (?P<value>[-+]?(?:[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?|Inf|NaN))$"
)
_HELP = re.compile(rf"^# HELP (?P<name>{_NAME}) (?P<text>.*)$")
_TYPE = re.compile(rf"^# TYPE (?P<name>{_NAME}) (?P<type>counter|gauge|histogram|summary|untyped)$")


def parse_exposition(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """A strict reader of the text format: every line is HELP, TYPE or a sample of the family
    just declared; returns {(name, labels): value}."""
    assert text.endswith("\n")
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    declared: set[str] = set()
    family, family_type, helped = "", "", ""
    for number, line in enumerate(text.splitlines(), 1):
        if match := _HELP.match(line):
            helped = match["name"]
            continue
        if match := _TYPE.match(line):
            assert match["name"] not in declared, f"line {number}: family declared twice"
            assert helped == match["name"], f"line {number}: TYPE without HELP before it"
            family, family_type = match["name"], match["type"]
            declared.add(family)
            continue
        match = _SAMPLE.match(line)
        assert match, f"line {number} is not valid exposition text: {line!r}"
        name = match["name"]
        allowed = {family}
        if family_type == "histogram":
            allowed = {family + "_bucket", family + "_sum", family + "_count"}
        assert name in allowed, f"line {number}: {name} outside its family {family}"
        assert name.startswith("walstream_")
        labels = tuple(
            re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', match["labels"] or "")
        )
        assert (name, labels) not in samples, f"line {number}: duplicate sample"
        samples[(name, labels)] = float(match["value"])
    return samples


def test_prometheus_text_parses_and_carries_the_counts() -> None:
    hooks, metrics = fresh_hooks()
    drive(hooks)
    samples = parse_exposition(metrics.render_prometheus())
    assert samples[("walstream_wal_appends_total", ())] == 5
    assert samples[("walstream_wal_appended_bytes_total", ())] == 2000
    assert samples[("walstream_objects_uploaded_total", (("kind", "stream"),))] == 1
    assert samples[("walstream_objects_committed_bytes_total", ())] == 12000
    assert samples[("walstream_wal_committed_offset", (("node", "3"),))] == 4096
    assert samples[("walstream_recoveries_total", (("failover", "true"),))] == 1
    assert samples[("walstream_read_bytes_total", (("source", "log_cache"),))] == 1000
    assert samples[("walstream_compactions_total", ())] == 1
    assert samples[("walstream_wal_append_latency_recent_seconds", (("quantile", "0.99"),))] == 0.7
    buckets = [
        (labels[0][1], value)
        for (name, labels), value in samples.items()
        if name == "walstream_wal_append_latency_seconds_bucket"
    ]
    bounds = [math.inf if bound == "+Inf" else float(bound) for bound, _ in buckets]
    counts = [value for _, value in buckets]
    assert bounds == sorted(bounds) and bounds[-1] == math.inf
    assert counts == sorted(counts), "buckets must be cumulative"
    assert counts[-1] == samples[("walstream_wal_append_latency_seconds_count", ())] == 5
    assert samples[("walstream_wal_append_latency_seconds_sum", ())] == pytest.approx(0.7344)


def test_each_metrics_instance_has_its_own_prometheus_registry() -> None:
    hooks, metrics = fresh_hooks()
    drive(hooks)
    other = Metrics()
    registry = metrics.registry
    assert registry.get_sample_value("walstream_wal_appends_total") == 5
    assert registry.get_sample_value("walstream_reads_total", {"source": "object"}) == 1
    assert registry.get_sample_value("walstream_wal_append_latency_seconds_count") == 5
    assert other.registry.get_sample_value("walstream_wal_appends_total") == 0
    assert "_created" not in metrics.render_prometheus()


def test_prometheus_label_values_are_escaped() -> None:
    hooks, metrics = fresh_hooks()
    hooks.emit(ReadServed(1, 1, 1, 'odd "source"\\\nname'))
    text = metrics.render_prometheus()
    assert 'source="odd \\"source\\"\\\\\\nname"' in text
    parse_exposition(text)


def test_prometheus_text_is_accepted_by_the_reference_parser() -> None:
    parser = pytest.importorskip("prometheus_client.parser")
    hooks, metrics = fresh_hooks()
    drive(hooks)
    families = {
        family.name: family
        for family in parser.text_string_to_metric_families(metrics.render_prometheus())
    }
    assert families["walstream_wal_append_latency_seconds"].type == "histogram"


# -- through the real engine -----------------------------------------------------------------


async def test_engine_opened_from_a_deployment_reports_into_metrics(
    tmp_path: Any,
) -> None:
    """A YAML deployment → walstream.open → appends, reads, flush, restart: the metrics
    extension sees what the engine did."""
    walstream = pytest.importorskip("walstream")
    if not hasattr(walstream, "open"):
        pytest.skip("the engine (walstream.open) is not available in this checkout")
    from walstream import Record
    from walstream_plugins import load_deployment

    path = tmp_path / "deploy.yaml"
    path.write_text(
        "node: {id: 5}\n"
        "wal: {type: memory, name: hooks-e2e}\n"
        "object_store: {type: local, root: ./objects}\n"
        "metadata: {type: sqlite, path: ./meta.db}\n"
        "upload: {max_bytes: 64KiB, max_interval: 50ms}\n"
        "compaction: {enabled: false}\n"
    )
    deployment = load_deployment(path)
    hooks, metrics = fresh_hooks()
    async with walstream.open(deployment, hooks=hooks) as client:
        stream = await client.create_stream("orders")
        for index in range(10):
            await stream.append([Record(f"order-{index}".encode()), Record(b"x" * 100)])
        result = await stream.read(start=0, limit_records=100)
        assert [record.value for record in result.records[:2]] == [b"order-0", b"x" * 100]
        await client.flush()
    summary = metrics.summary()
    assert summary["wal"]["appends"] == 10
    assert summary["wal"]["records"] == 20
    assert summary["wal"]["latency_p50_s"] is not None
    assert summary["reads"]["log_cache"]["records"] == 20
    assert summary["objects"]["commits"] >= 1
    assert sum(summary["objects"]["uploaded"].values()) >= 1
    assert summary["recoveries"]["restart"] == 1
    assert hooks.errors == 0
    assert (tmp_path / "meta.db").is_file()
    parse_exposition(metrics.render_prometheus())


def test_implementations_registered_or_removed_between_events_are_followed() -> None:
    """The forwarder keeps its way to each hook between events; a plugin registered (or
    unregistered) after an event of the same type has been emitted must still get (or stop
    getting) the next ones, with only the arguments it asks for."""
    hooks, metrics = fresh_hooks()
    hooks.emit(WalAppended(1, 7, 1, 10, 0.001))
    seen: list[tuple[int, int]] = []

    class Late:
        @hookimpl
        def walstream_wal_appended(self, records: int, stream_id: int) -> None:
            seen.append((stream_id, records))

    late = Late()
    hooks.plugin_manager.register(late, name="late")
    hooks.emit(WalAppended(1, 8, 3, 30, 0.001))
    hooks.plugin_manager.unregister(late)
    hooks.emit(WalAppended(1, 9, 5, 50, 0.001))
    assert seen == [(8, 3)]
    assert metrics.appends == 3
    assert metrics.appended_records == 9
    assert hooks.errors == 0
