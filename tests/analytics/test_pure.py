"""The metric functions are pure: tiny frames in, known frames out, no store."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import polars as pl
import pytest

from analytics import Conventions
from analytics._common import first_of_each
from analytics.abandonment import abandonment, abandonment_summary, cliff
from analytics.attribution import attribute, critical_path, llm_causes, tail_traces
from analytics.cold_path import cold_path_cdf, cold_path_summary, jobs_from_raw, jobs_from_spans
from analytics.releases import release_coupling
from analytics.retries import retry_metrics
from analytics.stats import bootstrap_quantile_delta, percentile, slope, spearman, wilson_interval

T = datetime(2026, 1, 1, tzinfo=UTC)


def _key(name: str) -> int:
    """A span's 64-bit key from a short readable name ('' → 0, the key of no span)."""
    return int.from_bytes(name.encode(), "big")


def _name(key: int) -> str:
    return key.to_bytes((key.bit_length() + 7) // 8, "big").decode()


def _spans(rows: list[tuple[str, str, str, str, int, int, bool]]) -> pl.DataFrame:
    """(span, parent, name, kind, start_ms, end_ms, is_llm) of one trace, the spans named by their keys."""
    return pl.DataFrame(
        {
            "trace_key": [1] * len(rows),
            "trace_id": ["t" if not r[1] else "" for r in rows],
            "span_key": [_key(r[0]) for r in rows],
            "parent_key": [_key(r[1]) for r in rows],
            "name": [r[2] for r in rows],
            "kind": [r[3] for r in rows],
            "start_ns": [r[4] * 1_000_000 for r in rows],
            "end_ns": [r[5] * 1_000_000 for r in rows],
            "is_llm": [r[6] for r in rows],
            "is_structure": [False] * len(rows),
            "provider": ["openai" if r[6] else "" for r in rows],
            "model": ["gpt-4o" if r[6] else "" for r in rows],
        }
    )


def _credit(path: pl.DataFrame) -> dict[str, float]:
    return {_name(r["span_key"]): r["critical_ns"] / 1e6 for r in path.iter_rows(named=True)}


def test_critical_path_sequential_parallel_overflow_and_consumer() -> None:
    #  root 0..100: a 10..30, parallel b 35..60 and llm c 40..80 (c ends last), d 70..120 overflows
    #  the root (clipped to 100), e is a Consumer child (pruned), c has an HTTP child 45..75.
    spans = _spans(
        [
            ("root", "", "GET /", "Server", 0, 100, False),
            ("a", "root", "auth", "Internal", 10, 30, False),
            ("b", "root", "db", "Client", 35, 60, False),
            ("c", "root", "chat gpt-4o", "Client", 40, 80, True),
            ("h", "c", "POST", "Client", 45, 75, False),
            ("d", "root", "render", "Internal", 85, 120, False),
            ("e", "root", "process q", "Consumer", 0, 100, False),
        ]
    )
    path = critical_path(spans)
    credit = _credit(path)
    # Walking back from 100: d (85..100 clipped) → root owns 80..85 → c (40..80; h owns 45..75)
    # → b ended at 60 > 40, skipped → a (10..30) → root owns 30..40 and 0..10.
    assert credit["d"] == 15.0
    assert credit["c"] == 10.0 and credit["h"] == 30.0
    assert credit["b"] == 0.0 and credit["e"] == 0.0
    assert credit["a"] == 20.0
    assert credit["root"] == 5.0 + 10.0 + 10.0
    assert sum(credit.values()) == 100.0
    rows = {_name(r["span_key"]): r for r in path.iter_rows(named=True)}
    # The LLM call's HTTP child is model time, named after the call.
    assert (rows["h"]["class"], rows["h"]["span_name"], rows["h"]["model"]) == (
        "llm",
        "chat gpt-4o",
        "gpt-4o",
    )
    assert rows["b"]["class"] == "internal"
    # Self time: duration minus the union of children clamped to the span.
    assert rows["c"]["self_ns"] == 10_000_000
    assert rows["root"]["self_ns"] == 0  # e covers it all


def test_attribute_splits_the_delta() -> None:
    requests = pl.DataFrame(
        {
            "trace_id": [f"b{i}" for i in range(100)] + [f"c{i}" for i in range(100)],
            "trace_key": list(range(200)),
            "service": ["s"] * 200,
            "operation": ["op"] * 200,
            "window": ["baseline"] * 100 + ["current"] * 100,
            "duration_ms": [100.0] * 99 + [500.0] + [100.0] * 99 + [900.0],
            "start": [T] * 200,
        }
    )
    # p99 (linear) goes 104 → 108 ms: a small step, so the practical floor is lowered for the test.
    conv = Conventions(attribution_min_requests=10, attribution_min_delta_ms=1.0)
    tails = tail_traces(requests, conv)
    assert sorted(tails["trace_id"].to_list()) == ["b99", "c99"]
    path = pl.DataFrame(
        {
            "trace_key": [99, 99, 199, 199],
            "span_key": [1, 2, 3, 4],
            "critical_ns": [100_000_000, 400_000_000, 200_000_000, 700_000_000],
            "self_ns": [0, 0, 0, 0],
            "class": ["internal", "llm", "internal", "llm"],
            "span_name": ["op", "chat", "op", "chat"],
            "provider": ["", "openai", "", "openai"],
            "model": ["", "m", "", "m"],
        }
    )
    attribution, spans = attribute(requests, tails, path, conv)
    row = attribution.row(0, named=True)
    assert row["llm_delta_ms"] == pytest.approx(300.0) and row["internal_delta_ms"] == pytest.approx(100.0)
    assert row["llm_share"] == pytest.approx(0.75) and row["internal_share"] == pytest.approx(0.25)
    assert row["verdict"] == "llm" and row["exemplar_trace_ids"] == ["c99"]
    assert spans["span_name"].to_list() == ["chat", "op"]
    assert llm_causes(attribution, spans).to_dicts() == [
        {"service": "s", "operation": "op", "provider": "openai", "model": "m"}
    ]
    strict = Conventions(attribution_min_requests=10, attribution_min_delta_ms=1.0, attribution_dominance=0.8)
    mixed, _ = attribute(requests, tails, path, strict)
    assert mixed["verdict"][0] == "mixed"


def test_stats() -> None:
    assert percentile([1, 2, 3, 4], 0.5) == 2.5 and percentile([], 0.5) is None
    low, high = wilson_interval(0, 10)
    assert low == pytest.approx(0.0, abs=1e-12) and high == pytest.approx(0.2775, abs=1e-4)
    assert wilson_interval(0, 0) == (None, None)
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2], [1, 2]) is None
    assert slope([0, 1, 2], [100, 300, 500]) == pytest.approx(200.0)
    rng = np.random.default_rng(0)
    same = bootstrap_quantile_delta(
        rng.normal(100, 10, 5000), rng.normal(100, 10, 5000), 0.99, samples=2000, confidence=0.95, seed=1
    )
    assert same[0] < 0 < same[1]
    shifted = bootstrap_quantile_delta(
        rng.normal(100, 10, 5000), rng.normal(150, 10, 5000), 0.99, samples=2000, confidence=0.95, seed=1
    )
    assert 40 < shifted[0] < 50 < shifted[1] < 60


