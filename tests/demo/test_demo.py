"""``tailwatch demo``: the generator's spans through the real receiver, and the whole demo end to end."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from analytics import FRAME_SCHEMAS, Analysis, DriftFinding, DriftReport
from collectors import IngestPipeline, PipelineSettings, Receivers, read_spans
from dashboards import PLOTLY_JS
from demo import (
    SCENARIO_INFO,
    SCENARIOS,
    DemoResult,
    Scenario,
    Workload,
    export_otlp_http,
    format_summary,
)
from demo.scenarios import ScenarioOutcome, WebhookSink, alert_links, match_alerts, read_alert_lines
from storage import Store

END = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def _attr(table: pa.Table, column: str, key: str) -> list[str]:
    return [dict(m).get(key, "") for m in table.column(column).to_pylist()]


def test_spans_arrive_through_the_receiver_with_their_conventions(store: Store) -> None:
    workload = Workload(["release_coupling", "retry_storm"], seed=5, scale=0.15, end=END)
    pipeline = IngestPipeline(store, PipelineSettings(batch_rows=20_000, flush_interval_s=0.2))
    pipeline.start()
    receivers = Receivers(pipeline, http="127.0.0.1:0", grpc=None)
    try:
        receivers.start()
        stats = export_otlp_http(
            workload, f"http://127.0.0.1:{receivers.http_port}/v1/traces", batch_size=1024, concurrency=2
        )
        assert pipeline.flush(timeout_s=60)
    finally:
        receivers.stop()
        pipeline.stop()
    assert stats.failed_spans == 0 and stats.spans > 5_000

    spans = read_spans(store)
    assert spans.num_rows == stats.spans
    kinds = set(spans.column("SpanKind").to_pylist())
    assert kinds == {"Server", "Client", "Internal", "Producer", "Consumer"}
    names = spans.column("SpanName").to_pylist()
    services = spans.column("ServiceName").to_pylist()
    versions = _attr(spans, "ResourceAttributes", "service.version")
    assert {v for v, s in zip(versions, services, strict=True) if s == "chat-api"} == {
        "1.3.0",
        "1.4.0",
        "1.5.0",
    }

    # Consumers on the newer messaging conventions link to their producer's span id, in another
    # trace; Celery's run spans are children of their apply_async producer, in the same trace, or
    # the root of their trace when the publisher is not traced (Celery beat).
    span_ids = spans.column("SpanId").to_pylist()
    trace_ids = spans.column("TraceId").to_pylist()
    span_kinds = spans.column("SpanKind").to_pylist()
    producers = {
        sid: tid for sid, tid, k in zip(span_ids, trace_ids, span_kinds, strict=True) if k == "Producer"
    }
    consumer = pc.equal(spans.column("SpanKind"), "Consumer")
    linked = spans.filter(consumer)
    shapes = set()
    for trace_id, parent, link_spans in zip(
        linked.column("TraceId").to_pylist(),
        linked.column("ParentSpanId").to_pylist(),
        linked.column("Links.SpanId").to_pylist(),
        strict=True,
    ):
        if link_spans:
            assert (
                len(link_spans) == 1 and link_spans[0] in producers and producers[link_spans[0]] != trace_id
            )
            shapes.add("link")
        elif parent == "":
            # A scheduled task (digest-worker's): Celery beat publishes untraced, the run is a root.
            shapes.add("root")
        else:
            assert parent in producers and producers[parent] == trace_id
            shapes.add("child")
    assert shapes == {"link", "child", "root"}

    # GenAI attributes, stringified as the Collector does; one GenAI span per call, its HTTP
    # attempts as POST children with 429s in either HTTP convention; no resend counts anywhere.
    ops = _attr(spans, "SpanAttributes", "gen_ai.operation.name")
    assert not any(_attr(spans, "SpanAttributes", "http.request.resend_count"))
    status = [
        old or new
        for old, new in zip(
            _attr(spans, "SpanAttributes", "http.status_code"),
            _attr(spans, "SpanAttributes", "http.response.status_code"),
            strict=True,
        )
    ]
    tokens = _attr(spans, "SpanAttributes", "gen_ai.usage.input_tokens")
    chat = [i for i, op in enumerate(ops) if op == "chat"]
    assert chat and all(names[i].startswith("chat ") for i in chat)
    codes = spans.column("StatusCode").to_pylist()
    assert all(tokens[i].isdigit() for i in chat if codes[i] == "Unset")
    chat_ids = {span_ids[i] for i in chat}
    parents = spans.column("ParentSpanId").to_pylist()
    attempts = [i for i, n in enumerate(names) if n == "POST" and parents[i] in chat_ids]
    assert attempts and any(status[i] == "429" for i in attempts)
    assert "499" in status  # abandoned requests

    # Ground truth after ingest: chat-api p99 steps up with 1.5.0 and sync LLM calls go 0 -> 1.
    by_version: dict[str, list[float]] = {}
    roots = spans.filter(
        pc.and_(pc.equal(spans.column("SpanName"), "POST /chat"), pc.equal(spans.column("ParentSpanId"), ""))
    )
    root_versions = _attr(roots, "ResourceAttributes", "service.version")
    for version, duration in zip(root_versions, roots.column("Duration").to_pylist(), strict=True):
        by_version.setdefault(version, []).append(duration / 1e6)
    p99 = {v: float(np.percentile(d, 99)) for v, d in by_version.items()}
    assert p99["1.5.0"] > 3 * p99["1.4.0"]
    llm_traces = {spans.column("TraceId")[i].as_py() for i in chat if services[i] == "chat-api"}
    root_traces = roots.column("TraceId").to_pylist()
    with_llm = {
        v: np.mean([t in llm_traces for t, vv in zip(root_traces, root_versions, strict=True) if vv == v])
        for v in p99
    }
    assert with_llm["1.4.0"] == 0.0 and with_llm["1.5.0"] == 1.0


def test_webhook_sink_writes_one_line_per_body(tmp_path: Path) -> None:
    path = tmp_path / "alerts.jsonl"
    with WebhookSink(path) as sink:
        assert sink.url.startswith("http://127.0.0.1:")
        for i in range(3):
            body = json.dumps({"version": "4", "n": i, "alerts": []}, indent=2)
            r = httpx.post(sink.url, content=body, headers={"Content-Type": "application/json"})
            assert r.status_code == 200
        assert httpx.post(sink.url, content=b"not json").status_code == 400
    lines = path.read_text().splitlines()
    assert [json.loads(line)["n"] for line in lines] == [0, 1, 2]


def _alert(name: str, cause: str, **labels: str) -> dict[str, Any]:
    # The annotations carry prose too; the demo reads nothing of them but the cause.
    notes = {"cause": cause, "summary": "p99 of X 1.0 s → 9.9 s", "llm_cold_share": "0 → 0.9"}
    return {"status": "firing", "labels": {"alertname": name, **labels}, "annotations": notes}


def _analysis(**rows: list[dict[str, Any]]) -> Analysis:
    """An analysis whose frames hold ``rows`` (frame name → row dicts; other frames empty)."""
    window = {"start": END - timedelta(days=1), "end": END}
    empty = Analysis.from_frame_bytes(
        {**window, "baseline_start": END - timedelta(days=2), "baseline_end": window["start"]}, {}
    )
    return replace(empty, **{name: pl.DataFrame(r, schema=FRAME_SCHEMAS[name]) for name, r in rows.items()})


def _scenario(name: Scenario) -> dict[str, str]:
    info = SCENARIO_INFO[name]
    return {"service": info.service, "operation": info.operation}


def test_alerts_are_matched_to_scenarios_by_kind_target_and_cause(tmp_path: Path) -> None:
    kinds = {"p99": "p99_regression", "coupling": "release_coupling", "retries": "retry_amplification"}
    alerts = [
        _alert("p99", "internal", service="search-api", operation="GET /search"),
        _alert("p99", "internal", service="support-bot", operation="POST /reply"),  # wrong cause
        _alert("retries", "none", workflow="claims-triage"),
        _alert("p99", "llm", service="upload-api", operation="POST /documents"),  # nobody's target
    ]
    analysis = _analysis(
        attribution_spans=[
            {
                **_scenario("internal_regression"),
                "span_name": "SELECT documents",
                "class": "internal",
                "delta_ms": 1550.0,
            }
        ],
        attribution=[{**_scenario("internal_regression"), "exemplar_trace_ids": ["a" * 32, "b" * 32]}],
        retry_amplification=[
            {
                "workflow": "claims-triage",
                "runs": 400,
                "attempt_amplification": 1.314,
                "token_amplification": 1.106,
                "exemplar_trace_id": "c" * 32,
            }
        ],
    )
    outcomes, unexpected = match_alerts(
        alerts, ("internal_regression", "llm_slowdown", "retry_storm"), kinds, tmp_path, analysis
    )
    by = {o.scenario: o for o in outcomes}
    assert by["internal_regression"].ok and by["retry_storm"].ok
    assert by["internal_regression"].evidence == "SELECT documents +1.6 s"
    assert by["internal_regression"].exemplar_trace == "a" * 32
    assert by["retry_storm"].evidence == "attempts ×1.31, tokens ×1.11"
    assert by["retry_storm"].exemplar_trace == "c" * 32
    assert not by["llm_slowdown"].ok and by["llm_slowdown"].cause == "internal"
    assert by["release_coupling"].ok and not by["release_coupling"].enabled  # off and silent
    assert unexpected == ["p99 on upload-api POST /documents"]
    result = DemoResult(
        out_dir=tmp_path,
        store_dsn="chdb://x",
        scenarios=(),
        outcomes=outcomes,
        timings={},
        spans=0,
        spans_per_s=0.0,
        alerts_delivered=0,
        dashboards=[],
        period={},
        unexpected=unexpected,
    )
    table = format_summary(result)
    assert "MISSED" in table and "UNEXPECTED alert: p99 on upload-api" in table and not result.ok
    assert f"trace {'c' * 32}" in table


def test_llm_evidence_tells_a_noisy_neighbour_from_a_slow_provider(tmp_path: Path) -> None:
    # The same alert on both operations; the cold-path share of calls to the model behind the
    # change (the LLM span adding the most time, not the first signals row) decides.
    kinds = {"p99": "p99_regression"}
    ask, reply = _scenario("noisy_neighbour"), _scenario("llm_slowdown")
    alerts = [_alert("p99", "llm", **ask), _alert("p99", "llm", **reply)]

    def signals(where: dict[str, str], model: str, before: float, after: float) -> dict[str, Any]:
        provider = "openai" if model.startswith("gpt") else "anthropic"
        return {
            **where,
            "provider": provider,
            "model": model,
            "cold_share_baseline": before,
            "cold_share_current": after,
        }

    def span(where: dict[str, str], name: str, cls: str, model: str, delta: float) -> dict[str, Any]:
        provider = "openai" if model.startswith("gpt") else "anthropic" if model else ""
        return {
            **where,
            "span_name": name,
            "class": cls,
            "provider": provider,
            "model": model,
            "delta_ms": delta,
        }

    def run(
        ask_share: float, reply_share: float, reply_cause: str = "provider_generation"
    ) -> dict[str, ScenarioOutcome]:
        text = f"{reply_cause.replace('_', ' ')} (the provider): generation 1.3 → 7.7 ms per output token"
        analysis = _analysis(
            attribution=[{**reply, "verdict": "llm", "llm_cause": reply_cause, "llm_cause_text": text}],
            attribution_spans=[
                span(ask, "SELECT profiles", "internal", "", 40.0),
                span(ask, "chat gpt-4o-mini", "llm", "gpt-4o-mini", 1900.0),
                span(reply, "chat claude-sonnet-4", "llm", "claude-sonnet-4", 3700.0),
            ],
            llm_signals=[
                signals(ask, "gpt-4.1-nano", 0.0, 0.0),
                signals(ask, "gpt-4o-mini", 0.0, ask_share),
                signals(reply, "claude-sonnet-4", 0.0, reply_share),
            ],
        )
        outcomes, _ = match_alerts(alerts, ("noisy_neighbour", "llm_slowdown"), kinds, tmp_path, analysis)
        return {o.scenario: o for o in outcomes}

    by = run(ask_share=0.21, reply_share=0.0)
    assert (
        by["noisy_neighbour"].evidence == "chat gpt-4o-mini +1.9 s; cold share of openai gpt-4o-mini 0% → 21%"
    )
    assert by["llm_slowdown"].evidence == (
        "chat claude-sonnet-4 +3.7 s; cold share 0% → 0%; "
        "provider generation (the provider): generation 1.3 → 7.7 ms per output token"
    )
    assert by["noisy_neighbour"].ok and by["llm_slowdown"].ok
    # The same slowdown read as the provider's first token: not the scenario's cause, not caught.
    assert not run(ask_share=0.21, reply_share=0.0, reply_cause="provider_first_token")["llm_slowdown"].ok
    by = run(ask_share=0.05, reply_share=0.3)  # the evidence points the other way: both missed
    assert not by["noisy_neighbour"].ok and not by["llm_slowdown"].ok
    assert by["noisy_neighbour"].cause == "llm" and not by["noisy_neighbour"].evidence_ok


def test_release_evidence_is_the_release_that_added_sync_llm_calls(tmp_path: Path) -> None:
    where = _scenario("release_coupling")
    alerts = [_alert("coupling", "llm", **where)]

    def release(version: str, days_ago: float, before: float, after: float) -> dict[str, Any]:
        return {
            **where,
            "version": version,
            "released_at": END - timedelta(days=days_ago),
            "sync_llm_calls_per_request_before": before,
            "sync_llm_calls_per_request_after": after,
        }

    def evidence(*rows: dict[str, Any]) -> tuple[str, bool]:
        analysis = _analysis(releases=list(rows))
        outcomes, _ = match_alerts(
            alerts, ("release_coupling",), {"coupling": "release_coupling"}, tmp_path, analysis
        )
        o = next(o for o in outcomes if o.scenario == "release_coupling")
        return o.evidence, o.evidence_ok

    added = release("1.5.0", 1.0, 0.0, 1.0)
    text, ok = evidence(release("1.4.0", 2.5, 0.0, 0.0), added)
    assert text.startswith("1.5.0: sync LLM calls/request 0.00 → 1.00; ") and ok
    # A later release that adds nothing does not hide the one that did.
    assert evidence(added, release("1.5.1", 0.5, 1.0, 1.0))[0].startswith("1.5.0:")
    text, ok = evidence(release("1.4.0", 2.5, 0.0, 0.2))
    assert text.startswith("1.4.0: sync LLM calls/request 0.00 → 0.20; ") and not ok
    text, ok = evidence()
    assert text.startswith("no release in the window; ") and not ok


def test_release_evidence_names_the_boundary_recommendation(tmp_path: Path) -> None:
    where = _scenario("release_coupling")
    alerts = [_alert("coupling", "llm", **where)]
    releases = [
        {
            **where,
            "version": "1.5.0",
            "released_at": END - timedelta(days=1),
            "sync_llm_calls_per_request_before": 0.0,
            "sync_llm_calls_per_request_after": 1.0,
        }
    ]
    row = {
        **where,
        "requests": 2400,
        "p99_ms": 3920.0,
        "budget_ms": 2000.0,
        "budget_source": "cliff",
        "sync_llm_calls_per_request": 1.0,
        "p99_without_sync_llm_ms": 182.0,
        "recommendation": "move_off_hot_path",
        "reasons": ["p99 3.9 s is over the 2.0 s budget", "without its sync LLM calls p99 would be 182 ms"],
    }
    other = {**row, "operation": "POST /other", "recommendation": "keep"}
    analysis = replace(
        _analysis(releases=releases), boundary=pl.DataFrame([other, row], schema=FRAME_SCHEMAS["boundary"])
    )
    outcomes, _ = match_alerts(
        alerts, ("release_coupling",), {"coupling": "release_coupling"}, tmp_path, analysis
    )
    o = next(o for o in outcomes if o.scenario == "release_coupling")
    assert o.evidence == (
        "1.5.0: sync LLM calls/request 0.00 → 1.00; "
        "move_off_hot_path: p99 3.9 s, budget 2.0 s, 182 ms without sync LLM"
    )
    assert o.ok


def _slice(
    variant: str, requests: int, p99_ms: float, cold_p99_s: float | None, control: bool
) -> dict[str, Any]:
    return {
        **_scenario("hot_cold_migration"),
        "flag": "summarize-off-hot-path",
        "variant": variant,
        "requests": requests,
        "p50_ms": p99_ms / 2,
        "p99_ms": p99_ms,
        "abandonment_rate": 0.13 if control else 0.004,
        "abandonment_rate_low": 0.1 if control else 0.0,
        "abandonment_rate_high": 0.16 if control else 0.02,
        "sync_llm_calls_per_request": 1.0 if control else 0.0,
        "cold_p99_s": cold_p99_s,
        "p99_delta_ms": None if control else p99_ms - 3157.0,
        "abandonment_delta": None if control else -0.126,
        "significant": None if control else True,
        "is_control": control,
    }


def test_migration_is_scored_from_the_slices_frame(tmp_path: Path) -> None:
    # No alert is expected on the migrated operation: the slices are the evidence.
    def run(*rows: dict[str, Any], alerts: tuple[dict[str, Any], ...] = ()) -> ScenarioOutcome:
        analysis = _analysis(slices=list(rows))
        outcomes, _ = match_alerts(
            list(alerts), ("hot_cold_migration",), {"p99": "p99_regression"}, tmp_path, analysis
        )
        return next(o for o in outcomes if o.scenario == "hot_cold_migration")

    sync, fast = _slice("sync", 579, 3157.0, None, True), _slice("async", 236, 25.0, 10.7, False)
    o = run(sync, fast)
    assert o.evidence == "summarize-off-hot-path: sync 71% p99 3.2 s vs async 29% p99 25 ms, cold p99 10.7 s"
    assert o.ok and o.caught and o.scored and o.expected_kind is None
    assert o.where.endswith(".html")
    # The async variant no faster than control, a split far from the rollout's, one variant only,
    # another flag only, or an alert on the operation: not what the migration should show.
    assert not run(sync, _slice("async", 236, 2900.0, 10.7, False)).ok
    assert not run(sync, _slice("async", 40, 25.0, 10.7, False)).ok
    assert not run(sync).ok and run(sync).evidence.startswith("summarize-off-hot-path: variants sync,")
    assert not run({**sync, "flag": "other"}, {**fast, "flag": "other"}).ok
    p99_alert = _alert("p99", "llm", **_scenario("hot_cold_migration"))
    assert not run(sync, fast, alerts=(p99_alert,)).ok
    # The analysis must compare against the sync variant.
    swapped = run({**sync, "is_control": False}, {**fast, "is_control": True})
    assert not swapped.ok and swapped.evidence.endswith("does not take sync as the control")
    # The cold p99 may be unknown (no job finished): shown as such.
    assert run(sync, {**fast, "cold_p99_s": None}).evidence.endswith("cold p99 n/a")


def test_migration_without_a_slices_frame_is_not_scored(tmp_path: Path) -> None:
    analysis = replace(_analysis(), slices=pl.DataFrame(schema={"service": pl.String}))
    expected = "slices frame lacks operation, flag, variant, requests, p99_ms, cold_p99_s"
    outcomes, _ = match_alerts([], ("hot_cold_migration",), {}, tmp_path, analysis)
    o = next(o for o in outcomes if o.scenario == "hot_cold_migration")
    assert o.evidence == expected and not o.scored and not o.caught
    # Only the silence is checked: ok, shown as n/a.
    assert o.ok
    result = DemoResult(
        out_dir=tmp_path,
        store_dsn="chdb://x",
        scenarios=("hot_cold_migration",),
        outcomes=outcomes,
        timings={},
        spans=0,
        spans_per_s=0.0,
        alerts_delivered=0,
        dashboards=[],
        period={},
    )
    line = next(line for line in format_summary(result).splitlines() if "hot_cold_migration" in line)
    assert f"{expected}  n/a" in line and result.ok


def _drift_finding(
    kind: str, service: str, operation: str, since: datetime, **evidence: float
) -> DriftFinding:
    return DriftFinding(kind, service, operation, "", since, dict(evidence))  # type: ignore[arg-type]


def test_batch_drift_is_scored_from_the_drift_report(tmp_path: Path) -> None:
    # No alert is expected: the drift report is the evidence. Its last day is when the endpoint began.
    info = SCENARIO_INFO["batch_drift"]
    last_day = END - timedelta(days=1)
    shared = _drift_finding(
        "shared_operation",
        info.service,
        info.operation,
        last_day,
        hot_share_then=0.0,
        hot_share_now=0.84,
        hot_p99_ms_now=1800.0,
    )
    batch = _drift_finding(
        "batch_shrinking",
        "digest-worker",
        "run/digests.summarize_batch",
        END - timedelta(days=2),
        runs_per_day_then=1.0,
        items_per_run_then=120.0,
        runs_per_day_now=24.0,
        items_per_run_now=3.0,
    )

    retried = _drift_finding(
        "whole_batch_retry",
        "digest-worker",
        "run/digests.summarize_batch",
        last_day,
        items_reprocessed_per_failed_item=3.0,
        retried_jobs=6,
    )

    def run(*findings: DriftFinding, read: bool = True) -> ScenarioOutcome:
        analysis = _analysis()
        if read:
            analysis = analysis.with_drift(DriftReport(tuple(findings), END, 3, 1))
        outcomes, _ = match_alerts([], ("batch_drift",), {}, tmp_path, analysis)
        return next(o for o in outcomes if o.scenario == "batch_drift")

    o = run(shared, batch, retried)
    assert o.ok and o.caught and o.scored and o.expected_kind is None
    assert run(replace(shared, since_release="0.3.0"), batch, retried).evidence.startswith(
        "shared_operation since 11-29 with 0.3.0: hot share"
    )
    assert o.evidence == (
        "shared_operation since 11-29: hot share 0% → 84%, hot p99 1.8 s; "
        "batch_shrinking since 11-28: 1 run/day of 120 → 24 of 3; "
        "whole_batch_retry since 11-29: 3 items reprocessed per failed item, 6 retried jobs"
    )
    assert o.where.endswith("drift.html")
    # The shared function found from another day, a kind missing, or no report: not it.
    assert not run(replace(shared, since=END - timedelta(days=2)), batch, retried).ok
    assert not run(shared, batch).ok and not run(batch, retried).ok and not run(shared, retried).ok
    assert not run().caught and run().evidence == "no drift finding"
    unread = run(read=False)
    assert not unread.scored and unread.evidence == "no drift report with the analysis"


def _run_demo(out: Path, *scenario_args: str) -> dict[str, Any]:
    cmd = [
        sys.executable,
        "-m",
        "tailwatch",
        "demo",
        "--out",
        str(out),
        "--scale",
        "0.3",
        "--seed",
        "7",
        "--end",
        "2026-11-30T12:00:00Z",
        "--quiet",
        *scenario_args,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "scenario" in done.stdout and "where to look" in done.stdout
    return json.loads((out / "summary.json").read_text())


@pytest.mark.slow
def test_demo_end_to_end_every_scenario_raises_its_alert(tmp_path: Path) -> None:
    out = tmp_path / "demo-out"
    summary = _run_demo(out)
    assert summary["ok"] and not summary["unexpected"]
    alerts = read_alert_lines(out / "alerts.jsonl")
    for row in summary["outcomes"]:
        info = SCENARIO_INFO[row["scenario"]]
        assert row["enabled"] and row["ok"], row
        if info.alert_kind is None:
            # The migration: no alert on the operation; the slices show the split and the faster
            # async variant.
            assert row["alerts"] == []
            assert row["caught"], row
            continue
        assert row["caught"], row
        matching = [
            a
            for a in alerts
            if (a["labels"].get("service"), a["labels"].get("operation")) == (info.service, info.operation)
            or a["labels"].get("workflow") == info.operation
        ]
        assert matching, row["scenario"]
        if info.cause is not None:
            assert info.cause in {a["annotations"].get("cause") for a in matching}
    by = {row["scenario"]: row for row in summary["outcomes"]}
    assert by["internal_regression"]["cause"] == "internal"
    assert by["llm_slowdown"]["cause"] == "llm"
    # Inside llm: (e) the provider's generation (read from the estimate: its calls are not
    # streamed), (h) our prompt (its streamed calls record their first token).
    assert "provider generation (the provider): generation " in by["llm_slowdown"]["evidence"]
    assert "longer prompts (our change): prompts " in by["prompt_growth"]["evidence"]
    [grown] = [a for a in alerts if a["labels"].get("service") == "writer-api"]
    assert (
        grown["annotations"]["llm_cause"] == "longer_prompts"
        and grown["annotations"]["llm_cause_owner"] == "ours"
    )
    assert (
        by["noisy_neighbour"]["cause"] == "llm"
        and "cold share of openai gpt-4o-mini 0% →" in by["noisy_neighbour"]["evidence"]
    )
    assert by["release_coupling"]["kind"] == "release_coupling"
    boundary_note = by["release_coupling"]["evidence"].split("; ", 1)[1]
    assert boundary_note.startswith("move_off_hot_path:")
    assert by["retry_storm"]["kind"] == "retry_amplification"
    # (g) the nightly summariser moved into the request path: found from the drift report with the
    # day the endpoint appeared (the last of the three days, END - 1 day), its batches shrinking
    # from the second, and the endpoint without a latency target; no alert on it.
    drift = by["batch_drift"]["evidence"]
    # The endpoint arrived with digest-api 0.3.0 (first seen that day); the hourly schedule with no
    # new version of digest-worker.
    assert drift.startswith("shared_operation since 11-29 with 0.3.0: hot share 0% → "), drift
    # Runs now: the 24 hourly ones and their retries (a retry is a run of the batch too).
    assert re.search(r"batch_shrinking since 11-28: 1 run/day of 120 → (2[4-9]|3[0-6]) of 3;", drift), drift
    assert "no_latency_target since 11-29 with 0.3.0: POST /summaries/now" in drift
    assert "whole_batch_retry since 11-29: 3 items reprocessed per failed item" in drift
    assert by["batch_drift"]["alerts"] == [] and by["batch_drift"]["where"].endswith("drift.html")
    drift_page = (out / "dashboards" / "drift.html").read_text(encoding="utf-8")
    assert "summarize_document (digests.summaries.summarize_document) serves both" in drift_page
    assert "no sign of drift" not in drift_page
    views = {Path(p).name for p in summary["dashboards"]}
    assert {"index.html", "attribution.html", "hot_path.html", "retries.html"} <= views
    assert (out / "dashboards" / "attribution.html").stat().st_size > 10_000
    _every_alert_link_opens_a_page_the_demo_wrote(out)
    # The landing page names the release the release-coupling alert fired on (issue 39: it said
    # "0 with p99 coupled to releases" beside that alert).
    [coupling] = [a for a in alerts if a["labels"]["alertname"] == "hot-path-release-coupling"]
    assert "release 1.5.0" in coupling["annotations"]["summary"]
    index = (out / "dashboards" / "index.html").read_text(encoding="utf-8")
    assert (
        "1 release in the window stepped p99 up or added sync LLM calls: 1.5.0 on chat-api · POST /chat"
        in index
    )


def _every_alert_link_opens_a_page_the_demo_wrote(out: Path) -> None:
    """Issue 39: the alerts linked to dashboards/runs/<id>/… pages the demo never wrote. Every link
    in alerts.jsonl is now a file under OUT that exists, and a linked run page draws offline from
    disk with the shared plotly.js."""
    from urllib.parse import unquote, urlparse

    from tests.dashboards.browser import chromium, open_page

    links = alert_links(out / "alerts.jsonl")
    assert links, "no alert carries a link"
    pages = []
    for link in links:
        assert link.startswith("file://"), link
        path = Path(unquote(urlparse(link).path))
        assert path.is_file() and path.resolve().is_relative_to(out.resolve()), link
        pages.append(path)
    runs = [p for p in pages if p.parent.parent.name == "runs"]
    assert runs, links
    assert (out / "dashboards" / PLOTLY_JS).is_file()
    # About 60 KB a page: one plotly.js beside the views, not 4.8 MB in each.
    assert all(p.stat().st_size < 1_000_000 for p in (out / "dashboards").rglob("*.html"))
    with chromium() as browser:
        report = open_page(browser, runs[0], out)
    assert report.blocked_requests == [] and report.console_errors == [] and report.page_errors == []
    assert report.dom["plots"] and report.dom["plots"][0]["marks"] > 0


@pytest.mark.slow
def test_demo_switched_off_scenarios_raise_nothing(tmp_path: Path) -> None:
    out = tmp_path / "demo-out"
    summary = _run_demo(out, "--scenario", "internal_regression")
    by = {row["scenario"]: row for row in summary["outcomes"]}
    assert by["internal_regression"]["caught"]
    for name in SCENARIOS:
        if name != "internal_regression":
            assert not by[name]["enabled"] and by[name]["alerts"] == [], by[name]
    assert not summary["unexpected"]
    assert len(read_alert_lines(out / "alerts.jsonl")) == 1
    # (g) off: a stable nightly job whose function nobody else calls drifts nowhere.
    index = (out / "dashboards" / "index.html").read_text(encoding="utf-8")
    assert "no sign of drift in the 3 days before 2026-11-30 12:00 UTC" in index
