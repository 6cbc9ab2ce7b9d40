"""The workload generator: OpenTelemetry conventions on every span, and each scenario's ground truth.

The checks read the SDK spans directly (fast); test_demo.py checks the same traffic after ingest.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode

from tailwatch.cli import main
from tailwatch.generator import (
    SCENARIO_INFO,
    SCENARIOS,
    GeneratorError,
    Workload,
    abandon_probability,
    generate,
    parse_scenarios,
    write_otlp_file,
)

END = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
SCALE = 0.25


class Traffic:
    """Spans of one workload grouped per trace, with the windows of its timeline."""

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self.spans = workload.spans()
        self.traces: dict[int, list[ReadableSpan]] = defaultdict(list)
        for span in self.spans:
            self.traces[span.context.trace_id].append(span)
        tl = workload.timeline
        self.baseline = (tl.ns(tl.baseline_start), tl.ns(tl.current_start))
        self.current = (tl.ns(tl.current_start), tl.ns(tl.end))

    def window_of(self, t: int) -> str | None:
        if self.baseline[0] <= t < self.baseline[1]:
            return "baseline"
        if self.current[0] <= t < self.current[1]:
            return "current"
        return None

    def roots(self, service: str, name: str) -> Iterable[tuple[str, ReadableSpan, list[ReadableSpan]]]:
        for spans in self.traces.values():
            root = next(s for s in spans if s.parent is None)
            if root.name == name and root.resource.attributes["service.name"] == service:
                window = self.window_of(_start(root))
                if window is not None:
                    yield window, root, spans

    def p99_ms(self, service: str, name: str) -> dict[str, float]:
        values: dict[str, list[float]] = defaultdict(list)
        for window, root, _ in self.roots(service, name):
            values[window].append(_duration_ms(root))
        return {w: float(np.percentile(v, 99)) for w, v in values.items()}

    def child_p99_ms(self, service: str, name: str, child: str) -> dict[str, float]:
        values: dict[str, list[float]] = defaultdict(list)
        for window, _, spans in self.roots(service, name):
            values[window] += [_duration_ms(s) for s in spans if s.name == child]
        return {w: float(np.percentile(v, 99)) for w, v in values.items()}

    def llm_calls_per_request(self, service: str, name: str) -> dict[str, float]:
        calls: dict[str, list[int]] = defaultdict(list)
        for window, _, spans in self.roots(service, name):
            # Logical calls: attempts share the parent and the name; count the final ones.
            finals = [
                s
                for s in spans
                if s.attributes.get("gen_ai.operation.name") == "chat"
                and s.attributes.get("http.response.status_code") == 200
            ]
            calls[window].append(len(finals))
        return {w: float(np.mean(v)) for w, v in calls.items()}

    def abandonment(self, service: str, name: str) -> dict[str, float]:
        rates: dict[str, list[bool]] = defaultdict(list)
        for window, root, _ in self.roots(service, name):
            rates[window].append(root.attributes["http.response.status_code"] == 499)
        return {w: float(np.mean(v)) for w, v in rates.items()}

    def attempt_amplification(self) -> dict[str, float]:
        calls: dict[str, int] = defaultdict(int)
        attempts: dict[str, int] = defaultdict(int)
        for window, _, spans in self.roots("agent-runner", "invoke_workflow claims-triage"):
            hops = [s for s in spans if s.parent is not None]
            calls[window] += len({s.name for s in hops})
            attempts[window] += len(hops)
        return {w: attempts[w] / calls[w] for w in calls}

    def cold_share(self, model: str) -> dict[str, float]:
        counts: dict[str, list[bool]] = defaultdict(list)
        for spans in self.traces.values():
            root = next(s for s in spans if s.parent is None)
            window = self.window_of(_start(root))
            if window is None:
                continue
            for span in spans:
                if span.attributes.get("gen_ai.request.model") == model:
                    counts[window].append(root.kind is SpanKind.CONSUMER)
        return {w: float(np.mean(v)) for w, v in counts.items()}

    def signature(self, service: str) -> list[tuple[str, int, int]]:
        return sorted(
            (s.name, _start(s), _end(s))
            for s in self.spans
            if s.resource.attributes["service.name"] == service
        )


def _start(span: ReadableSpan) -> int:
    assert span.start_time is not None
    return span.start_time


def _end(span: ReadableSpan) -> int:
    assert span.end_time is not None
    return span.end_time


def _duration_ms(span: ReadableSpan) -> float:
    return (_end(span) - _start(span)) / 1e6


@pytest.fixture(scope="module")
def everything() -> Traffic:
    return Traffic(Workload(seed=11, scale=SCALE, end=END))


@pytest.fixture(scope="module")
def healthy() -> Traffic:
    return Traffic(Workload([], seed=11, scale=SCALE, end=END))


def test_same_seed_same_spans_other_seed_other_spans() -> None:
    def head(seed: int) -> list[tuple[int, int, str, int, int]]:
        spans = next(iter(Workload(seed=seed, scale=0.05, end=END).batches(256)))
        return [(s.context.trace_id, s.context.span_id, s.name, _start(s), _end(s)) for s in spans]

    assert head(3) == head(3)
    assert head(3) != head(4)
    batch = next(generate(scale=0.05, seed=3, end=END, batch_size=256))
    assert [(s.context.trace_id, s.name, _start(s)) for s in batch] == [
        (t, n, st) for t, _, n, st, _ in head(3)
    ]


def test_spans_carry_the_conventions(everything: Traffic) -> None:
    spans = everything.spans
    tl = everything.workload.timeline
    start_ns, end_ns = tl.ns(tl.start), tl.ns(tl.end)
    assert len(spans) > 20_000
    for span in spans:
        res = span.resource.attributes
        assert res["service.name"] and res["service.version"]
        assert start_ns <= _start(span) < _end(span)
        if span.parent is None:
            assert _start(span) < end_ns  # nothing starts after the simulated end
    roots = [s for s in spans if s.parent is None]
    assert {s.kind for s in roots} == {SpanKind.SERVER, SpanKind.CONSUMER, SpanKind.INTERNAL}
    statuses = {s.attributes["http.response.status_code"] for s in roots if s.kind is SpanKind.SERVER}
    assert statuses == {200, 202, 499}

    llm = [s for s in spans if s.attributes.get("gen_ai.operation.name") in ("chat", "embeddings")]
    assert llm and all(s.kind is SpanKind.CLIENT for s in llm)
    for s in llm:
        model = s.attributes["gen_ai.request.model"]
        assert s.name == f"{s.attributes['gen_ai.operation.name']} {model}"
        assert s.attributes["gen_ai.provider.name"] in ("openai", "anthropic")
        if s.attributes.get("http.response.status_code") == 200:
            assert s.attributes["gen_ai.usage.input_tokens"] > 0
            assert "gen_ai.usage.output_tokens" in s.attributes
        elif s.attributes.get("http.response.status_code") == 429:
            assert s.attributes["error.type"] == "429"
            assert s.status.status_code is StatusCode.ERROR
    assert any(s.name == "chat gpt-4o-mini" for s in llm)

    # One span per attempt: siblings with the same name; resends numbered 1, 2, … in time order.
    attempts: dict[tuple[int, str], list[ReadableSpan]] = defaultdict(list)
    for s in llm:
        assert s.parent is not None
        attempts[(s.parent.span_id, s.name)].append(s)
    retried = [group for group in attempts.values() if len(group) > 1]
    assert retried
    for group in retried:
        group.sort(key=_start)
        assert "http.request.resend_count" not in group[0].attributes
        assert [s.attributes["http.request.resend_count"] for s in group[1:]] == list(range(1, len(group)))
        assert all(s.attributes.get("http.response.status_code") != 200 for s in group[:-1])
        assert group[-1].attributes.get("http.response.status_code") == 200

    # Producer -> Consumer through a span link, the consumer in another trace and service.
    producers = {s.context.span_id: s for s in spans if s.kind is SpanKind.PRODUCER}
    consumers = [s for s in spans if s.kind is SpanKind.CONSUMER]
    assert producers and consumers and len(consumers) <= len(producers)
    for c in consumers:
        (link,) = c.links
        p = producers[link.context.span_id]
        assert link.context.trace_id == p.context.trace_id != c.context.trace_id
        assert c.attributes["messaging.destination.name"] == p.attributes["messaging.destination.name"]
        assert c.resource.attributes["service.name"] == "summary-worker"
        assert _start(c) >= _start(p)

    versions = {s.resource.attributes["service.version"] for s in roots if s.name == "POST /chat"}
    assert versions == {"1.3.0", "1.4.0", "1.5.0"}
    workflow = [s for s in roots if s.name == "invoke_workflow claims-triage"]
    assert workflow and all(s.attributes["gen_ai.workflow.name"] == "claims-triage" for s in workflow)
    tools = {s.name for s in spans if s.attributes.get("gen_ai.operation.name") == "execute_tool"}
    assert tools == {"execute_tool lookup_policy", "execute_tool fetch_claim_history"}


def test_abandonment_rises_steeply_past_two_seconds() -> None:
    assert abandon_probability(500) < 0.01
    assert abandon_probability(1500) < 0.02
    assert abandon_probability(2500) > 0.5
    assert abandon_probability(3000) > abandon_probability(2500)


def test_release_coupling_ground_truth(everything: Traffic, healthy: Traffic) -> None:
    p99 = everything.p99_ms("chat-api", "POST /chat")
    assert p99["current"] > 3 * p99["baseline"] and p99["current"] - p99["baseline"] > 800
    calls = everything.llm_calls_per_request("chat-api", "POST /chat")
    assert calls["baseline"] == 0.0 and calls["current"] >= 1.0
    # The slower hot path pushes users past the abandonment cliff.
    abandoned = everything.abandonment("chat-api", "POST /chat")
    assert abandoned["current"] > 5 * abandoned["baseline"]
    # Switched off, 1.5.0 still ships (version bump) but adds no model call and no step.
    assert healthy.llm_calls_per_request("chat-api", "POST /chat") == {"baseline": 0.0, "current": 0.0}
    off = healthy.p99_ms("chat-api", "POST /chat")
    assert abs(off["current"] - off["baseline"]) < 0.2 * off["baseline"]


def test_noisy_neighbour_ground_truth(everything: Traffic, healthy: Traffic) -> None:
    share = everything.cold_share("gpt-4o-mini")
    assert share.get("baseline", 0.0) == 0.0 and share["current"] > 0.1
    p99 = everything.p99_ms("assistant-api", "POST /ask")
    assert p99["current"] > 2 * p99["baseline"]
    assert healthy.cold_share("gpt-4o-mini") == {"baseline": 0.0, "current": 0.0}
    off = healthy.p99_ms("assistant-api", "POST /ask")
    assert abs(off["current"] - off["baseline"]) < 0.2 * off["baseline"]


def test_retry_storm_ground_truth(everything: Traffic, healthy: Traffic) -> None:
    amp = everything.attempt_amplification()
    assert amp["baseline"] < 1.05 and amp["current"] > 1.3
    off = healthy.attempt_amplification()
    assert off["baseline"] < 1.05 and off["current"] < 1.05


def test_internal_regression_is_in_the_database_span(everything: Traffic, healthy: Traffic) -> None:
    p99 = everything.p99_ms("search-api", "GET /search")
    assert p99["current"] - p99["baseline"] > 500
    db = everything.child_p99_ms("search-api", "GET /search", "SELECT documents")
    emb = everything.child_p99_ms("search-api", "GET /search", "embeddings text-embedding-3-small")
    assert db["current"] > 5 * db["baseline"]
    assert abs(emb["current"] - emb["baseline"]) < 0.2 * emb["baseline"]
    off = healthy.p99_ms("search-api", "GET /search")
    assert abs(off["current"] - off["baseline"]) < 0.2 * off["baseline"]


def test_llm_slowdown_is_in_the_model_span(everything: Traffic, healthy: Traffic) -> None:
    p99 = everything.p99_ms("support-bot", "POST /reply")
    assert p99["current"] > 2 * p99["baseline"]
    llm = everything.child_p99_ms("support-bot", "POST /reply", "chat claude-sonnet-4")
    internal = everything.child_p99_ms("support-bot", "POST /reply", "INSERT replies")
    assert llm["current"] > 2 * llm["baseline"]
    assert abs(internal["current"] - internal["baseline"]) < 0.3 * internal["baseline"]
    assert everything.cold_share("claude-sonnet-4")["current"] == 0.0
    off = healthy.p99_ms("support-bot", "POST /reply")
    assert abs(off["current"] - off["baseline"]) < 0.2 * off["baseline"]


def test_a_switched_off_scenario_leaves_the_other_services_untouched(healthy: Traffic) -> None:
    # Every service draws from its own stream: (e) off gives support-bot exactly the healthy traffic,
    # whatever else is on, and the other scenarios' traffic is the same as with everything on.
    without_e = Traffic(
        Workload([s for s in SCENARIOS if s != "llm_slowdown"], seed=11, scale=SCALE, end=END)
    )
    assert without_e.signature("support-bot") == healthy.signature("support-bot")
    assert without_e.signature("search-api") != healthy.signature("search-api")


def test_parse_scenarios() -> None:
    assert parse_scenarios(None) == SCENARIOS
    assert parse_scenarios(["all"]) == SCENARIOS
    assert parse_scenarios(["none"]) == ()
    assert parse_scenarios(["llm_slowdown,retry_storm"]) == ("retry_storm", "llm_slowdown")
    with pytest.raises(GeneratorError, match="allowed: release_coupling, noisy_neighbour"):
        parse_scenarios(["retry-storm"])
    with pytest.raises(GeneratorError, match="scale"):
        Workload(scale=0)
    assert set(SCENARIO_INFO) == set(SCENARIOS)


def test_files_protobuf_and_json_lines(tmp_path: Path) -> None:
    workload = Workload(seed=5, scale=0.02, end=END)
    expected = len(workload.spans())
    pb = tmp_path / "traffic.pb.gz"
    stats = write_otlp_file(Workload(seed=5, scale=0.02, end=END), pb)
    assert stats.spans == expected
    request = ExportTraceServiceRequest.FromString(gzip.decompress(pb.read_bytes()))
    spans = [s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert len(spans) == expected and all(len(s.trace_id) == 16 for s in spans)

    jl = tmp_path / "traffic.jsonl"
    write_otlp_file(Workload(seed=5, scale=0.02, end=END), jl)
    lines = [json.loads(line) for line in jl.read_text().splitlines()]
    json_spans = [
        s for body in lines for rs in body["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]
    ]
    assert len(json_spans) == expected
    assert all(len(s["traceId"]) == 32 and int(s["traceId"], 16) for s in json_spans)
    assert {s["kind"] for s in json_spans} == {1, 2, 3, 4, 5}
    assert any(s.get("links") and len(s["links"][0]["spanId"]) == 16 for s in json_spans)


def test_generate_command(tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    result = CliRunner().invoke(
        main,
        [
            "generate",
            "--out",
            str(out),
            "--scale",
            "0.02",
            "--scenario",
            "none",
            "--quiet",
            "--end",
            "2026-11-30",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "scenarios: none" in result.output and out.stat().st_size > 0
    bad = CliRunner().invoke(main, ["generate", "--out", str(out), "--scenario", "bogus"])
    assert bad.exit_code == 2 and "allowed: release_coupling" in bad.output
