"""Architecture drift on generated traces with a known truth (tests/analytics/builders.py,
``scenario_drift``): each kind found with its first day, healthy traffic raising none."""

from __future__ import annotations

import json
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from analytics import Conventions, ConventionsError, drift_report
from analytics.conventions import Conventions as _Conventions
from analytics.drift import shared_calls_sql
from collectors import TRACES_TABLE
from collectors.spans import SpanRow, insert_spans
from storage import Store, ensure_schema, open_store
from tests.analytics.builders import DAY, T0, scenario_drift


def _paths(spans: list[SpanRow]) -> dict[str, str]:
    """span_id → 'hot' / 'cold' / '' by walking the generated traces in Python: the oracle the SQL
    walk is checked against: hot root, root marked cold, anything at or below a Consumer span that a
    queue delivered (its parent a Producer, or no parent) is cold; model calls, dependency calls
    (Client) and publishes (Producer) are not functions."""
    by_id = {s.span_id: s for s in spans}
    roots = {s.trace_id: s for s in spans if not s.parent_span_id}
    out = {}
    for s in spans:
        node, below = s, False
        while True:
            parent = by_id.get(node.parent_span_id) if node.parent_span_id else None
            if node.kind == "Consumer" and (parent is None or parent.kind == "Producer"):
                below = True
            if parent is None:
                break
            node = parent
        root = roots.get(s.trace_id)
        if "gen_ai.operation.name" in s.attributes or s.kind in ("Client", "Producer"):
            out[s.span_id] = ""
        elif below:
            out[s.span_id] = "cold"
        elif root is not None and root.kind == "Server":
            out[s.span_id] = "hot"
        elif root is not None and root.attributes.get("tailwatch.path") == "cold":
            out[s.span_id] = "cold"
        else:
            out[s.span_id] = ""
    return out


def test_each_kind_is_found_with_its_first_day_and_healthy_traffic_raises_none(store: Store) -> None:
    scenario = scenario_drift()
    insert_spans(store, scenario.spans)
    findings = drift_report(store, scenario.end)
    got = {
        (f.kind, f.service, f.operation, f.queue): (f.since - scenario.start) // timedelta(days=1)
        for f in findings
    }
    assert got == scenario.expected
    # Healthy: the stable nightly job, the helper at a steady hot share, the Celery-style worker
    # call (cold below its consumer), the bounded queue.
    named = {f.service for f in findings} | {f.operation for f in findings} | {f.queue for f in findings}
    for healthy in ("report-worker", "nightly-report", "emails", "reports", "digest-worker", "run/digest"):
        assert healthy not in named
    assert not any("load_template" in f.operation or "render_report" in f.operation for f in findings)
    # Two kinds in summary-api: critical; one kind elsewhere: a warning.
    severity = {(f.kind, f.service, f.operation or f.queue): f.severity for f in findings}
    summarise = "summarise_document (summaries.tasks.summarise_document)"
    assert severity[("shared_operation", "summary-api", summarise)] == "critical"
    assert severity[("no_latency_target", "summary-api", "POST /summaries/now")] == "critical"
    assert severity[("batch_shrinking", "summary-worker", "nightly-summaries")] == "critical"
    assert severity[("unit_cost_rising", "summary-worker", "nightly-summaries")] == "critical"
    assert severity[("queue_unbounded", "", "doc-index")] == "warning"

    # The evidence is what the generated spans hold, counted here from the spans themselves.
    paths = _paths(scenario.spans)
    last = T0 + 11 * DAY
    calls = Counter(
        paths[s.span_id] for s in scenario.spans if s.name == "summarise_document" and s.start_ns >= last
    )
    shared = next(f for f in findings if f.kind == "shared_operation")
    assert shared.evidence["hot_share_now"] == pytest.approx(calls["hot"] / (calls["hot"] + calls["cold"]))
    assert shared.evidence["hot_share_then"] == 0.0
    assert shared.evidence["hot_calls_per_day_now"] == pytest.approx(calls["hot"] / 3)
    assert shared.evidence["function"] == "summaries.tasks.summarise_document"
    batch = next(f for f in findings if f.kind == "batch_shrinking")
    sizes = [
        int(s.attributes["messaging.batch.message_count"])
        for s in scenario.spans
        if s.name == "nightly-summaries" and s.start_ns >= last
    ]
    assert batch.evidence["runs_per_day_now"] == pytest.approx(len(sizes) / 3)
    assert batch.evidence["items_per_run_now"] == pytest.approx(sum(sizes) / len(sizes))
    # Tokens per document, counted from the model calls of the runs of the last days.
    runs_now = {s.trace_id for s in scenario.spans if s.name == "nightly-summaries" and s.start_ns >= last}
    tokens_now = sum(
        int(s.attributes["gen_ai.usage.input_tokens"]) + int(s.attributes["gen_ai.usage.output_tokens"])
        for s in scenario.spans
        if s.trace_id in runs_now and "gen_ai.usage.input_tokens" in s.attributes
    )
    cost = next(f for f in findings if f.kind == "unit_cost_rising")
    assert cost.evidence["unit"] == "item"
    assert cost.evidence["tokens_per_unit_now"] == pytest.approx(tokens_now / sum(sizes))
    assert cost.evidence["tokens_per_unit_then"] == pytest.approx(725.0)
    retry = next(f for f in findings if f.kind == "whole_batch_retry")
    failed_runs = [
        s for s in scenario.spans if s.name == "run/reindex" and s.attributes["celery.state"] == "RETRY"
    ]
    assert retry.evidence["retried_jobs"] == len(failed_runs)
    assert retry.evidence["items_reprocessed_per_failed_item"] == pytest.approx(50.0)
    # Each retried task was enqueued by a hot request that waits on it (its trace holds the runs).
    assert retry.evidence["jobs_hot_requests_waited_on"] == len(failed_runs)
    queue = next(f for f in findings if f.kind == "queue_unbounded")
    producers = [s for s in scenario.spans if s.kind == "Producer" and s.name == "send doc-index"]
    consumers = [s for s in scenario.spans if s.kind == "Consumer" and s.name == "process doc-index"]
    assert queue.evidence["backlog_now"] == len(producers) - len(consumers)

    # A latency_slo rule (or a latency budget) covering an operation: no no_latency_target for it.
    covered = drift_report(store, scenario.end, covered=[("web", "GET /*")])
    assert not any(f.kind == "no_latency_target" and f.service == "web" for f in covered)
    budgets = Conventions(latency_budgets=(("summary-api", "*", 500.0),))
    assert not any(
        f.kind == "no_latency_target" and f.service == "summary-api"
        for f in drift_report(store, scenario.end, budgets)
    )


