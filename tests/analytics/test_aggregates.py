"""The per-minute aggregates against a full recompute from the spans: a long window's hot-path
percentiles, series and abandonment curve merged from per-minute state equal the exact figures —
counts, sums, rates and the cliff exactly, percentiles within the sketch's 0.5% — across windows
that start and end mid-minute, partly summarised windows, late and repeated spans, sampled data and
a store summarised before the aggregates existed."""

from __future__ import annotations

import math
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from analytics import Analysis, Conventions, analyze, build_summaries
from analytics.sketch import RELATIVE_ERROR, BucketSample, bucket_index
from analytics.stats import percentile
from analytics.summaries import LAYER, summary_coverage
from analytics.summary_tables import AGG_REQUESTS_TABLE, AGG_WORKFLOW_RUNS_TABLE, MINUTES_TABLE
from collectors import insert_spans
from collectors.spans import SpanRow
from storage import Store, ensure_schema, open_store
from tests.analytics.builders import (
    S,
    at,
    dt,
    hot_request,
    scenario_abandonment_cliff,
    scenario_cold_queues,
    scenario_flag_split,
    scenario_llm_regression,
    scenario_retries,
    streamed_request,
)

HOUR = 3600.0
# Windows longer than 30 minutes merge the aggregates; 30 series buckets make a 1 h window's 2 min.
# The streamed operation's abandonment is read against its time to first byte.
STREAMED = ("chat-stream", "POST /chat/stream")
CONV = Conventions(
    exact_horizon=timedelta(minutes=30),
    series_buckets=30,
    abandonment_latency=({"service": "chat-*", "operation": STREAMED[1], "latency": "first_byte"},),
)
START, END = dt(at(HOUR + 17)), dt(at(2 * HOUR + 17))
UNTIL = dt(at(3 * HOUR))


def _spans() -> list[SpanRow]:
    rng = np.random.default_rng(3)
    spans = list(scenario_llm_regression(requests=300).spans)
    cliff = scenario_abandonment_cliff(requests=600).spans
    offset = int((HOUR + 40) * S)
    spans += [replace(s, start_ns=s.start_ns + offset) for s in cliff]
    spans += [replace(s, start_ns=s.start_ns + offset) for s in scenario_retries(runs=60).spans]
    spans += [replace(s, start_ns=s.start_ns + int(50 * S)) for s in scenario_retries(runs=40).spans]
    # Jobs in both windows, some ready minutes after they were enqueued, some never.
    spans += [replace(s, start_ns=s.start_ns + offset) for s in scenario_cold_queues(jobs=300).spans]
    spans += [replace(s, start_ns=s.start_ns + int(50 * S)) for s in scenario_cold_queues(jobs=200).spans]
    flags = scenario_flag_split(requests=300).spans
    spans += [
        replace(
            s,
            start_ns=s.start_ns + offset,
            events=tuple(replace(e, timestamp_ns=e.timestamp_ns + offset) for e in s.events),
        )
        for s in flags
    ]
    # A steady operation with two versions, a release inside the window.
    for i in range(10_000):
        t = i * 0.9
        version = "2.0.0" if t < 1.5 * HOUR else "2.1.0"
        spans += hot_request("steady", "GET /q", at(t), float(rng.lognormal(4.5, 0.6)), version=version)
    spans += _streamed(rng)
    return spans


def _streamed(rng: np.random.Generator, n: int = 2_000) -> list[SpanRow]:
    """A streamed endpoint over both windows: first byte ~400 ms, the rest ~3 s of generation;
    users leave when the first byte is late (past 600 ms), whatever the total."""
    spans: list[SpanRow] = []
    for i in range(n):
        first = float(rng.lognormal(6.0, 0.5))
        total = first + float(rng.lognormal(8.0, 0.3))
        leaves = rng.random() < (0.4 if first > 600 else 0.02)
        spans += streamed_request(*STREAMED, at(i * 3.3), first, total, chunks=4, abandoned=leaves)
    return spans


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("aggregates") / "filled"
    store = open_store("chdb://" + str(root))
    try:
        ensure_schema(store)
        insert_spans(store, _spans())
    finally:
        store.close()
    return root


@pytest.fixture
def store(filled: Path, tmp_path: Path) -> Iterator[Store]:
    shutil.copytree(filled, tmp_path / "store", symlinks=True)
    s = open_store("chdb://" + str(tmp_path / "store"))
    try:
        yield s
    finally:
        s.close()


def _close(got: float | None, want: float | None) -> bool:
    if got is None or want is None:
        return got is None and want is None
    return math.isclose(got, want, rel_tol=RELATIVE_ERROR, abs_tol=1e-9)


