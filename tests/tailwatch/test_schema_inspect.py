"""``tailwatch schema inspect|apply|print`` on trace tables tailwatch did not create."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from collectors import TracesLayout
from storage import open_store
from tailwatch.cli import main
from tailwatch.commands.schema import cluster_layout_for
from tests.collectors.tables import VARIANTS, create_variant

EXPECTED_VARIANT = {
    "collector_2024": "collector",
    "collector_2026": "collector-2026",
    "collector_json": "collector-json",
    "clickstack": "clickstack",
}


def _run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def _store_with(tmp_path: Path, variant: str | None = None, *statements: str) -> str:
    dsn = "chdb://" + str(tmp_path / "store")
    store = open_store(dsn)
    try:
        if variant:
            create_variant(store, variant)
        for statement in statements:
            store.command(statement)
    finally:
        store.close()
    return dsn


def _tables(dsn: str) -> dict[str, str]:
    store = open_store(dsn)
    try:
        return {
            str(name): str(query)
            for name, query in store.query_rows(
                "SELECT name, create_table_query FROM system.tables WHERE database = currentDatabase()"
            )
        }
    finally:
        store.close()


@pytest.mark.parametrize("variant", VARIANTS)
def test_inspect_names_each_variant_as_text_and_json(tmp_path: Path, variant: str) -> None:
    dsn = _store_with(tmp_path, variant)
    text = _run("schema", "inspect", "--store", dsn)
    assert text.exit_code == 0, text.output
    lines = text.output.splitlines()
    assert lines[0] == (
        f"table default.otel_traces: {EXPECTED_VARIANT[variant]} layout "
        f"({'json' if variant == 'collector_json' else 'map'} attributes, engine MergeTree)"
    )
    assert "created by tailwatch: no (tailwatch does not alter it without --yes)" in lines
    assert "lacks: nothing tailwatch reads" in lines
    assert "tailwatch tables present: none" in lines
    assert f"create the missing tables with: tailwatch schema apply --store {dsn}" in lines
    as_json = _run("schema", "inspect", "--store", dsn, "--format", "json")
    assert as_json.exit_code == 0, as_json.output
    report = json.loads(as_json.output)
    assert report["traces"]["variant"] == EXPECTED_VARIANT[variant]
    assert report["traces"]["created_by_tailwatch"] is False
    states = {m["migration"]: m["state"] for m in report["migrations"]}
    assert states["collectors v1"] == "pending" and states["slo_rules v1"] == "pending"


def test_inspect_without_a_span_table_fails_naming_a_command(tmp_path: Path) -> None:
    dsn = _store_with(tmp_path, None, "CREATE TABLE unrelated (x UInt8) ENGINE = MergeTree ORDER BY x")
    result = _run("schema", "inspect", "--store", dsn)
    assert result.exit_code == 2
    assert result.output.splitlines()[0] == "table default.otel_traces: missing"
    assert f"has no otel_traces table; run `tailwatch schema apply --store {dsn}`" in result.output


def test_a_span_table_lacking_columns_is_one_clear_error_for_inspect_and_analyze(tmp_path: Path) -> None:
    dsn = _store_with(
        tmp_path,
        None,
        "CREATE TABLE otel_traces (Timestamp DateTime64(9), TraceId String, SpanName String) "
        "ENGINE = MergeTree ORDER BY Timestamp",
    )
    inspected = _run("schema", "inspect", "--store", dsn)
    assert inspected.exit_code == 2
    assert "table default.otel_traces: custom layout" in inspected.output
    assert "lacks columns tailwatch reads: SpanId, ParentSpanId" in inspected.output
    assert "tailwatch schema inspect --store DSN" in inspected.output
    window = ["--start", "2026-01-01T00:00:00Z", "--end", "2026-01-02T00:00:00Z"]
    analyzed = _run("analyze", "--store", dsn, *window)
    assert analyzed.exit_code == 2
    assert analyzed.output.startswith("tailwatch: error: otel_traces in store ")
    assert "lacks columns tailwatch reads" in analyzed.output and "Code:" not in analyzed.output


def test_apply_adds_no_view_to_a_foreign_table_without_yes(tmp_path: Path) -> None:
    dsn = _store_with(tmp_path, "clickstack")
    first = _run("schema", "apply", "--store", dsn)
    assert first.exit_code == 0, first.output
    assert "found    collectors v1 otel_traces (made by something else; used as it is)" in first.output
    assert (
        "skipped  collectors v2 otel_traces_trace_id_ts: otel_traces was not created by tailwatch: "
        "not adding the trace-id lookup (a materialized view on it); rerun with --yes to add it"
    ) in first.output
    assert "applied  slo_rules v1 tailwatch_alert_state" in first.output
    tables = _tables(dsn)
    assert "otel_traces_trace_id_ts_mv" not in tables and "otel_traces_trace_id_ts" not in tables
    assert "tailwatch_alert_state" in tables
    again = _run("schema", "apply", "--store", dsn)
    assert again.exit_code == 0 and "1 skipped" in again.output

    consented = _run("schema", "apply", "--store", dsn, "--yes")
    assert consented.exit_code == 0, consented.output
    assert "applied  collectors v2 otel_traces_trace_id_ts" in consented.output
    tables = _tables(dsn)
    assert "FROM default.otel_traces" in tables["otel_traces_trace_id_ts_mv"]
    inspected = _run("schema", "inspect", "--store", dsn)
    assert "trace-id lookup: otel_traces_trace_id_ts (AggregatingMergeTree)" in inspected.output
    assert "created by tailwatch: no" in inspected.output


def test_ttl_of_a_foreign_table_changes_only_with_yes(tmp_path: Path) -> None:
    dsn = _store_with(tmp_path, "collector_2026")
    kept = _run("schema", "apply", "--store", dsn, "--ttl-days", "7")
    assert kept.exit_code == 0, kept.output
    assert "skipped  ttl of otel_traces: otel_traces was not created by tailwatch" in kept.output
    assert "toIntervalHour(36)" in _tables(dsn)["otel_traces"]
    changed = _run("schema", "apply", "--store", dsn, "--ttl", "7d", "--yes")
    assert changed.exit_code == 0, changed.output
    tables = _tables(dsn)
    assert "TTL toDateTime(Timestamp) + toIntervalDay(7)" in tables["otel_traces"]
    # The Collector's 2026 lookup is an AggregatingMergeTree; its TTL changes the same way.
    assert "AggregatingMergeTree" in tables["otel_traces_trace_id_ts"]
    assert "TTL toDateTime(Start) + toIntervalDay(7)" in tables["otel_traces_trace_id_ts"]


def test_apply_ttl_in_hours_on_a_new_and_an_existing_store(tmp_path: Path) -> None:
    dsn = "chdb://" + str(tmp_path / "store")
    created = _run("schema", "apply", "--store", dsn, "--ttl", "36h")
    assert created.exit_code == 0, created.output
    assert "TTL toDateTime(Timestamp) + toIntervalHour(36)" in _tables(dsn)["otel_traces"]
    changed = _run("schema", "apply", "--store", dsn, "--ttl", "30m")
    assert changed.output.splitlines()[:2] == [
        "ttl      otel_traces: rows older than 30 minutes are dropped "
        "(TTL toDateTime(Timestamp) + toIntervalMinute(30))",
        "ttl      otel_traces_trace_id_ts: rows older than 30 minutes are dropped "
        "(TTL toDateTime(Start) + toIntervalMinute(30))",
    ]
    both = _run("schema", "apply", "--store", dsn, "--ttl", "1h", "--ttl-days", "1")
    assert both.exit_code == 2 and "--ttl or --ttl-days" in both.output


def test_apply_json_variant_creates_what_inspect_calls_collector_json(tmp_path: Path) -> None:
    dsn = "chdb://" + str(tmp_path / "store")
    assert _run("schema", "apply", "--store", dsn, "--variant", "json").exit_code == 0
    result = _run("schema", "inspect", "--store", dsn, "--format", "json")
    assert result.exit_code == 0, result.output
    traces = json.loads(result.output)["traces"]
    assert traces["variant"] == "collector-json" and traces["created_by_tailwatch"] is True
    assert "JSON" in _tables(dsn)["otel_traces"]


def test_cluster_layout_follows_a_span_table_the_collector_made() -> None:
    def layout(variant: str, engine: str) -> TracesLayout:
        return TracesLayout("default", "otel_traces", variant, "map", engine)

    assert cluster_layout_for(layout("collector-2026", "ReplicatedMergeTree")) == "collector"
    assert cluster_layout_for(layout("collector", "MergeTree")) == "collector"
    assert cluster_layout_for(layout("collector", "Distributed")) == "distributed"
    assert cluster_layout_for(layout("missing", "")) == "distributed"


def test_print_renders_either_cluster_layout() -> None:
    collector = _run("schema", "print", "--cluster", "prod", "--cluster-layout", "collector")
    assert collector.exit_code == 0, collector.output
    assert "_local" not in collector.output and "Distributed(" not in collector.output
    assert "CREATE TABLE IF NOT EXISTS `default`.`otel_traces` ON CLUSTER `prod`" in collector.output
    assert "CREATE TABLE IF NOT EXISTS `default`.`tailwatch_rollups` ON CLUSTER `prod`" in collector.output
    distributed = _run("schema", "print", "--cluster", "prod")
    assert "`otel_traces_local`" in distributed.output and "Distributed(`prod`" in distributed.output
    versioned = _run("schema", "print", "--server-version", "26.2", "--ttl", "72h", "--variant", "map")
    assert "TYPE text(tokenizer = 'array')" in versioned.output
    assert "TTL toDateTime(Timestamp) + toIntervalDay(3)" in versioned.output


def test_serve_refuses_a_span_table_lacking_columns_at_start(tmp_path: Path) -> None:
    from storage import TailwatchError
    from tailwatch.config import load_config
    from tailwatch.service import Service

    dsn = _store_with(
        tmp_path,
        None,
        "CREATE TABLE otel_traces (Timestamp DateTime64(9), TraceId String, SpanName String) "
        "ENGINE = MergeTree ORDER BY Timestamp",
    )
    path = tmp_path / "tailwatch.toml"
    path.write_text(
        f'store = "{dsn}"\n[receiver]\notlp_http = "127.0.0.1:0"\notlp_grpc = "off"\n'
        "[schedule]\nenabled = false\n"
    )
    service = Service(load_config(path, env={}))
    with pytest.raises(TailwatchError, match="lacks columns tailwatch reads: SpanId, ParentSpanId"):
        service.start()
    # Nothing was left listening or holding the store.
    assert service.api_url is None
    reopened = open_store(dsn)
    reopened.close()
