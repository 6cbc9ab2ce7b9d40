"""Persisted runs round-trip exactly; a 30-day window's percentiles from the per-minute aggregates
are within the sketch's 0.5%; release times recorded by the summary builds outlive the raw spans."""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

import analytics.releases as releases_module
from analytics import (
    analyze,
    build_summaries,
    latest_analysis,
    load_analysis,
    load_run,
    persist_analysis,
    runs,
)
from analytics._common import Windows
from analytics.conventions import Conventions
from analytics.releases import fetch_release_times
from analytics.sketch import RELATIVE_ERROR, BucketSample, bucket_index
from analytics.stats import percentile
from analytics.summaries import summary_coverage, summary_extent
from collectors import inspect_traces
from collectors.spans import SpanRow, insert_spans
from storage import Store, StoreError
from tests.analytics.builders import at, dt, hot_request, scenario_cold_queues, scenario_llm_regression


def test_persist_and_load_round_trip(store: Store) -> None:
    assert latest_analysis(store) is None
    scenario = scenario_llm_regression()
    insert_spans(store, scenario.spans)
    insert_spans(store, scenario_cold_queues().spans)
    first = analyze(store, scenario.start, scenario.end)
    run_a = persist_analysis(store, first)
    second = analyze(store, scenario.baseline_start, scenario.baseline_end)
    run_b = persist_analysis(store, second)
    loaded = load_analysis(store, scenario.start, scenario.end)
    assert loaded is not None and loaded.run_id == run_a
    for name, frame in first.frames.items():
        assert_frame_equal(frame, loaded.frames[name])
    assert loaded.to_dict() == first.to_dict()
    latest = latest_analysis(store)
    assert latest is not None and latest.run_id == run_b
    assert load_analysis(store, dt(at(1)), scenario.end) is None
    assert runs(store)["run_id"].to_list() == [run_b, run_a]
    # History is queryable in SQL, one typed row per run and operation.
    history = store.query_rows(
        "SELECT run_id, verdict, round(delta_ms) > 1000 FROM tailwatch_analysis_attribution "
        "WHERE service = {s:String} ORDER BY window_end",
        {"s": "chat-api"},
    )
    assert [(r[0], r[1]) for r in history] == [(run_b, "none"), (run_a, "llm")]
    cold = store.query_rows("SELECT queue, starved FROM tailwatch_analysis_cold_path ORDER BY queue")
    assert cold == [("doc-summaries", True), ("emails", False)]


def test_30_day_percentiles_from_the_aggregates_and_uncovered_parts_from_raw(store: Store) -> None:
    rng = np.random.default_rng(1)
    n = 30 * 24 * 12  # one request every 5 minutes for 30 days
    durations = rng.lognormal(5.5, 0.8, n)
    spans: list[SpanRow] = []
    for i, ms in enumerate(durations):
        spans += hot_request("api", "GET /r", at(i * 300.0 + 7), float(ms), version=f"1.{i // 2000}.0")
    insert_spans(store, spans)
    insert_spans(store, spans[:900])  # duplicates are counted once, in the aggregates as in raw reads
    start, end = dt(at(0)), dt(at(30 * 86400))
    exact = analyze(store, start, end).hot_path.row(0, named=True)  # no summaries yet: exact
    assert exact["p99_ms"] == pytest.approx(float(np.quantile(durations, 0.99)))

    # Summaries cover the first 20 days only: the rest must come from raw spans.
    build = build_summaries(store, until=dt(at(20 * 86400)))
    assert build.minutes == 20 * 24 * 60
    assert summary_coverage(store) == [(dt(at(0)), dt(at(20 * 86400)))]
    mixed = analyze(store, start, end).hot_path.row(0, named=True)
    assert mixed["requests"] == n
    for name in ("p50_ms", "p95_ms", "p99_ms"):
        assert mixed[name] == pytest.approx(exact[name], rel=RELATIVE_ERROR), name
    assert mixed["p99_ms"] != exact["p99_ms"]  # it really came from the histograms

    # The builds catch up; a short window stays exact.
    build_summaries(store, until=dt(at(31 * 86400)))
    full = analyze(store, start, end).hot_path.row(0, named=True)
    assert full["requests"] == n and full["p99_ms"] == pytest.approx(exact["p99_ms"], rel=RELATIVE_ERROR)
    short = analyze(store, dt(at(0)), dt(at(3600))).hot_path.row(0, named=True)
    assert short["p99_ms"] == pytest.approx(float(np.quantile(durations[:12], 0.99)))