def assert_aggregated_equal(got: Analysis, want: Analysis) -> None:
    """The aggregated frames against the exact ones: every count and rate equal, every percentile
    within the sketch's relative error."""
    quantiles = ("p50_ms", "p95_ms", "p99_ms", "p999_ms", "ttfb_p50_ms", "ttfb_p99_ms")
    for name, keys in (
        ("hot_path", ["service", "operation"]),
        ("hot_path_series", ["service", "operation", "bucket_start"]),
    ):
        g, w = got.frames[name].sort(keys), want.frames[name].sort(keys)
        assert g.select(keys).equals(w.select(keys)), name
        exact = [c for c in w.columns if c not in (*quantiles, "p99_tail_samples")]
        assert_frame_equal(g.select(exact), w.select(exact), check_exact=False, rel_tol=1e-12)
        for column in (c for c in quantiles if c in w.columns):
            for a, b in zip(g[column], w[column], strict=True):
                assert _close(a, b), (name, column, a, b)
    assert_frame_equal(got.abandonment, want.abandonment, check_exact=False, rel_tol=1e-12)
    summary_exact = ["service", "operation", "requests", "abandoned", "rate", "cliff_ms"]
    assert_frame_equal(
        got.abandonment_summary.select(summary_exact),
        want.abandonment_summary.select(summary_exact),
        check_exact=False,
        rel_tol=1e-12,
    )
    for a, b in zip(got.abandonment_summary["p99_ms"], want.abandonment_summary["p99_ms"], strict=True):
        assert _close(a, b)
    # The boundary: p99s with and without the synchronous calls within the bound; counts over the
    # budget off by at most the requests within 0.5% of it; the same budgets and recommendations.
    keys = ["service", "operation"]
    g, w = got.boundary.sort(keys), want.boundary.sort(keys)
    exact = ["service", "operation", "requests", "budget_ms", "budget_source", "sync_llm_calls_per_request",
             "sampled_requests", "effective_sample_size", "recommendation"]  # fmt: skip
    assert_frame_equal(g.select(exact), w.select(exact), check_exact=False, rel_tol=1e-12)
    for column in ("p99_ms", "p99_without_sync_llm_ms"):
        for a, b in zip(g[column], w[column], strict=True):
            assert _close(a, b), (column, a, b)
    for column in ("requests_over_budget", "requests_over_budget_without_sync_llm"):
        for a, b in zip(g[column], w[column], strict=True):
            assert (a is None) == (b is None) and (a is None or abs(a - b) <= 2 + 0.01 * b), (column, a, b)
    for a, b in zip(g["abandoned_saved_per_day"], w["abandoned_saved_per_day"], strict=True):
        assert (a is None) == (b is None) and (a is None or abs(a - b) <= 0.02 * abs(b) + 1.0), (a, b)
    # The slices read only the flagged requests, the retries merge per-minute sums: the same
    # figures exactly.
    assert_frame_equal(got.slices, want.slices)
    # The jobs reduced in SQL: the same jobs, so the same cold-path figures.
    for name in ("cold_path", "cold_path_series", "cold_path_cdf"):
        assert_frame_equal(got.frames[name], want.frames[name], check_exact=False, rel_tol=1e-12)
    assert_frame_equal(got.retry_hops, want.retry_hops, check_exact=False, rel_tol=1e-12)
    assert_frame_equal(got.retry_amplification, want.retry_amplification, check_exact=False, rel_tol=1e-12)
    # The attribution: the p99s within the bound, the counts exact, the same verdicts (its tail
    # traces are the walked top requests of each minute: the same traces here).
    g, w = got.attribution.sort(keys), want.attribution.sort(keys)
    exact = ["service", "operation", "baseline_requests", "current_requests", "verdict"]
    assert g.select(exact).equals(w.select(exact)), (g, w)
    for column in ("baseline_p99_ms", "current_p99_ms"):
        for a, b in zip(g[column], w[column], strict=True):
            assert _close(a, b), (column, a, b)
    for a, b in zip(g["llm_delta_ms"], w["llm_delta_ms"], strict=True):
        assert abs(a - b) <= 0.01 * abs(b) + 5.0, (a, b)
    gr, wr = got.boundary_releases, want.boundary_releases
    assert gr.select("service", "operation", "version", "released_at", "requests").equals(
        wr.select("service", "operation", "version", "released_at", "requests")
    )
    for a, b in zip(gr["p99_ms"], wr["p99_ms"], strict=True):
        assert _close(a, b)


def _pair(store: Store, start: datetime, end: datetime) -> tuple[Analysis, Analysis]:
    return (
        analyze(store, start, end, conventions=CONV),
        analyze(store, start, end, conventions=CONV, use_summaries=False),
    )