def test_the_sql_walk_puts_a_workers_call_below_its_consumer_on_the_cold_side(store: Store) -> None:
    scenario = scenario_drift()
    insert_spans(store, scenario.spans)
    conv = Conventions()
    start, days = scenario.start, 14
    params = {
        **conv.sql_parameters(),
        "s": start,
        "e": scenario.end,
        "s_ns": T0,
        "day_ns": DAY,
        "days": days,
    }
    rows = store.query_polars(shared_calls_sql(store.table(TRACES_TABLE)), params)
    got = Counter()
    for row in rows.iter_rows(named=True):
        got[(row["name"], row["path"])] += row["calls"]
    paths = _paths(scenario.spans)
    end = T0 + days * DAY  # spans started in the window (the last emails job runs after it)
    expected = Counter(
        (s.name, paths[s.span_id]) for s in scenario.spans if paths[s.span_id] and s.start_ns < end
    )
    assert got == expected
    # A task run eagerly inside the request is on its hot path.
    assert got[("run/summarise", "hot")] == 4 * 30 and got[("run/summarise", "cold")] == 0
    assert got[("summarise_document", "hot")] == 4 * 60
    # The Celery-style worker's call sits in the request's trace, yet is cold work.
    assert got[("render_report", "hot")] == 0
    assert got[("render_report", "cold")] == 14 * 5 + 7 * 40


def test_a_window_shorter_than_both_edges_is_refused() -> None:
    with pytest.raises(ConventionsError, match="drift_days"):
        _Conventions(drift_days=5, drift_edge_days=3)


