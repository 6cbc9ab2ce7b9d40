"""The metric functions are pure: tiny frames in, known frames out, no store."""

from __future__ import annotations

import zlib
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import polars as pl
import pytest

from analytics import Conventions
from analytics._common import Windows, first_of_each
from analytics.abandonment import abandonment, abandonment_summary, cliff
from analytics.ancestry import without_queued_calls
from analytics.attribution import RETRY_BACKOFF, attribute, critical_path, llm_causes, tail_traces
from analytics.cold_path import cold_path_cdf, cold_path_summary, jobs_from_raw, jobs_from_spans
from analytics.llm_calls import llm_call_rows, llm_calls_summary, span_attempts
from analytics.releases import release_coupling
from analytics.retries import retry_metrics
from analytics.stats import bootstrap_quantile_delta, percentile, slope, spearman, wilson_interval

T = datetime(2026, 1, 1, tzinfo=UTC)


def _key(name: str) -> int:
    """A span's 64-bit key from a short readable name ('' → 0, the key of no span)."""
    return int.from_bytes(name.encode(), "big")


def _name(key: int) -> str:
    return key.to_bytes((key.bit_length() + 7) // 8, "big").decode()


def _spans(rows: list[tuple[Any, ...]]) -> pl.DataFrame:
    """(span, parent, name, kind, start_ms, end_ms, is_llm[, is_boundary]) of one trace, the spans named
    by their keys."""
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
            "is_boundary": [r[7] if len(r) > 7 else False for r in rows],
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
            "trace_key": [1, 2, 3, 4],
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
    spans = spans.with_columns(
        pl.lit(0, pl.UInt64).alias("message_key"), pl.lit(False).alias("failed"), pl.lit(0).alias("trace_key")
    )
    jobs = jobs_from_raw(jobs_from_spans(spans)).sort("enqueued")
    assert jobs["queue"].to_list() == ["q", "q", "batch"]
    assert jobs["queue_wait_s"].to_list() == [2.0, None, 0.0]
    assert jobs["enqueue_to_ready_s"].to_list() == [9.0, None, 6.0]
    assert jobs["processing_s"].to_list() == [7.0, None, 6.0]
    assert jobs["runs"].to_list() == [2, 0, 1]
    assert jobs_from_spans(spans.clear()).is_empty()


def test_a_retried_task_is_one_job_ready_when_a_run_succeeds() -> None:
    s = 1_000_000_000
    # (role, job_key, queue, start_ns, end_ns, message_key, failed): Celery's retry enqueues the
    # task again (a second producer, child of the failed run) with the same task id (message 7).
    rows = [
        (0, 1, "celery", 0, 1, 7, False),  # apply_async from the request
        (1, 1, "", 1 * s, 2 * s, 0, True),  # run 1: celery.state RETRY
        (0, 2, "celery", 2 * s, 2 * s + 1, 7, False),  # the retry's apply_async
        (1, 2, "", 4 * s, 6 * s, 0, False),  # run 2 succeeds
        (0, 3, "celery", 0, 1, 0, False),  # a task without a message id: its own job
        (1, 3, "", 1 * s, 3 * s, 0, True),  # … that only failed: over when its run ended
    ]
    schema = ["role", "job_key", "queue", "start_ns", "end_ns", "message_key", "failed"]
    spans = pl.DataFrame(rows, schema=schema, orient="row").with_columns(pl.lit(0).alias("trace_key"))
    jobs = jobs_from_raw(jobs_from_spans(spans)).sort("enqueue_to_ready_s")
    assert jobs.select("queue", "enqueue_to_ready_s", "queue_wait_s", "runs").rows() == [
        ("celery", 3.0, 1.0, 1),
        ("celery", 6.0, 1.0, 2),
    ]
    summary = cold_path_summary(jobs, Conventions())
    assert summary.select("jobs", "completed", "runs", "retried_jobs").row(0) == (2, 2, 3, 1)


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
            "start_ns": [0, 10, 20, 30, 40],
            "end_ns": [100, 15, 25, 35, 45],
            "failed": [False] * 5,
            "tokens": [0, 10, 10, 0, 30],
            "resend": [0, 0, 1, 0, 0],
            "extra_attempts": [0] * 5,
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


def test_retry_metrics_sequential_calls_are_calls_and_failed_ones_are_retried() -> None:
    # Hop "chat": three successful calls in a row (three calls), then one that failed after the SDK
    # made 3 attempts (2 extra, inside it) and the application's call again after it (one call of
    # 3 + 1 attempts). Tokens: the failed call carried none.
    names = ["invoke_workflow x", "chat", "chat", "chat", "chat", "chat"]
    frame = pl.DataFrame(
        {
            "trace_key": [1] * 6,
            "span_key": [_key(s) for s in ("w", "c1", "c2", "c3", "c4", "c5")],
            "parent_key": [_key(s) for s in ("", "w", "w", "w", "w", "w")],
            "name": names,
            "start_ns": [0, 10, 20, 30, 40, 60],
            "end_ns": [100, 15, 25, 35, 55, 65],
            "failed": [False, False, False, False, True, False],
            "tokens": [0, 10, 10, 10, 0, 10],
            "resend": [0] * 6,
            "extra_attempts": [0, 0, 0, 0, 2, 0],
            "wf_span_key": [_key("w")] * 6,
            "workflow": ["x"] * 6,
        }
    )
    hops, amp = retry_metrics(frame)
    assert hops.select("hop", "calls", "attempts", "tokens").rows() == [("chat", 4, 7, 40)]
    row = amp.row(0, named=True)
    assert row["attempt_amplification"] == pytest.approx(7 / 4)
    assert row["token_amplification"] == pytest.approx(1.0)


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


def _llm_frame(rows: list[tuple[Any, ...]]) -> pl.DataFrame:
    """Rows of the LLM-span read: (span, parent, name, start, end, kind of row, errored, throttled,
    resend, tokens). Kind of row: "llm", "http" (an attempt), "boundary"; trace 1, call key per
    (parent, name)."""
    return pl.DataFrame(
        {
            "trace_key": [1] * len(rows),
            "span_key": [_key(r[0]) for r in rows],
            "parent_key": [_key(r[1]) for r in rows],
            "call_key": [zlib.crc32(f"{r[1]}/{r[2]}".encode()) for r in rows],
            "start_ns": [r[3] for r in rows],
            "end_ns": [r[4] for r in rows],
            "provider": ["openai"] * len(rows),
            "model": ["gpt-4o"] * len(rows),
            "is_llm": [r[5] == "llm" for r in rows],
            "errored": [r[6] for r in rows],
            "throttled": [r[7] for r in rows],
            "tokens": [r[9] for r in rows],
            "resend": [r[8] for r in rows],
            "cold_marked": [False] * len(rows),
            "sync": [r[5] == "llm" for r in rows],
            "is_workflow": [False] * len(rows),
            "workflow": [""] * len(rows),
            "is_boundary": [r[5] == "boundary" for r in rows],
            "is_attempt": [r[5] == "http" for r in rows],
        }
    )


def test_attempts_are_the_http_children_and_sequential_calls_stay_calls() -> None:
    # c1: throttled twice by the provider, the SDK waited 10 ms and 20 ms, the third attempt
    # succeeded. c2, c3: two more successful calls in a row. c4 failed after its attempts (500s),
    # and the application called again (c5): one call. c6 has no HTTP child (nothing instrumented
    # the transport) but a captured retry header on… itself says nothing: one attempt.
    rows = [
        ("c1", "r", "chat gpt-4o", 0, 100, "llm", False, False, 0, 30),
        ("h1", "c1", "POST", 1, 11, "http", True, True, 0, 0),
        ("h2", "c1", "POST", 21, 31, "http", True, True, 0, 0),
        ("h3", "c1", "POST", 51, 99, "http", False, False, 0, 0),
        ("c2", "r", "chat gpt-4o", 110, 150, "llm", False, False, 0, 30),
        ("c3", "r", "chat gpt-4o", 160, 200, "llm", False, False, 0, 30),
        ("c4", "r", "chat gpt-4o", 210, 260, "llm", True, False, 0, 0),
        ("h4", "c4", "POST", 211, 220, "http", True, False, 0, 0),
        ("h5", "c4", "POST", 230, 259, "http", True, False, 0, 0),
        ("c5", "r", "chat gpt-4o", 270, 300, "llm", False, False, 0, 30),
        ("h6", "c5", "POST", 271, 299, "http", False, False, 0, 0),
        ("c6", "r", "embeddings x", 310, 320, "llm", False, False, 0, 5),
    ]
    spans = _llm_frame(rows)
    attempts = span_attempts(spans)
    by_span = {_name(r["span_key"]): r for r in attempts.iter_rows(named=True)}
    assert {
        k: by_span["c1"][k] for k in ("attempts", "failed_attempts", "throttled_attempts", "backoff_ns")
    } == {
        "attempts": 3,
        "failed_attempts": 2,
        "throttled_attempts": 2,
        "backoff_ns": 30,
    }
    assert by_span["c6"]["attempts"] == 1 and by_span["c4"]["failed_attempts"] == 2
    windows = Windows.of(datetime.fromtimestamp(0, UTC), datetime.fromtimestamp(1, UTC))
    calls = llm_call_rows(spans, attempts, pl.Series([1], dtype=pl.UInt64), windows)
    # c1, c2, c3, c4+c5 and c6: five calls; 3 + 1 + 1 + (2 + 1) + 1 = 9 attempts.
    assert calls.height == 5 and calls["attempts"].sum() == 9
    summary = llm_calls_summary(calls).row(0, named=True)
    assert summary["calls"] == 5 and summary["retry_rate"] == pytest.approx(4 / 5)
    assert summary["failed_attempts"] == 4 and summary["throttle_rate"] == pytest.approx(2 / 9)
    # c4's SDK gave up but the application's call again (c5) succeeded: no call failed. Of the 4 failed
    # attempts 2 were 429s, 2 (c4's 500s) were not.
    assert summary["failed_calls"] == 0 and summary["error_rate"] == 0.0
    assert summary["failed_attempt_rate"] == pytest.approx(2 / 9)
    assert summary["tokens"] == 125 and summary["backoff_ms"] == pytest.approx((30 + 10) / 1e6)


def test_calls_below_a_consumer_are_not_synchronous() -> None:
    # POST /chat → apply_async (Producer) → run/summarise (Consumer) → task → chat: queued work in the
    # request's trace (Celery's default). A second chat under the root is synchronous.
    structure = pl.DataFrame(
        {
            "trace_key": [1] * 6,
            "span_key": [_key(s) for s in ("root", "producer", "consumer", "task", "queued", "sync")],
            "parent_key": [_key(s) for s in ("", "root", "producer", "consumer", "task", "root")],
        }
    )
    rows = [
        ("consumer", "producer", "run/summarise", 0, 10, "boundary", False, False, 0, 0),
        ("queued", "task", "chat gpt-4o", 1, 5, "llm", False, False, 0, 0),
        ("sync", "root", "chat gpt-4o", 1, 5, "llm", False, False, 0, 0),
    ]
    spans = without_queued_calls(_llm_frame(rows), structure)
    assert dict(zip([_name(k) for k in spans["span_key"]], spans["sync"], strict=True)) == {
        "consumer": False,
        "queued": False,
        "sync": True,
    }


def test_critical_path_prunes_messaging_boundaries_and_labels_retry_backoff() -> None:
    # root 0..100: an LLM call 0..90 with two HTTP attempts 0..20 (429) and 50..90, the SDK waiting
    # 20..50 between them; a messaging process span of kind Internal is queued work (pruned).
    spans = _spans(
        [
            ("root", "", "POST /chat", "Server", 0, 100, False),
            ("c", "root", "chat gpt-4o", "Client", 0, 90, True),
            ("h1", "c", "POST", "Client", 0, 20, False),
            ("h2", "c", "POST", "Client", 50, 90, False),
            ("p", "root", "process q", "Internal", 0, 100, False, True),
        ]
    )
    path = critical_path(spans)
    backoff = path.filter(pl.col("span_name") == RETRY_BACKOFF)
    assert backoff["critical_ns"].to_list() == [30_000_000] and backoff["class"].to_list() == ["llm"]
    assert _credit(path.filter(pl.col("span_name") != RETRY_BACKOFF)) == {
        "root": 10.0,
        "c": 0.0,
        "h1": 20.0,
        "h2": 40.0,
        "p": 0.0,
    }


def test_two_instrumentations_on_one_call_make_one_call() -> None:
    # Traceloop's anthropic.chat and the SDK's own anthropic.messages.create wrap the same call: one
    # call, its attempts those under the SDK span. Two same-name calls in parallel stay two calls.
    rows = [
        ("t", "r", "anthropic.chat", 0, 100, "llm", False, False, 0, 40),
        ("s", "r", "anthropic.messages.create", 2, 98, "llm", False, False, 0, 40),
        ("h1", "s", "POST", 3, 20, "http", True, False, 0, 0),
        ("h2", "s", "POST", 40, 97, "http", False, False, 0, 0),
        ("p1", "r", "chat gpt-4o", 200, 300, "llm", False, False, 0, 10),
        ("p2", "r", "chat gpt-4o", 210, 290, "llm", False, False, 0, 10),
    ]
    spans = _llm_frame(rows)
    windows = Windows.of(datetime.fromtimestamp(0, UTC), datetime.fromtimestamp(1, UTC))
    calls = llm_call_rows(spans, span_attempts(spans), pl.Series([1], dtype=pl.UInt64), windows)
    assert sorted(calls.select("attempts", "failed_attempts", "tokens").rows()) == [
        (1, 0, 10),
        (1, 0, 10),
        (2, 1, 40),
    ]