def test_the_sketch_holds_its_bound_on_any_sample() -> None:
    rng = np.random.default_rng(1)
    for _ in range(100):
        x = rng.lognormal(rng.uniform(0, 8), rng.uniform(0.1, 2.0), size=int(rng.integers(1, 3000)))
        buckets, counts = np.unique(bucket_index(x), return_counts=True)
        sample = BucketSample(buckets, counts)
        for q in (0.5, 0.9, 0.99, 0.999):
            exact = float(np.quantile(x, q))
            assert abs((percentile(sample, q) or 0.0) - exact) <= RELATIVE_ERROR * exact + 1e-12


def test_a_long_window_merged_from_aggregates_equals_the_full_recompute(store: Store) -> None:
    build = build_summaries(store, until=UNTIL, conventions=CONV)
    assert build.rows[AGG_REQUESTS_TABLE] > 0
    assert build.rows[AGG_WORKFLOW_RUNS_TABLE] > 0
    # Minutes × (service, operation, version): far fewer rows than requests.
    requests = store.query_value("SELECT sum(requests) FROM tailwatch_agg_requests")
    assert build.rows[AGG_REQUESTS_TABLE] < requests / 3
    got, want = _pair(store, START, END)
    assert want.hot_path.height >= 3 and want.abandonment.height > 10
    assert (
        want.boundary["budget_ms"].is_not_null().any()
        and (want.boundary["sync_llm_calls_per_request"] > 0).any()
    )
    assert want.slices.height >= 2
    assert want.cold_path["pending"].sum() > 0 and want.cold_path["baseline_jobs"].sum() > 0
    assert want.retry_amplification["runs"].sum() > 0 and want.retry_amplification["baseline_runs"].sum() > 0
    assert_aggregated_equal(got, want)
    # Whole minutes too, and a window holding the release.
    assert_aggregated_equal(*_pair(store, dt(at(HOUR)), dt(at(2 * HOUR))))


def test_a_partly_summarised_window_merges_aggregates_with_rows(store: Store) -> None:
    build_summaries(store, until=dt(at(1.5 * HOUR)), conventions=CONV)
    assert summary_coverage(store, layer=LAYER)[-1][1] == dt(at(1.5 * HOUR))
    assert_aggregated_equal(*_pair(store, START, END))


def test_late_and_repeated_spans_are_merged_once(store: Store) -> None:
    build_summaries(store, until=UNTIL, conventions=CONV)
    # 40 late requests inside the window, then one of them exported twice.
    late = [
        s
        for i in range(40)
        for s in hot_request("steady", "GET /q", at(HOUR + 600 + i), 5000.0, version="2.0.0")
    ]
    insert_spans(store, late)
    insert_spans(store, late[:2])
    again = build_summaries(store, until=UNTIL, conventions=CONV)
    assert again.resummarised > 0
    got, want = _pair(store, START, END)
    assert_aggregated_equal(got, want)
    steady = want.hot_path.filter(pl.col("service") == "steady")["requests"].item()
    assert got.hot_path.filter(pl.col("service") == "steady")["requests"].item() == steady


def test_sampled_requests_merge_their_weights(store: Store) -> None:
    sampled = [
        replace(s, attributes={**s.attributes, "SampleRate": "10"}) if s.parent_span_id == "" else s
        for i in range(300)
        for s in hot_request("sampled", "POST /s", at(HOUR + 30 + i * 10), 100.0 + (i % 97) * 7)
    ]
    insert_spans(store, sampled)
    build_summaries(store, until=UNTIL, conventions=CONV)
    got, want = _pair(store, START, END)
    row = want.hot_path.filter(pl.col("service") == "sampled").row(0, named=True)
    assert row["requests"] == 3000 and row["sampled_requests"] == 300
    assert_aggregated_equal(got, want)


def test_minutes_summarised_before_the_aggregates_are_summarised_again(store: Store) -> None:
    build_summaries(store, until=UNTIL, conventions=CONV)
    # As a store summarised by an earlier version: no aggregates, minutes recorded with layer 0.
    store.command(f"TRUNCATE TABLE {store.table(AGG_REQUESTS_TABLE)}")
    store.command(
        f"INSERT INTO {store.table(MINUTES_TABLE)} (minute, spans, built_at, layer) "
        "SELECT minute, argMax(spans, built_at), max(built_at) + toIntervalMillisecond(1), 0 "
        f"FROM {store.table(MINUTES_TABLE)} GROUP BY minute"
    )
    assert summary_coverage(store, layer=LAYER) == []
    got_raw = analyze(store, START, END, conventions=CONV)  # no aggregates: the rows, exactly
    want = analyze(store, START, END, conventions=CONV, use_summaries=False)
    assert_aggregated_equal(got_raw, want)
    rebuilt = build_summaries(store, until=UNTIL, conventions=CONV)
    assert rebuilt.resummarised > 0
    assert summary_coverage(store, layer=LAYER) == summary_coverage(store)
    assert_aggregated_equal(analyze(store, START, END, conventions=CONV), want)