def test_abandonment_and_cliff_on_a_tiny_frame() -> None:
    conv = Conventions(cliff_min_requests=2)
    requests = pl.DataFrame(
        {
            "service": ["s"] * 8,
            "operation": ["o"] * 8,
            "window": ["current"] * 8,
            "duration_ms": [100.0, 200.0, 600.0, 700.0, 1100.0, 1200.0, 1300.0, 1400.0],
            "abandoned": [False, False, False, False, True, True, True, False],
        }
    )
    buckets = abandonment(requests, conv)
    assert buckets.select("lo_ms", "requests", "abandoned").rows() == [(0, 2, 0), (500, 2, 0), (1000, 4, 3)]
    assert cliff(buckets, conv) == 1000
    assert cliff(buckets, Conventions(cliff_min_requests=3)) is None
    summary = abandonment_summary(requests, buckets, conv).row(0, named=True)
    assert (summary["requests"], summary["abandoned"], summary["cliff_ms"]) == (8, 3, 1000)


def test_cold_path_on_a_tiny_frame() -> None:
    s = 1_000_000_000
    raw = pl.DataFrame(
        {
            "queue": ["q", "q", "q", "q"],
            "enqueued_ns": [0, 10 * s, 20 * s, 30 * s],
            "started_ns": [1 * s, 12 * s, 21 * s, None],
            "ended_ns": [3 * s, 13 * s, 221 * s, None],
        }
    )
    jobs = jobs_from_raw(raw)
    assert jobs["enqueue_to_ready_s"].to_list() == [3.0, 3.0, 201.0, None]
    summary = cold_path_summary(jobs, Conventions(starvation_ratio=20.0)).row(0, named=True)
    assert (summary["jobs"], summary["completed"], summary["pending"]) == (4, 3, 1)
    assert summary["p50_s"] == 3.0 and summary["p99_s"] == pytest.approx(3.0 + 0.98 * 198.0)
    assert summary["starved"] is True
    cdf = cold_path_cdf(jobs, 200)
    assert cdf["cdf"].to_list() == pytest.approx([1 / 3, 2 / 3, 1.0])


