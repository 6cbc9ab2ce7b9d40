"""Ground-truth tests: synthetic traces with known answers through the whole analysis (SQL + Polars)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from datetime import timedelta
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pytest
from click.testing import CliRunner
from polars.testing import assert_frame_equal

from analytics import Analysis, AnalysisError, Conventions, analyze, latency_good_total
from analytics._common import Windows
from analytics.attribution import fetch_llm_signals, tail_traces
from analytics.hot_path import fetch_requests
from analytics.llm_spans import llm_spans_sql, roots_sql
from analytics.retries import fetch_workflows
from analytics.trace_spans import fetch_trace_spans
from collectors.schema import TRACES_TABLE
from collectors.spans import SpanRow, insert_spans, new_span_id
from storage import Store, ensure_schema, open_store
from tailwatch.cli import main
from tests.analytics.builders import (
    MS,
    S,
    at,
    cold_job,
    dt,
    hot_request,
    scenario_abandonment_cliff,
    scenario_cold_queues,
    scenario_flag_split,
    scenario_internal_regression,
    scenario_llm_regression,
    scenario_release_coupling,
    scenario_retries,
    workflow_run,
)


def _row(frame: pl.DataFrame, **where: object) -> dict[str, Any]:
    for key, value in where.items():
        frame = frame.filter(pl.col(key) == value)
    assert frame.height == 1, (where, frame)
    return frame.row(0, named=True)


def test_exact_percentiles_dedup_and_legacy_spellings(store: Store) -> None:
    durations = np.arange(1, 1001, dtype=np.float64)  # 1..1000 ms
    spans: list[SpanRow] = []
    for i, ms in enumerate(durations):
        spans += hot_request(
            "api",
            "GET /items",
            at(i * 3.0),
            float(ms),
            llm_ms=0.5 if i % 4 == 0 else None,
            legacy=i % 2 == 0,  # half written with SPAN_KIND_SERVER / STATUS_CODE_UNSET
        )
    insert_spans(store, spans)
    insert_spans(store, spans[: len(spans) // 3])  # an exporter retry: duplicate spans
    # A root that is not Server and not marked hot is not a hot-path request.
    insert_spans(store, [SpanRow("a" * 32, "b" * 16, "cron tick", at(5), 9_000 * MS, kind="Internal")])
    analysis = analyze(store, dt(at(0)), dt(at(3600)))
    row = _row(analysis.hot_path, service="api", operation="GET /items")
    assert row["requests"] == 1000
    for name, q in (("p50_ms", 0.5), ("p95_ms", 0.95), ("p99_ms", 0.99), ("p999_ms", 0.999)):
        assert row[name] == pytest.approx(float(np.quantile(durations, q, method="linear")), abs=1e-6)
    assert row["p99_ms"] == pytest.approx(990.01)
    assert row["sync_llm_calls_per_request"] == pytest.approx(0.25)
    assert analysis.hot_path.height == 1


def test_root_marked_hot_counts_as_request(store: Store) -> None:
    spans = [
        s for i in range(10) for s in hot_request("batch-api", "POST /x", at(i), 100.0 + i, mark_hot=True)
    ]
    insert_spans(store, spans)
    analysis = analyze(store, dt(at(0)), dt(at(60)))
    assert _row(analysis.hot_path, service="batch-api")["requests"] == 10


def test_release_adding_sync_llm_call_is_significant_and_coupled(store: Store) -> None:
    scenario = scenario_release_coupling()
    insert_spans(store, scenario.spans)
    # A hundred requests an hour: each step is measured over the six hours a version serves (the
    # default hour would hold a hundred requests a side, too few for a p99 step to be significant).
    conventions = Conventions(release_step_window=timedelta(hours=6))
    analysis = analyze(store, scenario.start, scenario.end, conventions=conventions)
    rel = analysis.releases.filter(pl.col("service") == "chat-api").sort("released_at")
    assert rel["version"].to_list() == ["1.0.0", "1.1.0", "1.2.0", "1.3.0"]
    by_version = {r["version"]: r for r in rel.iter_rows(named=True)}
    for version, expected in scenario.expected["significant"].items():  # type: ignore[attr-defined]
        assert by_version[version]["significant"] is expected, by_version[version]
    step = by_version["1.2.0"]
    assert 600.0 < step["p99_delta_ms"] < 1000.0
    assert step["sync_llm_calls_per_request_before"] == 0.0
    assert step["sync_llm_calls_per_request_after"] == 1.0
    assert step["requests_before"] == step["requests_after"] == 600
    assert step["released_at"] == dt(at(12 * 3600))
    coupling = _row(analysis.release_coupling, service="chat-api")
    assert coupling["releases"] == 4 and coupling["coupled"] is True
    assert coupling["spearman_rho"] > 0.5 and coupling["p99_slope_ms_per_release"] > 100


def test_a_release_step_is_its_own_not_what_happens_later_on_its_version(store: Store) -> None:
    """Release 1.1.0 adds 100 ms at t=600 s; the model slows every request by 600 ms at t=800 s, on
    the same version. The step is measured over the first requests of 1.1.0 (1000 at 10 per second:
    100 s) against as long before it, so it stays about +100 ms in every window that holds it, and
    the whole-life p99 of 1.1.0 (which holds the slowdown) is not what it reports."""
    rng = np.random.default_rng(11)
    spans: list[SpanRow] = []
    for i in range(12_000):  # 10 requests a second for 20 minutes
        t = i / 10
        ms = float(rng.lognormal(5.3, 0.3))
        version = "1.0.0" if t < 600 else "1.1.0"
        ms += (100.0 if t >= 600 else 0.0) + (600.0 if t >= 800 else 0.0)
        spans += hot_request("api", "POST /chat", at(t), ms, version=version)
    insert_spans(store, spans)
    released = dt(at(600))
    steps = []
    for end in (700, 900, 1200):
        analysis = analyze(store, dt(at(end - 300)), dt(at(end)))
        (step,) = analysis.releases.filter(pl.col("version") == "1.1.0").iter_rows(named=True)
        steps.append(step)
        assert step["released_at"] == released
        # 1000 requests after it, and those of as long before it (99.9 s: one fewer at 10 a second).
        assert (step["requests_after"], step["requests_before"]) == (1000, 999)
        assert step["step_end"] == dt(at(699.9)) + timedelta(microseconds=1)
        assert step["step_start"] == released - (step["step_end"] - released)
        assert 50.0 < step["p99_delta_ms"] < 150.0, step
        assert step["p99_after_ms"] < 700.0
    assert len({s["p99_delta_ms"] for s in steps}) == 1  # the same step, whichever window holds it
    # The version's whole life in the last window is far slower than its step says.
    whole = analyze(store, dt(at(900)), dt(at(1200))).hot_path.filter(pl.col("operation") == "POST /chat")
    assert whole["p99_ms"][0] > 1000.0


def test_a_release_step_known_so_far_ends_with_the_window(store: Store) -> None:
    """A window ending 30 s after a release holds 300 of its requests: the step is measured on them
    and on the 30 s before, and says where it ends."""
    rng = np.random.default_rng(12)
    spans: list[SpanRow] = []
    for i in range(9_000):
        t = i / 10
        version = "1.0.0" if t < 600 else "1.1.0"
        ms = float(rng.lognormal(5.3, 0.3)) + (100.0 if t >= 600 else 0.0)
        spans += hot_request("api", "POST /chat", at(t), ms, version=version)
    insert_spans(store, spans)
    analysis = analyze(store, dt(at(330)), dt(at(630)))
    (step,) = analysis.releases.filter(pl.col("version") == "1.1.0").iter_rows(named=True)
    assert step["requests_after"] == step["requests_before"] == 300
    assert (step["step_start"], step["step_end"]) == (dt(at(570)), dt(at(630)))


def test_releases_that_change_nothing_are_not_flagged(store: Store) -> None:
    rng = np.random.default_rng(5)
    spans: list[SpanRow] = []
    for index, version in enumerate(("3.0.0", "3.0.1", "3.0.2", "3.0.3")):
        for i, ms in enumerate(rng.lognormal(5.5, 0.5, size=3000)):
            spans += hot_request("api", "GET /q", at(index * 20_000 + i * 6.0), float(ms), version=version)
    insert_spans(store, spans)
    analysis = analyze(store, dt(at(0)), dt(at(80_000)))
    rel = analysis.releases.filter(pl.col("operation") == "GET /q")
    assert rel.height == 4
    assert not rel["significant"].any()
    assert _row(analysis.release_coupling, operation="GET /q")["coupled"] is False


def test_cold_path_starved_and_healthy_queue(store: Store) -> None:
    scenario = scenario_cold_queues()
    insert_spans(store, scenario.spans)
    analysis = analyze(store, scenario.start, scenario.end)
    starved = _row(analysis.cold_path, queue="doc-summaries")
    healthy = _row(analysis.cold_path, queue="emails")
    assert (starved["jobs"], starved["completed"], starved["pending"]) == (505, 500, 5)
    assert starved["p50_s"] == pytest.approx(3.0, abs=0.01)
    assert starved["p99_s"] == pytest.approx(180.0, abs=0.01)
    assert starved["queue_wait_p99_s"] == pytest.approx(179.0, abs=0.01)
    assert starved["processing_p99_s"] == pytest.approx(1.0, abs=0.01)
    assert starved["starved"] is True and starved["p99_over_p50"] == pytest.approx(60.0, rel=0.01)
    assert (healthy["jobs"], healthy["pending"], healthy["starved"]) == (500, 0, False)
    assert healthy["p99_s"] == pytest.approx(1.18, abs=0.01)
    cdf = analysis.cold_path_cdf.filter(pl.col("queue") == "doc-summaries")
    assert 0 < cdf.height <= 200 and cdf["cdf"].max() == pytest.approx(1.0)
    assert cdf["enqueue_to_ready_s"].max() == pytest.approx(180.0, abs=0.01)
    series = analysis.cold_path_series.filter(pl.col("queue") == "doc-summaries")
    assert series["jobs"].sum() == 505 and series["pending"].sum() == 5


def test_cold_marked_roots_are_jobs_of_their_own(store: Store) -> None:
    scenario = scenario_cold_queues(jobs=20)
    t0 = scenario.start + timedelta(minutes=1)
    t0_ns = int(t0.timestamp()) * 1_000_000_000
    marked = [
        # Marked by a span attribute, by a resource attribute (named by its queue attribute or not).
        SpanRow(
            "c1" * 16, "d1" * 8, "nightly export", t0_ns, 4 * 10**9, attributes={"tailwatch.path": "cold"}
        ),
        SpanRow(
            "c2" * 16,
            "d2" * 8,
            "reindex",
            t0_ns,
            6 * 10**9,
            resource_attributes={"tailwatch.path": "cold"},
            attributes={"messaging.destination.name": "search-index"},
        ),
        # Marked in both maps: still one job.
        SpanRow(
            "c5" * 16,
            "d5" * 8,
            "compaction",
            t0_ns,
            8 * 10**9,
            attributes={"tailwatch.path": "cold"},
            resource_attributes={"tailwatch.path": "cold"},
        ),
        # Not marked, or not a root: no job.
        SpanRow("c3" * 16, "d3" * 8, "cron tick", t0_ns, 10**9),
        SpanRow(
            "c4" * 16,
            "d4" * 8,
            "step",
            t0_ns,
            10**9,
            parent_span_id="e4" * 8,
            attributes={"tailwatch.path": "cold"},
        ),
    ]
    insert_spans(store, scenario.spans + marked)
    insert_spans(store, marked)  # sent twice
    cold = analyze(store, scenario.start, scenario.end).cold_path
    own = {row["queue"]: row for row in cold.iter_rows(named=True)}
    assert set(own) == {"doc-summaries", "emails", "nightly export", "search-index", "compaction"}
    assert (own["nightly export"]["jobs"], own["nightly export"]["p50_s"]) == (1, pytest.approx(4.0))
    assert (own["search-index"]["jobs"], own["search-index"]["p50_s"]) == (1, pytest.approx(6.0))
    assert (own["compaction"]["jobs"], own["compaction"]["p50_s"]) == (1, pytest.approx(8.0))
    assert own["search-index"]["queue_wait_p99_s"] == 0.0
    # The marked roots are found through the Collector's bloom filters over the maps' keys; a table
    # without them gives the same jobs.
    for index in ("idx_span_attr_key", "idx_res_attr_key"):
        store.command(f"ALTER TABLE otel_traces DROP INDEX {index}", settings={"mutations_sync": 2})
    assert analyze(store, scenario.start, scenario.end).cold_path.equals(cold)


def test_abandonment_cliff_at_2000_ms(store: Store) -> None:
    scenario = scenario_abandonment_cliff()
    insert_spans(store, scenario.spans)
    analysis = analyze(store, scenario.start, scenario.end)
    summary = _row(analysis.abandonment_summary, service="web")
    assert summary["cliff_ms"] == 2000
    assert (summary["requests"], summary["abandoned"]) == (2000, 420)
    buckets = analysis.abandonment.filter(pl.col("service") == "web").sort("lo_ms")
    assert buckets["lo_ms"].to_list() == list(range(0, 4000, 500))
    assert buckets["hi_ms"].to_list() == list(range(500, 4500, 500))
    below = buckets.filter(pl.col("lo_ms") < 2000)
    above = buckets.filter(pl.col("lo_ms") >= 2000)
    assert below["rate"].to_list() == pytest.approx([0.02] * 4)
    assert above["rate"].to_list() == pytest.approx([0.4] * 4)
    assert (buckets["rate_low"] <= buckets["rate"]).all() and (buckets["rate"] <= buckets["rate_high"]).all()
    # Wilson 95% for 100/250.
    assert above["rate_low"][0] == pytest.approx(0.3406, abs=1e-3)
    assert above["rate_high"][0] == pytest.approx(0.4624, abs=1e-3)


def test_retry_amplification_5_percent_per_hop_over_3_hops(store: Store) -> None:
    scenario = scenario_retries()
    insert_spans(store, scenario.spans)
    analysis = analyze(store, scenario.start, scenario.end)
    hops = analysis.retry_hops.filter(pl.col("workflow") == "claims-triage").sort("hop_index")
    assert hops["hop"].to_list() == ["classify", "extract", "decide"]
    assert hops["calls"].to_list() == [200, 200, 200]
    assert hops["attempts"].to_list() == [210, 210, 210]
    assert hops["retry_rate"].to_list() == pytest.approx([0.05] * 3)
    assert hops["tokens"].to_list() == [210 * 1000] * 3
    amp = _row(analysis.retry_amplification, workflow="claims-triage")
    assert amp["runs"] == 200
    assert amp["modeled_amplification"] == pytest.approx(1.157625)
    assert amp["attempt_amplification"] == pytest.approx(1.05)
    assert amp["token_amplification"] == pytest.approx(1.05)


def test_token_amplification_counts_tokens_below_tool_hops(store: Store) -> None:
    spans: list[SpanRow] = []
    for i in range(10):
        retries = {"lookup": 2} if i < 5 else {}
        spans += workflow_run(
            "triage", at(i * 5.0), ("lookup", "answer"), retries, tool_hops=("lookup",), tokens=(100, 0)
        )
    insert_spans(store, spans)
    analysis = analyze(store, dt(at(0)), dt(at(600)))
    lookup = _row(analysis.retry_hops, hop="lookup")
    assert (lookup["calls"], lookup["attempts"], lookup["tokens"]) == (10, 20, 2000)
    amp = _row(analysis.retry_amplification, workflow="triage")
    # all attempts: lookup 20×100 + answer 10×100; final attempts: 10×100 + 10×100.
    assert amp["token_amplification"] == pytest.approx(3000 / 2000)
    assert amp["modeled_amplification"] == pytest.approx(2.0 * 1.0)


def test_attribution_llm_regression(store: Store) -> None:
    scenario = scenario_llm_regression()
    insert_spans(store, scenario.spans)
    analysis = analyze(store, scenario.start, scenario.end)
    row = _row(analysis.attribution, service="chat-api", operation="POST /chat")
    assert row["verdict"] == "llm"
    assert row["llm_share"] > 0.9 and row["llm_share"] + row["internal_share"] == pytest.approx(1.0)
    assert row["delta_ms"] > 1000
    assert row["llm_delta_ms"] == pytest.approx(1200.0, abs=1.0)
    assert row["internal_delta_ms"] == pytest.approx(0.0, abs=1.0)
    assert (row["baseline_requests"], row["current_requests"]) == (400, 400)
    assert 1 <= len(row["exemplar_trace_ids"]) <= 5
    top = analysis.attribution_spans.filter(pl.col("operation") == "POST /chat").row(0, named=True)
    assert (top["span_name"], top["class"], top["provider"], top["model"]) == (
        "chat gpt-4o",
        "llm",
        "openai",
        "gpt-4o",
    )
    signals = _row(analysis.llm_signals, service="chat-api", model="gpt-4o")
    assert signals["error_rate_current"] == 0.0 and signals["cold_share_current"] == 0.0


def test_trace_spans_chosen_in_sql_match_the_key_list(store: Store) -> None:
    # Server stores have the query choose the tail and workflow traces itself (no id list as a
    # parameter); on the same data that must read the same spans for the traces the analysis keeps.
    scenario = scenario_llm_regression()
    runs = [workflow_run("triage", at(3600 + i * 10.0), ("classify", "decide"), {}) for i in range(50)]
    # Workflow runs of the baseline window are read too (the baseline's retry amplification).
    runs += [workflow_run("triage", at(600 + i * 10.0), ("classify", "decide"), {}) for i in range(20)]
    insert_spans(store, scenario.spans + [span for run in runs for span in run])
    conv = Conventions()
    windows = Windows.of(scenario.start, scenario.end)
    baseline = Windows.of(
        windows.baseline_start, windows.baseline_end, windows.baseline_start, windows.baseline_end
    )
    tails = tail_traces(fetch_requests(store, windows, conv), conv)
    workflows = pl.concat([fetch_workflows(store, windows, conv), fetch_workflows(store, baseline, conv)])
    assert tails.height > 0 and workflows.height == 70
    by_keys = fetch_trace_spans(store, tails, workflows, windows, conv, by_keys=True)
    in_sql = fetch_trace_spans(store, tails, workflows, windows, conv, by_keys=False)
    wanted = pl.concat([tails.select("trace_key"), workflows.select("trace_key")]).unique()
    assert by_keys["trace_key"].n_unique() == wanted.height
    chosen = in_sql.join(wanted, on="trace_key", how="semi")
    assert_frame_equal(chosen.sort("trace_key", "span_key"), by_keys.sort("trace_key", "span_key"))
    # Ties at a duration floor may add a few traces, never drop one.
    assert in_sql["trace_key"].n_unique() >= wanted.height


def test_root_and_llm_reads_send_repeated_strings_as_dictionaries(store: Store) -> None:
    # The reads ask for Arrow dictionaries in their own SETTINGS clause (they become Polars
    # categoricals without re-encoding); the session's own setting is left as it was.
    scenario = scenario_llm_regression()
    insert_spans(store, scenario.spans)
    conv = Conventions()
    params = {**conv.sql_parameters(), **Windows.of(scenario.start, scenario.end).params(conv)}
    table = store.table(TRACES_TABLE)
    roots = store.query_arrow(roots_sql(table), params)
    llm = store.query_arrow(llm_spans_sql(table), params)
    assert roots.num_rows > 0 and llm.num_rows > 0
    for read, column in ((roots, "service"), (roots, "version"), (llm, "provider"), (llm, "model")):
        assert pa.types.is_dictionary(read.schema.field(column).type), column
    plain = store.query_arrow("SELECT toLowCardinality({v:String}) AS v", {"v": "x"})
    assert not pa.types.is_dictionary(plain.schema.field("v").type)


def test_attribution_internal_regression(store: Store) -> None:
    scenario = scenario_internal_regression()
    insert_spans(store, scenario.spans)
    analysis = analyze(store, scenario.start, scenario.end)
    row = _row(analysis.attribution, service="chat-api")
    assert row["verdict"] == "internal"
    assert row["internal_share"] > 0.9
    assert row["internal_delta_ms"] == pytest.approx(1200.0, abs=1.0)
    top = analysis.attribution_spans.filter(pl.col("operation") == "POST /chat").row(0, named=True)
    assert (top["span_name"], top["class"]) == ("db.query", "internal")
    assert analysis.llm_signals.is_empty()  # no LLM-side cause to explain


def test_no_change_means_verdict_none(store: Store) -> None:
    spans: list[SpanRow] = []
    for i in range(400):
        for window in (0, 3600):
            spans += hot_request("api", "GET /same", at(window + i * 8.0), 0.0, llm_ms=100.0 + (i % 40))
    insert_spans(store, spans)
    analysis = analyze(store, dt(at(3600)), dt(at(7200)))
    row = _row(analysis.attribution, operation="GET /same")
    assert row["verdict"] == "none" and row["delta_ms"] == pytest.approx(0.0, abs=1.0)


def test_llm_signals_show_throttling_retries_and_cold_share(store: Store) -> None:
    scenario = scenario_llm_regression()
    spans = list(scenario.spans)
    # In the current hour: batch summaries call the same model from the cold path; 20 of the hot
    # path's slow calls were throttled once before succeeding (a 429 the user never met); 10 were
    # throttled on both their attempts (the call failed after its retry) and 5 failed once without a
    # 429 (a timeout, not retried).
    for i in range(100):
        spans += cold_job("doc-summaries", at(3600 + i * 30.0), 1.0, 2.0, llm_model="gpt-4o")
    for i in range(20):
        spans += hot_request(
            "chat-api", "POST /chat", at(3600 + i * 150.0 + 1), 0.0, llm_ms=2500.0, llm_retries=1
        )
    for i in range(10):
        spans += hot_request(
            "chat-api",
            "POST /chat",
            at(3600 + i * 300.0 + 2),
            0.0,
            llm_ms=2500.0,
            llm_retries=1,
            llm_throttled=True,
            llm_status="Error",
        )
    for i in range(5):
        spans += hot_request(
            "chat-api", "POST /chat", at(3600 + i * 600.0 + 3), 0.0, llm_ms=2500.0, llm_status="Error"
        )
    insert_spans(store, spans)
    analysis = analyze(store, scenario.start, scenario.end)
    assert _row(analysis.attribution, service="chat-api")["verdict"] == "llm"
    s = _row(analysis.llm_signals, service="chat-api", model="gpt-4o")
    # current: 400 + 20 + 10 + 5 hot calls and 100 cold ones = 535 calls, of 400 + 2 × 20 + 2 × 10
    # + 5 + 100 = 565 attempts. Errors are calls failed after their retries (10 + 5), per call; 429s
    # (20 + 2 × 10) and other failed attempts (5) per attempt; retries and the cold share per call.
    assert s["error_rate_current"] == pytest.approx(15 / 535)
    assert s["throttle_rate_current"] == pytest.approx(40 / 565)
    assert s["failed_attempt_rate_current"] == pytest.approx(5 / 565)
    assert s["retry_rate_current"] == pytest.approx(30 / 535)
    assert s["cold_share_current"] == pytest.approx(100 / 535)
    assert s["cold_share_baseline"] == 0.0 and s["throttle_rate_baseline"] == 0.0
    assert s["error_rate_baseline"] == 0.0 and s["failed_attempt_rate_baseline"] == 0.0
    calls = _row(analysis.llm_calls, model="gpt-4o")
    assert (calls["calls"], calls["failed_calls"]) == (535, 15)
    assert calls["error_rate"] == pytest.approx(15 / 535)
    assert calls["failed_attempt_rate"] == pytest.approx(5 / 565)


def test_a_call_retried_after_a_429_is_no_error(store: Store) -> None:
    # Every call got a 429 and succeeded on its retry: the user met no error.
    spans = [
        s
        for i in range(50)
        for s in hot_request("chat-api", "POST /chat", at(i * 10.0), 0.0, llm_ms=300.0, llm_retries=1)
    ]
    insert_spans(store, spans)
    analysis = analyze(store, dt(at(0)), dt(at(3600)))
    calls = _row(analysis.llm_calls, model="gpt-4o")
    assert (calls["calls"], calls["attempts"], calls["throttled_attempts"]) == (50, 100, 50)
    assert calls["failed_calls"] == 0 and calls["error_rate"] == 0.0
    assert calls["failed_attempt_rate"] == 0.0 and calls["throttle_rate"] == pytest.approx(0.5)


def test_llm_signal_counts_dedupe_spans_and_count_each_retry_once(store: Store) -> None:
    # A: three attempts of one call (resend counts 1, 2 on the re-sends). B: a single exported
    # attempt that carries a resend count (its earlier attempt was never exported). C: a cold job.
    a = hot_request("chat-api", "POST /chat", at(10), 0.0, llm_ms=300.0, llm_retries=2)
    b = hot_request("chat-api", "POST /chat", at(20), 0.0, llm_ms=300.0)
    b = [
        replace(s, attributes={**s.attributes, "http.request.resend_count": "1"})
        if s.name.startswith("chat ")
        else s
        for s in b
    ]
    c = cold_job("doc-summaries", at(30), 1.0, 2.0, llm_model="gpt-4o")
    # D: a request whose root is hot by its tailwatch.path mark, not by its kind.
    d = hot_request("chat-api", "POST /chat", at(40), 0.0, llm_ms=300.0, mark_hot=True)
    insert_spans(store, [*a, *b, *c, *d, a[1], b[1]])  # one LLM attempt of A and B's LLM span twice
    windows = Windows.of(dt(at(0)), dt(at(3600)))
    pairs = pl.DataFrame({"provider": ["openai"], "model": ["gpt-4o"]})
    frame = fetch_llm_signals(store, pairs, windows, Conventions())
    row = _row(frame, window="current", model="gpt-4o")
    # 3 + 1 + 1 + 1 distinct LLM spans make 4 logical calls (A's re-sends continue its first attempt)
    # of 3 + 2 + 1 + 1 attempts: B's resend count says an attempt before it was sent and failed.
    # Retries: A's two re-sends and B's one; errors: none, every call ended in success; failed
    # attempts but 429s: B's unexported one; 429s: A's two; C's call is the only cold one.
    keys = ("calls", "attempts", "errors", "failed_attempts", "throttled", "retries", "cold")
    assert {k: row[k] for k in keys} == {
        "calls": 4,
        "attempts": 7,
        "errors": 0,
        "failed_attempts": 1,
        "throttled": 2,
        "retries": 3,
        "cold": 1,
    }


def test_latency_good_total(store: Store) -> None:
    spans = [s for i in range(100) for s in hot_request("api", "GET /a", at(i), float(i * 10 + 5))]
    insert_spans(store, spans + spans[:30])  # duplicates count once
    frame = latency_good_total(store, dt(at(0)), dt(at(100)), threshold_ms=500.0)
    assert frame.to_dicts() == [{"service": "api", "operation": "GET /a", "good": 50, "total": 100}]


def test_json_shape_is_exactly_the_interface(store: Store) -> None:
    for scenario in (scenario_llm_regression(), scenario_cold_queues(), scenario_retries()):
        insert_spans(store, scenario.spans)
    insert_spans(store, scenario_abandonment_cliff().spans)
    insert_spans(store, scenario_flag_split(requests=200).spans)
    analysis = analyze(store, dt(at(0)), dt(at(3600)), dt(at(-3600)), dt(at(0)))
    data = json.loads(analysis.to_json())
    assert set(data) == {
        "window",
        "hot_path",
        "cold_path",
        "abandonment",
        "retry_amplification",
        "attribution",
        "llm_calls",
        "llm_anatomy",
        "boundary",
        "slices",
        "what_if",
        "existing_hedges",
        "llm_costs",
    }
    assert set(data["window"]) == {"start", "end", "baseline_start", "baseline_end"}
    assert data["window"]["start"] == "2026-11-02T08:00:00Z"
    hot = data["hot_path"][0]
    assert set(hot) == {
        "service", "operation", "requests", "p50_ms", "p95_ms", "p99_ms", "p999_ms",
        "sync_llm_calls_per_request", "releases", "release_coupling",
        "sampled_requests", "effective_sample_size", "p99_tail_samples", "p99_warning",
        "first_byte_requests", "streamed_requests", "ttfb_p50_ms", "ttfb_p99_ms",
    }  # fmt: skip
    assert set(hot["releases"][0]) == {
        "version", "released_at", "requests_before", "requests_after", "p99_before_ms", "p99_after_ms",
        "p99_delta_ms", "significant", "sync_llm_calls_per_request_before",
        "sync_llm_calls_per_request_after", "step_start", "step_end", "llm_cost_per_request_before",
        "llm_cost_per_request_after", "llm_tokens_per_request_before", "llm_tokens_per_request_after",
    }  # fmt: skip
    assert set(hot["release_coupling"]) == {"releases", "spearman_rho", "p99_slope_ms_per_release", "coupled"}
    assert set(data["llm_costs"][0]) == {
        "service", "operation", "version", "window", "requests", "sync_llm_calls_per_request",
        "llm_tokens_per_request", "cached_input_ratio", "llm_cost_per_request", "llm_cost_per_day",
    }  # fmt: skip
    assert set(data["cold_path"][0]) == {
        "queue", "jobs", "completed", "pending", "p50_s", "p95_s", "p99_s", "p999_s", "queue_wait_p99_s",
        "processing_p99_s", "p99_over_p50", "starved", "runs", "retried_jobs", "baseline_jobs",
        "baseline_p50_s", "baseline_p99_s", "baseline_queue_wait_p99_s", "baseline_processing_p99_s",
    }  # fmt: skip
    assert set(data["llm_calls"][0]) == {
        "provider", "model", "calls", "sync_calls", "cold_calls", "attempts", "failed_attempts",
        "throttled_attempts", "failed_calls", "error_rate", "failed_attempt_rate", "throttle_rate",
        "retry_rate", "cold_share", "tokens", "backoff_ms",
    }  # fmt: skip
    ab = data["abandonment"][0]
    assert set(ab) == {"service", "operation", "bucket_ms", "buckets", "cliff_ms", "latency"}
    assert ab["bucket_ms"] == 500 and ab["latency"] == "duration"
    assert set(ab["buckets"][0]) == {
        "lo_ms",
        "hi_ms",
        "requests",
        "abandoned",
        "rate",
        "rate_low",
        "rate_high",
    }
    ra = data["retry_amplification"][0]
    assert set(ra) == {
        "workflow", "runs", "hops", "attempt_amplification", "token_amplification", "modeled_amplification",
        "baseline_runs", "baseline_attempt_amplification", "baseline_token_amplification",
    }  # fmt: skip
    assert set(ra["hops"][0]) == {"hop", "calls", "attempts", "retry_rate", "tokens"}
    at_ = data["attribution"][0]
    assert set(at_) == {
        "service", "operation", "baseline_p99_ms", "current_p99_ms", "delta_ms", "llm_share",
        "internal_share", "verdict", "top_spans", "exemplar_trace_ids", "llm_signals", "llm_cause",
        "llm_cause_ours", "llm_cause_provider", "llm_cause_model", "llm_cause_text", "llm_breakdown_ms",
    }  # fmt: skip
    anatomy = data["llm_anatomy"][0]
    side = {
        "calls", "streamed_calls", "ttft_p50_ms", "ttft_p99_ms", "ttft_source", "ms_per_output_token_p50",
        "input_tokens_p50", "output_tokens_p50", "cached_input_ratio", "cost_per_1k_calls", "cost_per_day",
        "backoff_ms_per_call", "throttle_rate", "sync_calls", "sync_cost", "ttft_estimate_low_ms",
        "ttft_estimate_high_ms", "per_token_estimate_low_ms", "per_token_estimate_high_ms",
    }  # fmt: skip
    assert set(anatomy) == {"provider", "model", *side, *(f"baseline_{k}" for k in side)}
    assert set(at_["top_spans"][0]) == {"span_name", "class", "provider", "model", "delta_ms"}
    sources = {b["service"]: b["budget_source"] for b in data["boundary"]}
    assert (sources["web"], sources["chat-api"]) == ("cliff", None)  # none configured
    for b in data["boundary"]:
        assert set(b) == {
            "service", "operation", "requests", "p99_ms", "budget_ms", "budget_source",
            "requests_over_budget", "requests_over_budget_per_day", "sync_llm_calls_per_request",
            "p99_without_sync_llm_ms",
            "requests_over_budget_without_sync_llm", "recommendation", "reasons",
            "sampled_requests", "effective_sample_size", "p99_warning", "cheapest_option",
        }  # fmt: skip
        assert b["reasons"] and all(isinstance(r, str) for r in b["reasons"])
    assert data["what_if"], "no what-if option for the operations with synchronous model calls"
    for w in data["what_if"]:
        assert set(w) == {
            "service", "operation", "option", "parameter", "requests", "budget_ms", "p99_ms",
            "p99_delta_ms", "requests_over_budget", "abandoned_saved_per_day", "extra_calls_ratio",
            "extra_tokens_ratio", "extra_tokens_per_day", "extra_cost_per_day", "assumption",
        }  # fmt: skip
        assert w["extra_cost_per_day"] is None and w["assumption"]
    [flag] = data["slices"]
    assert set(flag) == {"service", "operation", "flag", "control", "variants"}
    for variant in flag["variants"]:
        assert set(variant) == {
            "variant", "requests", "p50_ms", "p99_ms", "abandonment_rate", "abandonment_rate_low",
            "abandonment_rate_high", "sync_llm_calls_per_request", "cold_p99_s", "p99_delta_ms",
            "abandonment_delta", "significant",
        }  # fmt: skip
    control, rollout = flag["variants"]
    assert control["variant"] == flag["control"] and control["p99_delta_ms"] is None
    assert rollout["p99_delta_ms"] is not None and isinstance(rollout["significant"], bool)


def test_default_baseline_and_bad_windows(store: Store) -> None:
    analysis = analyze(store, dt(at(3600)), dt(at(7200)))
    assert (analysis.baseline_start, analysis.baseline_end) == (dt(at(0)), dt(at(3600)))
    assert analysis.hot_path.is_empty() and analysis.attribution.is_empty()
    assert isinstance(analysis, Analysis) and json.loads(analysis.to_json())["hot_path"] == []
    with pytest.raises(AnalysisError, match="after start"):
        analyze(store, dt(at(10)), dt(at(0)))
    # One UTC policy everywhere (storage.times): a naive time is UTC, as ClickHouse returns it.
    naive = analyze(store, dt(at(3600)).replace(tzinfo=None), dt(at(7200)).replace(tzinfo=None))
    assert (naive.start, naive.end) == (analysis.start, analysis.end)


def test_conventions_are_configurable(store: Store) -> None:
    scenario = scenario_abandonment_cliff()
    insert_spans(store, scenario.spans)
    conv = Conventions(bucket_ms=1000, abandon_status_codes=("408",))
    analysis = analyze(store, scenario.start, scenario.end, conventions=conv)
    summary = _row(analysis.abandonment_summary, service="web")
    assert summary["abandoned"] == 0 and summary["cliff_ms"] is None
    assert analysis.to_dict()["abandonment"][0]["bucket_ms"] == 1000
    assert _row(analysis.abandonment, lo_ms=1000)["hi_ms"] == 2000
    assert Conventions.from_dict(conv.to_dict()) == conv
    with pytest.raises(ValueError, match="bucket_ms"):
        Conventions(bucket_ms=0)


def test_cli_json_and_table(store_dsn: str) -> None:
    scenario = scenario_internal_regression()
    with open_store(store_dsn) as s:
        ensure_schema(s)
        insert_spans(s, scenario.spans)
    base = [sys.executable, "-m", "tailwatch", "analyze", "--store", store_dsn]
    window = ["--start", "2026-11-02T09:00:00Z", "--end", "2026-11-02T10:00:00Z"]
    out = subprocess.run([*base, *window], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["window"]["baseline_start"] == "2026-11-02T08:00:00Z"
    assert data["attribution"][0]["verdict"] == "internal"
    table = subprocess.run(
        [*base, *window, "--baseline-start", "2026-11-02T08:00:00Z", "--baseline-end", "2026-11-02T09:00:00Z",
         "--format", "table"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert table.returncode == 0, table.stderr
    assert "verdict=internal" in table.stdout and "HOT PATH" in table.stdout
    # Argument errors are reported before any store is opened: run them in-process.
    runner = CliRunner()
    bad = runner.invoke(main, ["analyze", "--store", store_dsn, "--start", "yesterday", "--end", "x"])
    assert bad.exit_code == 2 and "ISO 8601" in bad.output
    half = runner.invoke(
        main, ["analyze", "--store", store_dsn, *window, "--baseline-start", "2026-11-02T08:00:00Z"]
    )
    assert half.exit_code == 2 and "tailwatch: error: give both" in half.output


def test_series_buckets_cover_the_window(store: Store) -> None:
    spans = [s for i in range(600) for s in hot_request("api", "GET /s", at(i * 6.0), 100.0)]
    insert_spans(store, spans)
    analysis = analyze(store, dt(at(0)), dt(at(3600)))
    series = analysis.hot_path_series
    assert series["requests"].sum() == 600
    assert 30 <= series.height <= 200
    assert series["bucket_start"].min() == dt(at(0))
    assert (series["bucket_start"].diff().drop_nulls() == timedelta(seconds=30)).all()


def test_older_llm_conventions_are_read_and_providers_normalised(store: Store) -> None:
    # OpenLLMetry before 0.55: no gen_ai.operation.name but llm.request.type, gen_ai.system "OpenAI"
    # or "Azure", prompt/completion token names. OpenInference: llm.system, llm.model_name,
    # llm.token_count.*. Each request's one call is found, with its provider, model and tokens.
    spans = []
    for i, (flavour, provider) in enumerate(
        [("openllmetry", "OpenAI"), ("openllmetry", "Azure"), ("openinference", "openai")] * 10
    ):
        request = hot_request("chat-api", "POST /chat", at(10 + i), 0.0, llm_ms=100.0)
        root, llm = request[0], request[1]
        if flavour == "openllmetry":
            attrs = {
                "llm.request.type": "chat",
                "gen_ai.system": provider,
                "gen_ai.request.model": "gpt-4o",
                "gen_ai.usage.prompt_tokens": "30",
                "gen_ai.usage.completion_tokens": "12",
            }
            llm = replace(llm, name="openai.chat", attributes=attrs)
        else:
            attrs = {
                "openinference.span.kind": "LLM",
                "llm.system": provider,
                "llm.model_name": "gpt-4o-2024-08-06",
                "llm.token_count.prompt": "30",
                "llm.token_count.completion": "12",
            }
            llm = replace(llm, name="ChatCompletion", kind="Internal", attributes=attrs)
        spans += [root, llm]
    insert_spans(store, spans)
    analysis = analyze(store, dt(at(0)), dt(at(3600)))
    calls = {(r["provider"], r["model"]): r for r in analysis.llm_calls.iter_rows(named=True)}
    assert set(calls) == {
        ("openai", "gpt-4o"),
        ("azure.ai.openai", "gpt-4o"),
        ("openai", "gpt-4o-2024-08-06"),
    }
    assert all(r["calls"] == r["sync_calls"] == 10 and r["tokens"] == 420 for r in calls.values())
    [hot] = analysis.hot_path.iter_rows(named=True)
    assert hot["requests"] == 30 and hot["sync_llm_calls_per_request"] == 1.0


def test_a_pull_consumers_receive_span_is_a_boundary_and_a_run(store: Store) -> None:
    # A request enqueues (Producer, Celery's messaging.destination) and then, in its own trace, a
    # poller's receive span (kind Client, as the messaging conventions make pull consumers) picks the
    # message up and calls the model under it. The call is cold-path work; the job is one run.
    spans = []
    for i in range(20):
        request = hot_request("api", "POST /enqueue", at(10 + i * 10), 5.0)
        root = request[0]
        producer = SpanRow(
            trace_id=root.trace_id,
            span_id=new_span_id(),
            parent_span_id=root.span_id,
            name="apply_async/summarize",
            start_ns=root.start_ns + MS,
            duration_ns=MS,
            kind="Producer",
            service="api",
            attributes={"messaging.destination": "summaries", "messaging.message.id": f"m{i}"},
        )
        receive = SpanRow(
            trace_id=root.trace_id,
            span_id=new_span_id(),
            parent_span_id=producer.span_id,
            name="receive summaries",
            start_ns=root.start_ns + 2 * S,
            duration_ns=3 * S,
            kind="Client",
            service="worker",
            attributes={"messaging.operation.type": "receive", "messaging.destination.name": "summaries"},
        )
        work = SpanRow(
            trace_id=root.trace_id,
            span_id=new_span_id(),
            parent_span_id=receive.span_id,
            name="summarize",
            start_ns=receive.start_ns,
            duration_ns=2 * S,
            kind="Internal",
            service="worker",
        )
        call = SpanRow(
            trace_id=root.trace_id,
            span_id=new_span_id(),
            parent_span_id=work.span_id,
            name="chat gpt-4o",
            start_ns=work.start_ns,
            duration_ns=S,
            kind="Client",
            service="worker",
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": "openai",
                "gen_ai.request.model": "gpt-4o",
            },
        )
        spans += [root, producer, receive, work, call]
    insert_spans(store, spans)
    analysis = analyze(store, dt(at(0)), dt(at(3600)))
    [hot] = analysis.hot_path.iter_rows(named=True)
    assert hot["requests"] == 20 and hot["sync_llm_calls_per_request"] == 0.0
    [calls] = analysis.llm_calls.iter_rows(named=True)
    assert (calls["calls"], calls["sync_calls"], calls["cold_share"]) == (20, 0, 1.0)
    [queue] = analysis.cold_path.iter_rows(named=True)
    assert (queue["queue"], queue["jobs"], queue["completed"], queue["runs"]) == ("summaries", 20, 20, 20)
    assert queue["p50_s"] == pytest.approx(5.0 - 0.001)


def test_cold_path_and_retries_carry_their_baseline_window(store: Store) -> None:
    # Baseline hour: doc-summaries healthy (every job ready 1.5 s after enqueue, 100 jobs), and
    # claims-triage without a single retry (80 runs); the current hour is the starved queue and the
    # 5%-per-hop workflow of the scenarios. Queues and workflows of the baseline only are not rows.
    cold, retries = scenario_cold_queues(), scenario_retries()
    baseline: list[SpanRow] = []
    for i in range(100):
        baseline += cold_job(
            "doc-summaries", at(-3500 + i * 30.0), 1.0, 0.5, consumer_service="summary-worker"
        )
        baseline += cold_job("only-before", at(-3500 + i * 30.0), 0.1, 0.1)
    for i in range(80):
        baseline += workflow_run("claims-triage", at(-3500 + i * 40.0), ("classify", "extract", "decide"))
    insert_spans(store, cold.spans + retries.spans + baseline)
    analysis = analyze(store, cold.start, cold.end)
    starved = _row(analysis.cold_path, queue="doc-summaries")
    assert starved["jobs"] == 505 and starved["baseline_jobs"] == 100
    assert starved["baseline_p50_s"] == pytest.approx(1.5, abs=0.01)
    assert starved["baseline_p99_s"] == pytest.approx(1.5, abs=0.01)
    assert starved["baseline_queue_wait_p99_s"] == pytest.approx(1.0, abs=0.01)
    assert starved["baseline_processing_p99_s"] == pytest.approx(0.5, abs=0.01)
    emails = _row(analysis.cold_path, queue="emails")
    assert emails["baseline_jobs"] is None and emails["baseline_p99_s"] is None
    assert "only-before" not in analysis.cold_path["queue"].to_list()
    windows = (
        analysis.cold_path_cdf.filter(pl.col("queue") == "doc-summaries")
        .group_by("window")
        .agg(pl.col("enqueue_to_ready_s").max())
    )
    assert dict(windows.iter_rows()) == pytest.approx({"current": 180.0, "baseline": 1.5}, abs=0.01)
    amp = _row(analysis.retry_amplification, workflow="claims-triage")
    assert (amp["runs"], amp["baseline_runs"]) == (200, 80)
    assert amp["attempt_amplification"] == pytest.approx(1.05)
    assert amp["baseline_attempt_amplification"] == pytest.approx(1.0)
    assert amp["baseline_token_amplification"] == pytest.approx(1.0)
    # The baseline's workflows leave the current window's hops alone.
    hops = analysis.retry_hops.filter(pl.col("workflow") == "claims-triage")
    assert hops["calls"].to_list() == [200, 200, 200]
    data = json.loads(analysis.to_json())
    (ra,) = [r for r in data["retry_amplification"] if r["workflow"] == "claims-triage"]
    assert ra["baseline_attempt_amplification"] == pytest.approx(1.0) and ra["baseline_runs"] == 80