def _counted_twice(store: Store) -> int:
    """Aggregate rows of a (minute, service, operation, version) that has more than one."""
    return int(
        store.query_value(
            "SELECT count() FROM (SELECT start FROM tailwatch_agg_requests "
            "GROUP BY start, service, operation, version HAVING count() > 1)"
        )
    )


def test_a_build_killed_mid_way_then_run_again_counts_every_minute_once(filled: Path, tmp_path: Path) -> None:
    """`kill -9` of `tailwatch summaries build` after a few chunks (small ones: many of them), then
    the same command again: no minute counted twice or missing."""
    path = tmp_path / "store"
    shutil.copytree(filled, path, symlinks=True)
    dsn = "chdb://" + str(path)
    (tmp_path / "tailwatch.toml").write_text("[analysis.conventions]\nsummary_chunk_spans = 1500\n")
    command = [
        sys.executable,
        "-m",
        "tailwatch",
        "summaries",
        "build",
        "--store",
        dsn,
        "--until",
        UNTIL.isoformat(),
    ]
    proc = subprocess.Popen(
        command, cwd=tmp_path, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
    )
    assert proc.stderr is not None
    started = 0
    for line in proc.stderr:
        started += "summarising" in line
        if started == 4:  # the fourth chunk is being written
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert started == 4, "the build ended before it could be killed"
    with open_store(dsn) as store:
        half = summary_coverage(store)
        assert half and half[-1][1] < UNTIL  # it stopped part-way
    again = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    with open_store(dsn) as store:
        assert summary_coverage(store) == [(half[0][0], UNTIL)]
        assert _counted_twice(store) == 0
        got, want = _pair(store, START, END)
        assert_aggregated_equal(got, want)
        exact = analyze(store, START, START + timedelta(minutes=20), conventions=CONV)
        full = analyze(store, START, START + timedelta(minutes=20), conventions=CONV, use_summaries=False)
        assert exact.to_dict() == full.to_dict()


def test_two_builds_racing_on_one_store_count_every_minute_once(store: Store) -> None:
    results: list[Any] = []
    threads = [
        threading.Thread(target=lambda: results.append(build_summaries(store, until=UNTIL, conventions=CONV)))
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.minutes for r in results) == [
        0,
        int((UNTIL - summary_coverage(store)[0][0]) / timedelta(minutes=1)),
    ]
    assert_aggregated_equal(*_pair(store, START, END))
    assert _counted_twice(store) == 0


def test_a_build_that_dies_between_writing_rows_and_recording_them_is_redone(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worst moment to die: a chunk's rows written, its minutes not yet recorded as done."""
    import analytics.summaries as summaries

    real = summaries.record_release_times
    calls = {"n": 0}

    def dies_on_the_third(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt  # as good as a kill: nothing after it runs
        return real(*args, **kwargs)

    small = replace(CONV, summary_chunk_spans=1500)
    monkeypatch.setattr(summaries, "record_release_times", dies_on_the_third)
    with pytest.raises(KeyboardInterrupt):
        build_summaries(store, until=UNTIL, conventions=small)
    assert _counted_twice(store) == 0 and store.query_value("SELECT count() FROM tailwatch_agg_requests") > 0
    monkeypatch.setattr(summaries, "record_release_times", real)
    again = build_summaries(store, until=UNTIL, conventions=small)
    assert again.minutes > 0
    assert _counted_twice(store) == 0
    assert_aggregated_equal(*_pair(store, START, END))


def test_summaries_answer_only_analyses_with_their_span_conventions(store: Store) -> None:
    """Summaries reduced with one set of span conventions never answer an analysis with another:
    it reads spans (the right figures); a build keeping others leaves them; a build with the new
    conventions summarises every minute again."""
    build_summaries(store, until=UNTIL, conventions=CONV)
    other = replace(CONV, abandon_status_codes=("504",))  # another idea of an abandoned request
    assert other.summary_key() != CONV.summary_key()
    assert replace(CONV, min_delta_ms=1.0).summary_key() == CONV.summary_key()  # read-time only
    got = analyze(store, START, END, conventions=other)
    want = analyze(store, START, END, conventions=other, use_summaries=False)
    assert got.to_dict() == want.to_dict()
    assert (
        got.abandonment_summary["abandoned"].sum()
        != analyze(store, START, END, conventions=CONV).abandonment_summary["abandoned"].sum()
    )
    kept = build_summaries(store, until=UNTIL, conventions=other, keep_others=True)
    assert kept.others and kept.minutes == 0 and summary_coverage(store, conventions=other) == []
    adopted = build_summaries(store, until=UNTIL, conventions=other)
    assert adopted.resummarised > 0
    assert summary_coverage(store, conventions=other) == summary_coverage(store)
    assert summary_coverage(store, conventions=CONV) == []
    assert_aggregated_equal(analyze(store, START, END, conventions=other), want)