def test_analyze_json_and_table_carry_the_drift_report(tmp_path: Path) -> None:
    from tailwatch.cli import main

    scenario = scenario_drift()
    dsn = f"chdb://{tmp_path / 'store'}"
    with open_store(dsn) as s:
        ensure_schema(s)
        insert_spans(s, scenario.spans)
    end = scenario.end.isoformat()
    start = (scenario.end - timedelta(hours=1)).isoformat()
    window = ["--store", dsn, "--start", start, "--end", end, "--no-summaries"]
    result = CliRunner().invoke(main, ["analyze", *window, "--format", "json", "--drift-days", "14"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    kinds = Counter(f["kind"] for f in data["drift"])
    # The default rule pack has no latency_slo rule: both endpoints reaching shared code lack a target.
    assert kinds == {
        "shared_operation": 1,
        "batch_shrinking": 1,
        "unit_cost_rising": 1,
        "queue_unbounded": 1,
        "whole_batch_retry": 1,
        "no_latency_target": 2,
    }
    shared = next(f for f in data["drift"] if f["kind"] == "shared_operation")
    assert shared["since"] == (scenario.start + timedelta(days=10)).isoformat().replace("+00:00", "Z")
    table = CliRunner().invoke(main, ["analyze", *window, "--format", "table"])
    assert table.exit_code == 0, table.output
    assert "ARCHITECTURE DRIFT (last 14 days" in table.output
    assert "nightly-summaries" in table.output
    # --drift-days 0: no report at all.
    off = CliRunner().invoke(main, ["analyze", *window, "--format", "json", "--drift-days", "0"])
    assert off.exit_code == 0, off.output
    assert "drift" not in json.loads(off.output)


def test_the_report_is_read_once_an_hour_per_store_and_kept(store: Store) -> None:
    """A cron evaluation every minute must not read 14 days of spans each time: the first reader of
    an hour keeps the findings in the store, the next ones (another process too) read them."""
    from analytics import stored_drift_report
    from analytics.schema import DRIFT_REPORTS_TABLE

    scenario = scenario_drift()
    insert_spans(store, scenario.spans)
    want = drift_report(store, scenario.end)
    assert want
    first = stored_drift_report(store, scenario.end + timedelta(minutes=7))
    assert [f.to_dict() for f in first] == [f.to_dict() for f in want]
    assert store.query_value(f"SELECT count() FROM {store.table(DRIFT_REPORTS_TABLE)}") == 1
    # Spans added since change nothing within the hour (the stored findings are read)...
    store.command(f"TRUNCATE TABLE {store.table(TRACES_TABLE)}")
    again = stored_drift_report(store, scenario.end + timedelta(minutes=40))
    assert [f.to_dict() for f in again] == [f.to_dict() for f in want]
    assert store.query_value(f"SELECT count() FROM {store.table(DRIFT_REPORTS_TABLE)}") == 1
    # ...the next hour reads the spans again, as do other conventions.
    assert stored_drift_report(store, scenario.end + timedelta(hours=1)) == []
    assert stored_drift_report(store, scenario.end, Conventions(drift_hot_share=0.2)) == []
    assert store.query_value(f"SELECT count() FROM {store.table(DRIFT_REPORTS_TABLE)}") == 3


def test_each_finding_carries_the_per_day_series_it_rests_on(store: Store) -> None:
    """``by_day``: one row per day of the window with the series of the finding's kind, counted
    here from the generated spans day by day; the edges of the series are the evidence's then/now."""
    from analytics.drift import BY_DAY_KEYS

    scenario = scenario_drift()
    insert_spans(store, scenario.spans)
    findings = {f.kind: f for f in drift_report(store, scenario.end)}
    days = 14

    def day_of(ns: int) -> int:
        return (ns - T0) // DAY

    for f in findings.values():
        assert [row["day"] for row in f.by_day] == [scenario.start + timedelta(days=d) for d in range(days)]
        assert all(set(row) == {"day", *BY_DAY_KEYS[f.kind]} for row in f.by_day)

    paths = _paths(scenario.spans)
    calls = Counter(
        (day_of(s.start_ns), paths[s.span_id]) for s in scenario.spans if s.name == "summarise_document"
    )
    shared = findings["shared_operation"]
    assert [r["hot_calls"] for r in shared.by_day] == [calls[(d, "hot")] for d in range(days)]
    assert [r["cold_calls"] for r in shared.by_day] == [calls[(d, "cold")] for d in range(days)]
    assert [r["hot_share"] for r in shared.by_day] == pytest.approx(
        [calls[(d, "hot")] / (calls[(d, "hot")] + calls[(d, "cold")]) for d in range(days)]
    )
    assert sum(r["hot_calls"] for r in shared.by_day[-3:]) / 3 == pytest.approx(
        shared.evidence["hot_calls_per_day_now"]
    )
    assert [r["hot_p99_ms"] is None for r in shared.by_day] == [calls[(d, "hot")] == 0 for d in range(days)]

    runs = [s for s in scenario.spans if s.name == "nightly-summaries"]
    batch = findings["batch_shrinking"]
    per_day_runs = Counter(day_of(s.start_ns) for s in runs)
    items = Counter()
    for s in runs:
        items[day_of(s.start_ns)] += int(s.attributes["messaging.batch.message_count"])
    assert [r["runs"] for r in batch.by_day] == [per_day_runs[d] for d in range(days)]
    assert [r["items_per_run"] for r in batch.by_day] == pytest.approx(
        [items[d] / per_day_runs[d] for d in range(days)]
    )

    cost = findings["unit_cost_rising"]
    run_day = {s.trace_id: day_of(s.start_ns) for s in runs}
    tokens = Counter()
    for s in scenario.spans:
        if s.trace_id in run_day and "gen_ai.usage.input_tokens" in s.attributes:
            tokens[run_day[s.trace_id]] += int(s.attributes["gen_ai.usage.input_tokens"]) + int(
                s.attributes["gen_ai.usage.output_tokens"]
            )
    assert [r["units"] for r in cost.by_day] == [items[d] for d in range(days)]
    assert [r["tokens_per_unit"] for r in cost.by_day] == pytest.approx(
        [tokens[d] / items[d] for d in range(days)]
    )

    queue = findings["queue_unbounded"]
    sent = Counter(day_of(s.start_ns) for s in scenario.spans if s.name == "send doc-index")
    done = Counter(
        day_of(s.start_ns + s.duration_ns) for s in scenario.spans if s.name == "process doc-index"
    )
    assert [r["enqueued"] for r in queue.by_day] == [sent[d] for d in range(days)]
    assert [r["completed"] for r in queue.by_day] == [done[d] for d in range(days)]
    assert [r["backlog"] for r in queue.by_day] == [
        sum(sent[k] - done[k] for k in range(d + 1)) for d in range(days)
    ]
    assert queue.by_day[-1]["backlog"] == queue.evidence["backlog_now"]

    retry = findings["whole_batch_retry"]
    failed = Counter(
        day_of(s.start_ns)
        for s in scenario.spans
        if s.name == "run/reindex" and s.attributes["celery.state"] == "RETRY"
    )
    assert [r["retried_jobs"] for r in retry.by_day] == [failed[d] for d in range(days)]
    assert sum(r["items_reprocessed"] for r in retry.by_day) == retry.evidence["items_reprocessed"]

    target = next(
        f
        for f in drift_report(store, scenario.end)
        if f.kind == "no_latency_target" and f.service == "summary-api"
    )
    requests = Counter(
        day_of(s.start_ns) for s in scenario.spans if s.name == "POST /summaries/now" and not s.parent_span_id
    )
    assert [r["requests"] for r in target.by_day] == [requests[d] for d in range(days)]

    # The JSON carries them (days as ISO strings) and the stored report reads them back.
    as_json = shared.to_dict()["by_day"]
    assert as_json[0]["day"] == scenario.start.isoformat().replace("+00:00", "Z")
    assert as_json[10]["hot_calls"] == shared.by_day[10]["hot_calls"]


def test_each_finding_names_the_release_its_change_arrived_with(store: Store) -> None:
    """``since_release``: the version of the finding's service first seen after the first days and by
    the end of its ``since`` day; none when the change came with no new version."""
    from dataclasses import replace

    from analytics import stored_drift_report

    def version(span: SpanRow) -> str:
        day = (span.start_ns - T0) // DAY
        if span.service == "summary-worker":
            return "1.0.0" if day < 5 else "1.1.0"  # the hourly schedule shipped with 1.1.0
        if span.service == "web":
            return "5.0.0" if day < 12 else "5.1.0"  # a release after its finding began
        return {"summary-api": "2.0.0", "index-worker": "3.0.0"}.get(span.service, "")

    scenario = scenario_drift()
    spans = [
        replace(s, resource_attributes={**s.resource_attributes, "service.version": v})
        if (v := version(s))
        else s
        for s in scenario.spans
    ]
    insert_spans(store, spans)
    got = {
        (f.kind, f.service, f.operation or f.queue): f.since_release
        for f in drift_report(store, scenario.end)
    }
    summarise = "summarise_document (summaries.tasks.summarise_document)"
    assert got == {
        # summary-api first appears with its endpoint on day 10: the change arrived with 2.0.0.
        ("shared_operation", "summary-api", summarise): "2.0.0",
        ("no_latency_target", "summary-api", "POST /summaries/now"): "2.0.0",
        ("batch_shrinking", "summary-worker", "nightly-summaries"): "1.1.0",
        ("unit_cost_rising", "summary-worker", "nightly-summaries"): "1.1.0",
        # The same version all along (there from the first days), a release after the trend began,
        # and a queue (no service): no release to name.
        ("whole_batch_retry", "index-worker", "run/reindex"): None,
        ("no_latency_target", "web", "GET /templates"): None,
        ("queue_unbounded", "", "doc-index"): None,
    }
    shared = next(f for f in drift_report(store, scenario.end) if f.kind == "shared_operation")
    assert shared.to_dict()["since_release"] == "2.0.0"
    # Kept and read back with the report.
    kept = stored_drift_report(store, scenario.end)
    assert [f.to_dict() for f in kept] == [f.to_dict() for f in stored_drift_report(store, scenario.end)]
    assert {f.since_release for f in kept} == {"2.0.0", "1.1.0", None}
