"""An incident's whole life, as a small instrumented service tells it: the OpenTelemetry SDK's spans
over OTLP/HTTP into the receiver, the rules evaluated every minute.

22 minutes of ``claims-api POST /chat`` at 10 requests a second: release 1.1.0 adds a second
synchronous model call at 5 min (about +100 ms); the provider slows from 80 to 700 ms at 8 min 20 s
on the same version, and recovers at 15 min. The release's step stays about +100 ms; the slowdown
is its own ``p99_regression`` with cause ``llm``, which stays firing until p99 is back near the
baseline it fired against (not when its sliding window has filled with the incident), and no alert's
fired text changes afterwards. Expected figures come from the spans the SDK produced (an in-memory
exporter beside the OTLP one).
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from analytics import analyze
from collectors.pipeline import IngestPipeline
from collectors.receivers import Receivers
from collectors.settings import PipelineSettings
from slo_rules import evaluate
from slo_rules.rules import rules_from_text
from storage import Store

T0 = datetime(2026, 11, 2, 6, 9, 0, tzinfo=UTC)
NS = 1_000_000_000
RELEASE_S, SLOW_S, RECOVER_S, END_S = 300.0, 500.0, 900.0, 1320.0

RULES = rules_from_text(
    """
rules:
  - name: chat-p99
    kind: p99_regression
    service: claims-api
    operation: "POST /chat"
    window: 5m
    baseline: previous
    min_increase: {relative: 0.25, absolute_ms: 300}
    min_requests: 200
    severity: page
  - name: chat-releases
    kind: release_coupling
    service: claims-api
    operation: "POST /chat"
    window: 1d
    min_sync_llm_increase: 0.5