def test_release_times_come_from_the_summary_builds_and_outlive_raw_spans(store: Store) -> None:
    day = 86400.0
    spans: list[SpanRow] = []
    # v1 first seen at day 0 + 60 s, v2 at day 30 + 120 s; the analysed day is day 31.
    for i in range(10):
        spans += hot_request("api", "GET /r", at(60 + i * day * 3), 100.0, version="1.0.0")
    spans += hot_request("api", "GET /r", at(30 * day + 120), 120.0, version="2.0.0")
    for i in range(50):
        spans += hot_request("api", "GET /r", at(31 * day + 600 + i), 130.0, version="2.0.0")
    insert_spans(store, spans)
    windows = Windows.of(dt(at(31 * day)), dt(at(32 * day)))
    conv = Conventions()
    expected = {("api", "1.0.0"): dt(at(60)), ("api", "2.0.0"): dt(at(30 * day + 120))}

    # Each version's first request bounds its search; here a bound after everything.
    bounds = pl.DataFrame(
        {"service": ["api", "api"], "version": ["1.0.0", "2.0.0"], "start": [windows.end, windows.end]}
    )

    def release_times() -> dict[tuple[str, str], object]:
        frame = fetch_release_times(store, bounds, windows, conv, summary_extent(store, conv))
        return {(r["service"], r["version"]): r["released_at"] for r in frame.iter_rows(named=True)}

    raw_only = release_times()  # before any build: everything from raw spans
    assert raw_only == expected
    build_summaries(store, until=dt(at(30 * day + 60)))  # covers day 0 .. day 30 + 1 min
    recorded = store.query_rows(
        "SELECT service, version, min(first_seen) FROM tailwatch_release_times GROUP BY service, version"
    )
    assert [(s, v) for s, v, _ in recorded] == [("api", "1.0.0")]
    assert release_times() == expected  # recorded part + raw part agree with raw alone

    # The raw spans of the first 25 days expire (a TTL, here a delete): the recorded time remains,
    # where a raw scan alone would now see v1 first on day 27.
    store.command(
        "ALTER TABLE otel_traces DELETE WHERE Timestamp < {t:DateTime64(9)}",
        {"t": dt(at(25 * day))},
        settings={"mutations_sync": 2},
    )
    assert release_times() == expected
    assert fetch_release_times(store, bounds, windows, conv)["released_at"].to_list() == [
        dt(at(27 * day + 60)),
        dt(at(30 * day + 120)),
    ]


