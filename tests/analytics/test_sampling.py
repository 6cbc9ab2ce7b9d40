"""Sampled trace data: counts and percentiles weighted by the sample rate, against a known population.

One population of hot-path requests (lognormal latencies, abandonment rising past 600 ms) is written
whole to one store, a 1-in-10 subset of it with ClickStack's ``SampleRate`` attribute to a second and
another 1-in-10 subset with OpenTelemetry's threshold ``ot=th:e6666666666666`` (p = 0.1) to a third.
The truth is computed from the population with numpy; the sampled stores must give it back.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from analytics import (
    Analysis,
    Conventions,
    analyze,
    build_summaries,
    latency_good_total,
    load_run,
    persist_analysis,
)
from analytics._common import Windows
from analytics.attribution import tail_traces, window_stats
from analytics.hot_path import request_stats, weighted_quantiles
from analytics.llm_spans import fetch_roots
from analytics.persist import MIGRATIONS as PERSIST_MIGRATIONS
from analytics.persist import history_table
from analytics.report import render_table
from analytics.sketch import RELATIVE_ERROR
from analytics.summary_tables import AGG_REQUESTS_TABLE
from collectors.spans import SpanRow, insert_spans
from storage import Store, apply_schema, ensure_schema, open_store, registered_migrations
from tests.analytics.builders import at, dt, hot_request

HOUR = 3600.0
TH_TENTH = "ot=th:e6666666666666"  # rejection threshold 0.9 · 2^56: p = 0.1
BUDGET_MS = 600.0
# (service, operation, population, median ms, sigma): the chat operation carries the p99 checks; the
# small health check is what a sampled store keeps too little of for a p99.
OPERATIONS = (
    ("chat-api", "POST /chat", 36_000, 400.0, 0.3),
    ("chat-api", "GET /search", 8_000, 120.0, 0.5),
    ("web", "GET /health", 2_000, 5.0, 0.2),
)
CONVENTIONS = Conventions(latency_budgets=(("chat-api", "POST /chat", BUDGET_MS),))


@dataclass(frozen=True)
class Population:
    roots: list[SpanRow]
    latency_ms: np.ndarray
    abandoned: np.ndarray
    operation: np.ndarray  # index into OPERATIONS
    kept_rate: np.ndarray  # indices of the 1-in-10 subset written with SampleRate
    kept_th: np.ndarray  # indices of the 1-in-10 subset written with the TraceState threshold


def _population(seed: int = 20261102) -> Population:
    rng = np.random.default_rng(seed)
    roots: list[SpanRow] = []
    latency: list[np.ndarray] = []
    abandoned: list[np.ndarray] = []
    operation: list[np.ndarray] = []
    kept_rate: list[np.ndarray] = []
    kept_th: list[np.ndarray] = []
    for index, (service, name, n, median, sigma) in enumerate(OPERATIONS):
        ms = np.round(rng.lognormal(np.log(median), sigma, n), 3)
        gone = rng.random(n) < np.where(ms > BUDGET_MS, 0.28, 0.03)
        starts = np.sort(rng.uniform(0.0, HOUR - 1.0, n))
        offset = len(roots)
        roots += [
            hot_request(service, name, at(float(s)), float(d), abandoned=bool(a))[0]
            for s, d, a in zip(starts, ms, gone, strict=True)
        ]
        latency.append(ms)
        abandoned.append(gone)
        operation.append(np.full(n, index))
        # Exactly one in ten of each operation (stratified), two independent draws.
        kept_rate.append(offset + np.sort(rng.choice(n, n // 10, replace=False)))
        kept_th.append(offset + np.sort(rng.choice(n, n // 10, replace=False)))
    return Population(
        roots,
        np.concatenate(latency),
        np.concatenate(abandoned),
        np.concatenate(operation),
        np.concatenate(kept_rate),
        np.concatenate(kept_th),
    )


@dataclass(frozen=True)
class Run:
    analysis: Analysis
    good_total: pl.DataFrame
    aggregates: tuple[int, int]  # requests and abandoned of POST /chat in the per-minute aggregates
    aggregated: Analysis  # the hour merged from the aggregates


def _run(path: Path, roots: list[SpanRow]) -> Run:
    """Write ``roots`` to a fresh embedded store, analyse the hour, summarise it and analyse it again
    from the per-minute aggregates (one store open at a time: the embedded engine allows one per
    process)."""
    store = open_store("chdb://" + str(path))
    try:
        ensure_schema(store)
        insert_spans(store, roots)
        analysis = analyze(store, dt(at(0)), dt(at(HOUR)), conventions=CONVENTIONS)
        good_total = latency_good_total(store, dt(at(0)), dt(at(HOUR)), BUDGET_MS, CONVENTIONS)
        build_summaries(store, until=dt(at(HOUR + 600)), conventions=CONVENTIONS)
        requests, abandoned = store.query_rows(
            f"SELECT toInt64(round(sum(weight))), toInt64(round(sum(abandoned))) "
            f"FROM {store.table(AGG_REQUESTS_TABLE)} WHERE operation = 'POST /chat'"
        )[0]
        merged = replace(CONVENTIONS, exact_horizon=timedelta(minutes=30), series_buckets=30)
        aggregated = analyze(store, dt(at(0)), dt(at(HOUR)), conventions=merged)
        return Run(analysis, good_total, (int(requests), int(abandoned)), aggregated)
    finally:
        store.close()


@dataclass(frozen=True)
class Stores:
    population: Population
    full: Run
    rate: Run
    th: Run


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Stores:
    pop = _population()
    base = tmp_path_factory.mktemp("sampling")
    by_rate = [
        replace(pop.roots[i], attributes={**pop.roots[i].attributes, "SampleRate": "10"})
        for i in pop.kept_rate
    ]
    by_th = [replace(pop.roots[i], trace_state=TH_TENTH) for i in pop.kept_th]
    return Stores(
        pop,
        _run(base / "full", pop.roots),
        _run(base / "rate", by_rate),
        _run(base / "th", by_th),
    )


def _row(frame: pl.DataFrame, **where: object) -> dict[str, Any]:
    for key, value in where.items():
        frame = frame.filter(pl.col(key) == value)
    assert frame.height == 1, (where, frame)
    return frame.row(0, named=True)


def _kept(pop: Population, kept: np.ndarray, op: int) -> np.ndarray:
    return kept[pop.operation[kept] == op]


def _subsets(stores: Stores) -> list[tuple[str, Run, np.ndarray]]:
    return [
        ("SampleRate", stores.rate, stores.population.kept_rate),
        ("th", stores.th, stores.population.kept_th),
    ]


# --- the full population: exact, unweighted, no warning ---------------------------------------------


def test_unsampled_population_is_exact_and_never_warned(stores: Stores) -> None:
    pop = stores.population
    for op, (service, name, n, _, _) in enumerate(OPERATIONS):
        row = _row(stores.full.analysis.hot_path, service=service, operation=name)
        truth = pop.latency_ms[pop.operation == op]
        assert row["requests"] == row["sampled_requests"] == n
        assert row["effective_sample_size"] == float(n)
        assert row["p99_ms"] == pytest.approx(float(np.quantile(truth, 0.99)), rel=1e-12)
        assert row["p99_tail_samples"] == int((truth >= row["p99_ms"]).sum())
        assert row["p99_warning"] is False
    assert not stores.full.analysis.boundary["p99_warning"].any()
    text = render_table(stores.full.analysis.to_dict())
    assert "exact percentiles" in text and "n_eff" not in text and "rough" not in text


# --- the sampled stores ---------------------------------------------------------------------------


@pytest.mark.parametrize("convention", ["SampleRate", "th"])
def test_weighted_counts_are_ten_times_the_kept_requests(stores: Stores, convention: str) -> None:
    pop = stores.population
    run, kept = {"SampleRate": (stores.rate, pop.kept_rate), "th": (stores.th, pop.kept_th)}[convention]
    series = run.analysis.hot_path_series
    for op, (service, name, n, _, _) in enumerate(OPERATIONS):
        mine = _kept(pop, kept, op)
        row = _row(run.analysis.hot_path, service=service, operation=name)
        assert row["sampled_requests"] == mine.size
        assert row["requests"] == 10 * mine.size
        assert abs(row["requests"] - n) <= 0.01 * n
        # Equal weights: Kish's effective sample size is the stored count.
        assert row["effective_sample_size"] == pytest.approx(mine.size, rel=1e-9)
        per_op = series.filter((pl.col("service") == service) & (pl.col("operation") == name))
        assert per_op["requests"].sum() == 10 * mine.size
        assert per_op["sampled_requests"].sum() == mine.size
        ab = _row(run.analysis.abandonment_summary, service=service, operation=name)
        assert ab["requests"] == 10 * mine.size
        assert ab["abandoned"] == 10 * int(pop.abandoned[mine].sum())
        buckets = run.analysis.abandonment.filter(
            (pl.col("service") == service) & (pl.col("operation") == name)
        )
        assert buckets["requests"].sum() == 10 * mine.size
        assert buckets["sampled_requests"].sum() == mine.size
    chat = _kept(pop, kept, 0)
    good_total = _row(run.good_total, service="chat-api", operation="POST /chat")
    assert good_total["total"] == 10 * chat.size
    assert good_total["good"] == 10 * int((pop.latency_ms[chat] < BUDGET_MS).sum())
    boundary = _row(run.analysis.boundary, service="chat-api", operation="POST /chat")
    over = int((pop.latency_ms[chat] >= BUDGET_MS).sum())
    assert boundary["requests"] == 10 * chat.size
    assert boundary["requests_over_budget"] == 10 * over
    assert boundary["requests_over_budget_per_day"] == pytest.approx(10 * over * 24)
    assert boundary["sampled_requests"] == chat.size
    assert any(r.startswith(f"sampled: {chat.size:,} stored requests stand for") for r in boundary["reasons"])
    # The aggregates record each request with the requests it stands for.
    requests, abandoned = run.aggregates
    assert (requests, abandoned) == (10 * chat.size, 10 * int(pop.abandoned[chat].sum()))


def test_weighted_p99_and_abandonment_are_close_to_the_population(stores: Stores) -> None:
    pop = stores.population
    chat = pop.operation == 0
    truth_p99 = float(np.quantile(pop.latency_ms[chat], 0.99))
    truth_rate = float(pop.abandoned[chat].mean())
    truth_over = int((pop.latency_ms[chat] >= BUDGET_MS).sum())
    full = _row(stores.full.analysis.boundary, service="chat-api", operation="POST /chat")
    assert full["requests_over_budget"] == truth_over
    for convention, run, kept in _subsets(stores):
        row = _row(run.analysis.hot_path, service="chat-api", operation="POST /chat")
        assert row["p99_ms"] == pytest.approx(truth_p99, rel=0.05), convention
        assert row["p99_warning"] is False
        assert row["p99_tail_samples"] >= CONVENTIONS.min_sampled_tail
        # The weighted percentile of equal weights is the sample's own quantile of its repeated values.
        mine = np.sort(pop.latency_ms[_kept(pop, kept, 0)])
        assert row["p99_ms"] == pytest.approx(float(np.quantile(np.repeat(mine, 10), 0.99)), rel=1e-9)
        assert row["p50_ms"] == pytest.approx(float(np.quantile(pop.latency_ms[chat], 0.5)), rel=0.03)
        ab = _row(run.analysis.abandonment_summary, service="chat-api", operation="POST /chat")
        assert ab["rate"] == pytest.approx(truth_rate, abs=0.012), convention
        assert ab["p99_ms"] == row["p99_ms"]
        boundary = _row(run.analysis.boundary, service="chat-api", operation="POST /chat")
        assert boundary["p99_ms"] == row["p99_ms"]
        assert boundary["requests_over_budget"] == pytest.approx(truth_over, rel=0.15)
        # The aggregates' p99 (a histogram of weighted counts) is within the sketch's bound of the
        # exact weighted one, and every count and the sample behind it are the same.
        merged = _row(run.aggregated.hot_path, service="chat-api", operation="POST /chat")
        assert merged["p99_ms"] == pytest.approx(row["p99_ms"], rel=RELATIVE_ERROR)
        for column in ("requests", "sampled_requests", "effective_sample_size", "sync_llm_calls_per_request"):
            assert merged[column] == pytest.approx(row[column], rel=1e-12), column
        assert_frame_equal(
            run.aggregated.abandonment, run.analysis.abandonment, check_exact=False, rel_tol=1e-12
        )


def test_a_p99_on_too_few_sampled_requests_is_warned(stores: Stores) -> None:
    pop = stores.population
    for _, run, kept in _subsets(stores):
        row = _row(run.analysis.hot_path, service="web", operation="GET /health")
        assert row["sampled_requests"] == _kept(pop, kept, 2).size == 200
        assert row["p99_tail_samples"] < CONVENTIONS.min_sampled_tail
        assert row["p99_warning"] is True
        data = json.loads(run.analysis.to_json())
        [health] = [h for h in data["hot_path"] if h["operation"] == "GET /health"]
        assert health["p99_warning"] is True and health["sampled_requests"] == 200
        text = render_table(data)
        assert "weighted by the sample rate" in text and "n_eff" in text
        assert "web GET /health: the p99 rests on" in text
        assert "POST /chat: the p99 rests on" not in text


# --- the weight read from the spans -------------------------------------------------------------------


def test_weight_of_each_sampling_convention(store: Store) -> None:
    # (span attributes, trace state, expected weight)
    cases: list[tuple[dict[str, str], str, float]] = [
        ({}, "", 1.0),
        ({"SampleRate": "10"}, "", 10.0),
        ({"SampleRate": "1"}, "ot=th:8", 2.0),  # a rate of 1 is no rate: the threshold decides
        ({"SampleRate": "5"}, "ot=th:8", 5.0),  # the rate attribute wins
        ({"SampleRate": "n/a"}, "", 1.0),
        ({}, "ot=th:0", 1.0),
        ({}, "ot=th:8", 2.0),
        ({}, "ot=th:c", 4.0),
        ({}, TH_TENTH, 10.0),
        ({}, "ot=rv:abcdef01234567;th:c", 4.0),  # other sub-keys before it
        ({}, "ot=th:c;rv:abcdef01234567", 4.0),  # … and after it
        ({}, "vendor=x,ot=th:c", 4.0),  # other vendors' entries
        ({}, "vendor=x, ot=th:8,other=y", 2.0),
        ({}, "xot=th:8", 1.0),  # not the ot entry
        ({}, "ot=th:", 1.0),  # no digits
        ({}, "ot=th:fffffffffffffff", 1.0),  # 15 digits: malformed, ignored
        ({}, "ot=rv:abcdef01234567", 1.0),  # randomness without a threshold
    ]
    roots = []
    for i, (attributes, trace_state, _) in enumerate(cases):
        root = hot_request("api", f"op {i:02d}", at(i), 10.0)[0]
        roots.append(replace(root, attributes={**root.attributes, **attributes}, trace_state=trace_state))
    insert_spans(store, roots)
    windows = Windows.of(dt(at(0)), dt(at(100)))
    weights = dict(fetch_roots(store, windows, Conventions()).select("operation", "weight").iter_rows())
    for i, (_, _, expected) in enumerate(cases):
        assert weights[f"op {i:02d}"] == pytest.approx(expected, rel=1e-12), cases[i]
    # The attribute's name is a convention.
    renamed = dict(
        fetch_roots(store, windows, Conventions(sample_rate_attribute="sample.rate"))
        .select("operation", "weight")
        .iter_rows()
    )
    assert renamed["op 01"] == 1.0 and renamed["op 02"] == 2.0


# --- the pure parts -----------------------------------------------------------------------------------


def test_weighted_quantiles_generalise_type_7() -> None:
    rng = np.random.default_rng(5)
    a, b = np.sort(rng.lognormal(3, 1, 101)), np.sort(rng.normal(50, 5, 7))
    values, bounds = np.r_[a, b], np.array([0, a.size, a.size + b.size])
    qs = [0.0, 0.5, 0.95, 0.99, 0.999, 1.0]
    ones = weighted_quantiles(values, np.ones(values.size), bounds, qs)
    for g, part in enumerate((a, b)):
        assert ones[g] == pytest.approx(np.quantile(part, qs), rel=1e-12)
    # Integer weights: the quantiles of the population with each value repeated that many times.
    w = rng.integers(1, 20, values.size).astype(np.float64)
    weighted = weighted_quantiles(values, w, bounds, qs)
    for g, (lo, hi) in enumerate(((0, a.size), (a.size, a.size + b.size))):
        expanded = np.repeat(values[lo:hi], w[lo:hi].astype(np.int64))
        assert weighted[g] == pytest.approx(np.quantile(expanded, qs), rel=1e-12)


def test_request_stats_with_unequal_weights() -> None:
    # 90 requests at 100 ms stored unsampled, 10 at 1000 ms stored 1-in-10: the population is 90 fast
    # and 100 slow requests, and the sample holds 100 spans of which 10 carry most of the weight.
    frame = pl.DataFrame(
        {
            "service": ["s"] * 100,
            "operation": ["o"] * 100,
            "duration_ms": [100.0] * 90 + [1000.0] * 10,
            "weight": [1.0] * 90 + [10.0] * 10,
            "sync_llm_calls": [0] * 90 + [1] * 10,
        }
    )
    row = request_stats(frame, ["service", "operation"], {"p50_ms": 0.5, "p99_ms": 0.99}, 10).row(
        0, named=True
    )
    assert row["requests"] == 190 and row["sampled_requests"] == 100
    assert row["p50_ms"] == 1000.0 and row["p99_ms"] == 1000.0
    assert row["sync_llm_calls_per_request"] == pytest.approx(100 / 190)
    assert row["effective_sample_size"] == pytest.approx(190**2 / (90 + 10 * 100))
    assert row["p99_tail_samples"] == 10 and row["p99_warning"] is False
    # Without the weights the same frame is unsampled: exact, unwarned.
    plain = request_stats(frame.drop("weight"), ["service", "operation"], {"p99_ms": 0.99}, 10).row(
        0, named=True
    )
    assert (plain["requests"], plain["effective_sample_size"], plain["p99_warning"]) == (100, 100.0, False)
    assert plain["p99_ms"] == pytest.approx(float(np.quantile([100.0] * 90 + [1000.0] * 10, 0.99)))


def test_attribution_reads_the_weighted_p99_and_tail() -> None:
    # Per window: 990 requests stored unsampled at 100-109 ms, 10 slow ones (2,000 ms) stored 1-in-50.
    # Unweighted, the p99 sits at the slow requests' edge; weighted, 500 of 1,490 requests are slow,
    # so the p99 is 2,000 ms and only the slow requests are the tail.
    rows = []
    for window in ("baseline", "current"):
        for i in range(1000):
            slow = i >= 990
            rows.append(
                {
                    "service": "s",
                    "operation": "o",
                    "window": window,
                    "trace_key": i + (0 if window == "baseline" else 10_000),
                    "duration_ms": 2000.0 if slow else 100.0 + i % 10,
                    "start": dt(at(i)),
                    "weight": 50.0 if slow else 1.0,
                }
            )
    requests = pl.DataFrame(rows, schema_overrides={"trace_key": pl.UInt64})
    conv = Conventions()
    stats = window_stats(requests, conv).filter(pl.col("window") == "current").row(0, named=True)
    assert stats["n"] == 1490 and stats["p99"] == 2000.0
    tails = tail_traces(requests, conv)
    assert tails["duration_ms"].unique().to_list() == [2000.0] and tails.height == 20
    # Unweighted (the same rows without the column), the classic p99 and tail.
    plain = (
        window_stats(requests.drop("weight"), conv).filter(pl.col("window") == "current").row(0, named=True)
    )
    assert plain["n"] == 1000 and plain["p99"] == pytest.approx(
        float(np.quantile(requests.filter(pl.col("window") == "current")["duration_ms"].to_numpy(), 0.99))
    )


def test_attribution_p99s_are_the_hot_path_p99s_of_sampled_data(stores: Stores) -> None:
    for _, run, _ in _subsets(stores):
        analysis = run.analysis
        assert analysis.attribution.height == len(OPERATIONS)
        for a in analysis.attribution.iter_rows(named=True):
            hot = _row(analysis.hot_path, service=a["service"], operation=a["operation"])
            assert a["current_p99_ms"] == pytest.approx(hot["p99_ms"], rel=1e-9)
            assert a["current_requests"] == hot["requests"]


# --- persisted runs ---------------------------------------------------------------------------------------


def test_old_hot_path_history_tables_gain_the_sample_columns(raw_store: Store) -> None:
    # A store whose hot-path history table predates the sample columns: made by the earlier
    # migrations, then without them, as it was.
    analytics_v9 = [m for m in PERSIST_MIGRATIONS if m.version == 9]
    earlier = [m for m in registered_migrations() if m not in analytics_v9]
    apply_schema(raw_store, earlier)
    table = raw_store.table(history_table("hot_path"))
    for column in ("sampled_requests", "effective_sample_size", "p99_tail_samples", "p99_warning"):
        raw_store.command(f"ALTER TABLE {table} DROP COLUMN `{column}`")
    insert_spans(raw_store, [hot_request("api", "GET /a", at(i), 10.0 + i)[0] for i in range(50)])
    analysis = analyze(raw_store, dt(at(0)), dt(at(100)))
    run_id = persist_analysis(raw_store, analysis)  # applies v9 first
    rows = raw_store.query_rows(
        f"SELECT requests, sampled_requests, effective_sample_size, p99_warning FROM {table} "
        "WHERE run_id = {r:String}",
        {"r": run_id},
    )
    assert rows == [(50, 50, 50.0, False)]
    loaded = load_run(raw_store, run_id)
    assert loaded is not None and loaded.hot_path.equals(analysis.hot_path)


def test_a_run_persisted_before_the_sample_columns_loads_with_them_empty() -> None:
    old = pl.DataFrame(
        {
            "service": ["api"],
            "operation": ["GET /a"],
            "requests": [50],
            "p50_ms": [1.0],
            "p95_ms": [2.0],
            "p99_ms": [3.0],
            "p999_ms": [4.0],
            "sync_llm_calls_per_request": [0.0],
        }
    )
    buffer = io.BytesIO()
    old.write_ipc(buffer)
    window = {
        "start": dt(at(0)),
        "end": dt(at(100)),
        "baseline_start": dt(at(-100)),
        "baseline_end": dt(at(0)),
    }
    loaded = Analysis.from_frame_bytes(window, {"hot_path": buffer.getvalue()})
    row = loaded.hot_path.row(0, named=True)
    assert row["requests"] == 50 and row["sampled_requests"] is None and row["p99_warning"] is None
    hot = loaded.to_dict()["hot_path"][0]
    assert hot["sampled_requests"] is None
    assert "HOT PATH (latency ms; exact percentiles" in render_table(loaded.to_dict())