"""
)


def _ns(seconds: float) -> int:
    return int(T0.timestamp() * NS) + int(seconds * NS)


def _emit(endpoint: str) -> list[ReadableSpan]:
    """The service's traffic through the SDK: one provider per version (the resource carries
    ``service.version``), each exporting over OTLP/HTTP and into memory."""
    memory = InMemorySpanExporter()
    providers = {}
    for version in ("1.0.0", "1.1.0"):
        provider = TracerProvider(
            resource=Resource.create({"service.name": "claims-api", "service.version": version})
        )
        provider.add_span_processor(
            # A queue that holds the whole run: the load is generated faster than real time.
            BatchSpanProcessor(
                OTLPSpanExporter(endpoint=f"{endpoint}/v1/traces"),
                max_queue_size=100_000,
                max_export_batch_size=2048,
            )
        )
        provider.add_span_processor(SimpleSpanProcessor(memory))
        providers[version] = provider
    rng = random.Random(39)
    for i in range(int(END_S * 10)):
        t = i / 10
        version = "1.0.0" if t < RELEASE_S else "1.1.0"
        tracer = providers[version].get_tracer("claims-api")
        model_ms = 700.0 if SLOW_S <= t < RECOVER_S else 80.0
        calls = 1 if version == "1.0.0" else 2
        root = tracer.start_span(
            "POST /chat",
            kind=SpanKind.SERVER,
            start_time=_ns(t),
            attributes={
                "http.request.method": "POST",
                "http.route": "/chat",
                "http.response.status_code": 200,
            },
        )
        context = trace.set_span_in_context(root)
        cursor = t + rng.lognormvariate(3.4, 0.3) / 1000  # ~30 ms of our own work first
        for _ in range(calls):
            took = model_ms * rng.lognormvariate(0.0, 0.15) / 1000
            call = tracer.start_span(
                "chat gpt-4o-mini",
                context=context,
                kind=SpanKind.CLIENT,
                start_time=_ns(cursor),
                attributes={
                    "gen_ai.operation.name": "chat",
                    "gen_ai.provider.name": "openai",
                    "gen_ai.request.model": "gpt-4o-mini",
                    "gen_ai.usage.input_tokens": 400,
                    "gen_ai.usage.output_tokens": 60,
                },
            )
            call.end(end_time=_ns(cursor + took))
            cursor += took
        root.end(end_time=_ns(cursor + rng.lognormvariate(3.0, 0.3) / 1000))
    for provider in providers.values():
        assert provider.force_flush(60_000)
        provider.shutdown()
    return list(memory.get_finished_spans())


@pytest.fixture
def spans(store: Store, tmp_path: Path) -> list[ReadableSpan]:
    pipeline = IngestPipeline(
        store, PipelineSettings(batch_rows=5_000, flush_interval_s=0.05, spool_dir=tmp_path / "spool")
    )
    pipeline.start()
    receivers = Receivers(pipeline, http="127.0.0.1:0", grpc=None)
    receivers.start()
    try:
        emitted = _emit(f"http://127.0.0.1:{receivers.http_port}")
    finally:
        receivers.stop()
        pipeline.stop(timeout_s=60)
    return emitted


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_a_release_then_a_provider_slowdown_over_the_incident_s_life(
    store: Store, spans: list[ReadableSpan]
) -> None:
    roots = sorted(
        (s for s in spans if s.kind == SpanKind.SERVER),
        key=lambda s: s.start_time or 0,
    )
    assert len(roots) == int(END_S * 10)
    fired_text: dict[str, dict[str, str]] = {}
    fired_at: dict[str, float] = {}
    resolved_at: dict[str, float] = {}
    for minute in range(6, 23):
        result = evaluate(store, RULES, _at(minute * 60), dashboard_links=False)
        assert result.errors == []
        for state in result.fired:
            fired_text[state.alertname] = dict(state.annotations)
            fired_at[state.alertname] = minute * 60
        for state in result.resolved:
            resolved_at[state.alertname] = minute * 60
            assert "resolved" in state.annotations  # the numbers that resolved it
            assert {k: v for k, v in state.annotations.items() if k not in ("resolved", "latest")} == (
                fired_text[state.alertname]
            )
        for state in result.alerts:
            # No evaluation rewrites what an alert fired with (later ones only add).
            kept = {k: v for k, v in state.annotations.items() if k not in ("resolved", "latest")}
            assert kept == fired_text[state.alertname], (minute, state.alertname)

    # The release alert fired for the release itself, right after it.
    releases = fired_text["chat-releases"]
    assert fired_at["chat-releases"] == 360 and releases["release"] == "1.1.0"
    assert releases["sync_llm_calls_per_request"] == "1.00 → 2.00"
    # The slowdown is a regression of its own, blamed on the LLM, firing within a minute of it...
    regression = fired_text["chat-p99"]
    assert fired_at["chat-p99"] == 540 and regression["cause"] == "llm"
    # ...against the baseline it fired with, until p99 is back near it: once the 5-minute window
    # holds no slow request (15 min + 5 min), not at 13 min when the window before it had filled
    # with the incident itself.
    assert resolved_at["chat-p99"] == 20 * 60
    assert regression["baseline_window"] == "2026-11-02T06:08:00Z/2026-11-02T06:13:00Z"

    # The release's own step, in the analysis of the last window: about +100 ms, computed from
    # its first 1000 requests and the requests of as long before it — the SDK's own spans agree.
    analysis = analyze(store, _at(END_S - 3600), _at(END_S))
    (step,) = analysis.releases.filter(analysis.releases["version"] == "1.1.0").iter_rows(named=True)
    ms = np.array([((r.end_time or 0) - (r.start_time or 0)) / 1e6 for r in roots])
    starts = np.array([(r.start_time or 0) for r in roots])
    versions = np.array([r.resource.attributes["service.version"] for r in roots])
    released = _ns(RELEASE_S)
    after = ms[(starts >= released) & (versions == "1.1.0")][:1000]
    end = int(starts[(starts >= released) & (versions == "1.1.0")][999]) + 1000
    before = ms[(starts >= released - (end - released)) & (starts < released)][-1000:]
    assert step["requests_after"] == after.size == 1000 and step["requests_before"] == before.size
    assert step["p99_after_ms"] == pytest.approx(np.percentile(after, 99), abs=1e-3)
    assert step["p99_before_ms"] == pytest.approx(np.percentile(before, 99), abs=1e-3)
    assert 50 < step["p99_delta_ms"] < 160
    # The version's whole life holds the slowdown: far more than its step.
    assert np.percentile(ms[versions == "1.1.0"], 99) > 1000