def test_jobs_from_spans_joins_producers_and_consumers_and_ignores_duplicates() -> None:
    s = 1_000_000_000
    # (role, job_key, queue, start_ns, end_ns): 0 producer, 1 consumer, 2 standalone cold root.
    rows = [
        (0, 1, "q", 0, 1),
        (0, 1, "q", 0, 1),  # the producer of job 1 sent twice
        (1, 1, "", 2 * s, 5 * s),  # two consumers of job 1 (a batch split in two)
        (1, 1, "", 3 * s, 9 * s),
        (1, 1, "", 3 * s, 9 * s),  # … one of them duplicated
        (0, 2, "q", 10 * s, 10 * s + 1),  # job 2: never consumed (pending)
        (1, 3, "", 4 * s, 6 * s),  # a consumer whose producer is outside the window: no job
        (2, 4, "batch", 20 * s, 26 * s),  # a standalone cold root
    ]
    spans = pl.DataFrame(rows, schema=["role", "job_key", "queue", "start_ns", "end_ns"], orient="row")
    jobs = jobs_from_raw(jobs_from_spans(spans)).sort("enqueued")
    assert jobs["queue"].to_list() == ["q", "q", "batch"]
    assert jobs["queue_wait_s"].to_list() == [2.0, None, 0.0]
    assert jobs["enqueue_to_ready_s"].to_list() == [9.0, None, 6.0]
    assert jobs["processing_s"].to_list() == [7.0, None, 6.0]
    assert jobs_from_spans(spans.clear()).is_empty()


def test_first_of_each_keeps_the_first_row_of_each_key_in_order() -> None:
    frame = pl.DataFrame({"k": [7, 3, 7, 9, 3], "v": ["a", "b", "c", "d", "e"]})
    assert first_of_each(frame, "k").rows() == [(7, "a"), (3, "b"), (9, "d")]
    # Without duplicates the frame comes back as it is; an empty one stays empty.
    unique = frame.slice(1, 3)
    assert first_of_each(unique, "k").equals(unique)
    assert first_of_each(frame.clear(), "k").is_empty()


def test_retry_metrics_on_a_tiny_frame() -> None:
    # One run: hop "a" tried twice (resend_count 1 on the second), hop "b" once with a child LLM call.
    frame = pl.DataFrame(
        {
            "trace_key": [1] * 5,
            "span_key": [_key(s) for s in ("w", "a1", "a2", "b1", "b1c")],
            "parent_key": [_key(s) for s in ("", "w", "w", "w", "b1")],
            "name": ["invoke_workflow x", "a", "a", "b", "chat"],
            "start_ns": [0, 1, 2, 3, 4],
            "tokens": [0, 10, 10, 0, 30],
            "resend": [0, 0, 1, 0, 0],
            "wf_span_key": [_key("w")] * 5,
            "workflow": ["x"] * 5,
        }
    )
    hops, amp = retry_metrics(frame)
    assert hops.select("hop", "hop_index", "calls", "attempts", "tokens").rows() == [
        ("a", 1, 1, 2, 20),
        ("b", 2, 1, 1, 30),
    ]
    row = amp.row(0, named=True)
    assert row["attempt_amplification"] == 1.5 and row["token_amplification"] == pytest.approx(50 / 40)
    assert row["modeled_amplification"] == 2.0


def test_release_coupling_on_a_tiny_frame() -> None:
    releases = pl.DataFrame(
        {
            "service": ["s"] * 4,
            "operation": ["o"] * 4,
            "released_at": [T + timedelta(days=i) for i in range(4)],
            "p99_after_ms": [300.0, 310.0, 1100.0, 1105.0],
            "p99_delta_ms": [None, 10.0, 790.0, 5.0],
            "significant": [False, False, True, False],
        }
    )
    row = release_coupling(releases, Conventions()).row(0, named=True)
    assert row["releases"] == 4 and row["spearman_rho"] == pytest.approx(1.0)
    assert row["p99_slope_ms_per_release"] == pytest.approx(320.5) and row["coupled"] is True
    flat = releases.with_columns(pl.lit(False).alias("significant"))
    assert release_coupling(flat, Conventions()).row(0, named=True)["coupled"] is False