@pytest.mark.parametrize("plan", ["one scan", "per version", "no estimate"])
def test_release_time_is_the_first_span_before_the_first_request_with_or_without_the_index(
    store: Store, monkeypatch: pytest.MonkeyPatch, plan: str
) -> None:
    # v2's first span is a background span 5 s before its first request; v1's first span is its
    # first request. Spans of v2 in other granules or after the bound change nothing. With the index,
    # a small table is scanned once and a large one (here: any) read per version; both give the same.
    per_version_reads: list[int] = []
    lookups = releases_module.first_seen_before_sql
    monkeypatch.setattr(
        releases_module,
        "first_seen_before_sql",
        lambda table, pairs, value_index="values": (
            per_version_reads.append(pairs) or lookups(table, pairs, value_index)
        ),
    )
    if plan == "per version":
        monkeypatch.setattr(releases_module, "_SCAN_MAX_ROWS", 0)
    if plan == "no estimate":
        # A store that cannot estimate the scan (EXPLAIN refused) is read per version.
        query_rows = store.query_rows

        def refuse_explain(sql: str, *args: Any, **kwargs: Any) -> list[tuple[Any, ...]]:
            if sql.startswith("EXPLAIN"):
                raise StoreError("EXPLAIN is not allowed here")
            return query_rows(sql, *args, **kwargs)

        monkeypatch.setattr(store, "query_rows", refuse_explain)
    spans: list[SpanRow] = []
    for i in range(20):
        spans += hot_request("api", "GET /r", at(60 + i), 100.0, version="1.0.0")
    spans.append(
        SpanRow(
            trace_id=f"{0xBEEF:032x}",
            span_id=f"{0xBEEF:016x}",
            name="warm-cache",
            start_ns=at(3595),
            duration_ns=50_000_000,
            service="api",
            resource_attributes={"service.version": "2.0.0"},
        )
    )
    for i in range(20):
        spans += hot_request("api", "GET /r", at(3600 + i), 120.0, version="2.0.0")
    insert_spans(store, spans)
    windows = Windows.of(dt(at(0)), dt(at(7200)))
    first_requests = pl.DataFrame(
        {"service": ["api", "api"], "version": ["1.0.0", "2.0.0"], "start": [dt(at(60)), dt(at(3600))]}
    )
    expected = [("api", "1.0.0", dt(at(60))), ("api", "2.0.0", dt(at(3595)))]
    with_index = fetch_release_times(store, first_requests, windows, Conventions())
    assert with_index.rows() == expected
    assert per_version_reads == ([] if plan == "one scan" else [2])
    # The index tailwatch's own table carries (the 2026 layout's over its key=value items), dropped:
    # the layout is read again and every version found by the one scan.
    assert inspect_traces(store).resource_value_index == "items"
    store.command("ALTER TABLE otel_traces DROP INDEX idx_res_attr_items", settings={"mutations_sync": 2})
    assert inspect_traces(store, refresh=True).resource_value_index is None
    without_index = fetch_release_times(store, first_requests, windows, Conventions())
    assert without_index.rows() == expected
    assert per_version_reads == ([] if plan == "one scan" else [2])


def test_histograms_of_parts_merge_into_the_histogram_of_the_whole() -> None:
    values = np.arange(1.0, 2001.0)  # ms
    whole = np.unique(bucket_index(values), return_counts=True)
    parts = [np.unique(bucket_index(part), return_counts=True) for part in (values[:1000], values[1000:])]
    merged = (
        pl.concat([pl.DataFrame({"bucket": b, "n": c}) for b, c in parts])
        .group_by("bucket")
        .agg(pl.col("n").sum())
        .sort("bucket")
    )
    assert merged["bucket"].to_list() == whole[0].tolist() and merged["n"].to_list() == whole[1].tolist()
    sample = BucketSample(merged["bucket"].to_numpy(), merged["n"].to_numpy())
    assert sample.size == 2000
    assert percentile(sample, 0.99) == pytest.approx(float(np.quantile(values, 0.99)), rel=RELATIVE_ERROR)


def test_old_history_tables_gain_the_baseline_columns(raw_store: Store) -> None:
    # A store whose cold-path and retry history tables predate the baseline columns.
    from analytics.persist import MIGRATIONS as PERSIST_MIGRATIONS
    from analytics.persist import history_table
    from storage import apply_schema, registered_migrations

    analytics_v10 = [m for m in PERSIST_MIGRATIONS if m.version == 10]
    apply_schema(raw_store, [m for m in registered_migrations() if m not in analytics_v10])
    columns = {
        "cold_path": ("baseline_jobs", "baseline_p50_s", "baseline_p99_s"),
        "retry_amplification": ("baseline_runs", "baseline_attempt_amplification"),
    }
    for frame, names in columns.items():
        for column in names:
            raw_store.command(f"ALTER TABLE {raw_store.table(history_table(frame))} DROP COLUMN `{column}`")
    scenario = scenario_cold_queues(jobs=50)
    insert_spans(raw_store, scenario.spans)
    analysis = analyze(raw_store, scenario.start, scenario.end)
    run_id = persist_analysis(raw_store, analysis)  # applies v10 first
    rows = raw_store.query_rows(
        f"SELECT queue, jobs, baseline_jobs FROM {raw_store.table(history_table('cold_path'))} "
        "WHERE run_id = {r:String} ORDER BY queue",
        {"r": run_id},
    )
    assert rows == [("doc-summaries", 55, None), ("emails", 50, None)]
    loaded = load_run(raw_store, run_id)
    assert loaded is not None and loaded.cold_path.equals(analysis.cold_path)
