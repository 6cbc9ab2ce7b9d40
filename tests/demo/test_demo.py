"""``tailwatch demo``: the generator's spans through the real receiver, and the whole demo end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from collectors.pipeline import IngestPipeline
from collectors.receivers import Receivers
from collectors.settings import PipelineSettings
from collectors.spans import read_spans
from demo.generator import SCENARIO_INFO, SCENARIOS, Workload, export_otlp_http
from demo.scenarios import DemoResult, WebhookSink, format_summary, match_alerts, read_alert_lines
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
    # trace; Celery's run spans are children of their apply_async producer, in the same trace.
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
        else:
            assert parent in producers and producers[parent] == trace_id
            shapes.add("child")
    assert shapes == {"link", "child"}

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
    return {"status": "firing", "labels": {"alertname": name, **labels}, "annotations": {"cause": cause}}


def test_alerts_are_matched_to_scenarios_by_kind_target_and_cause(tmp_path: Path) -> None:
    kinds = {"p99": "p99_regression", "coupling": "release_coupling", "retries": "retry_amplification"}
    alerts = [
        _alert("p99", "internal", service="search-api", operation="GET /search"),
        _alert("p99", "internal", service="support-bot", operation="POST /reply"),  # wrong cause
        _alert("retries", "none", workflow="claims-triage"),
        _alert("p99", "llm", service="upload-api", operation="POST /documents"),  # nobody's target
    ]
    outcomes, unexpected = match_alerts(
        alerts, ("internal_regression", "llm_slowdown", "retry_storm"), kinds, tmp_path
    )
    by = {o.scenario: o for o in outcomes}
    assert by["internal_regression"].ok and by["retry_storm"].ok
    assert not by["llm_slowdown"].ok and by["llm_slowdown"].cause == "internal"
    assert by["release_coupling"].ok and not by["release_coupling"].enabled  # off and silent
    assert unexpected == ["p99 on upload-api POST /documents"]
    result = DemoResult(tmp_path, "chdb://x", (), outcomes, {}, 0, 0.0, 0, [], [], {}, unexpected)
    table = format_summary(result)
    assert "MISSED" in table and "UNEXPECTED alert: p99 on upload-api" in table and not result.ok


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
    assert summary["ok"] and not summary["missing_stages"] and not summary["unexpected"]
    alerts = read_alert_lines(out / "alerts.jsonl")
    for row in summary["outcomes"]:
        info = SCENARIO_INFO[row["scenario"]]
        assert row["enabled"] and row["caught"], row
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
    assert (
        by["noisy_neighbour"]["cause"] == "llm"
        and "cold share of openai gpt-4o-mini 0% →" in by["noisy_neighbour"]["evidence"]
    )
    assert by["release_coupling"]["kind"] == "release_coupling"
    assert by["retry_storm"]["kind"] == "retry_amplification"
    views = {Path(p).name for p in summary["dashboards"]}
    assert {"index.html", "attribution.html", "hot_path.html", "retries.html"} <= views
    assert (out / "dashboards" / "attribution.html").stat().st_size > 10_000


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
