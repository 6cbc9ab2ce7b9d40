"""The workload generator: OpenTelemetry conventions on every span, and each scenario's ground truth.

The checks read the SDK spans directly (fast); test_demo.py checks the same traffic after ingest.
"""

from __future__ import annotations

import gzip
import itertools
import json
import math
from collections import Counter, defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode

from demo.generator import (
    DAY_NS,
    SCENARIO_INFO,
    SCENARIOS,
    FlagRollout,
    GeneratorError,
    Workload,
    abandon_probability,
    generate,
    parse_scenarios,
    write_otlp_file,
)
from tailwatch.cli import main

END = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
SCALE = 0.25


_OLD_HTTP = {"chat-api", "upload-api", "summary-worker", "agent-runner"}
_GEN_AI_SYSTEM = {"chat-api", "summary-worker"}
_FASTAPI = {"chat-api", "assistant-api", "notes-api", "digest-api", "writer-api"}


def _service(span: ReadableSpan) -> str:
    return str(span.resource.attributes["service.name"])


def _status_code(span: ReadableSpan) -> int | None:
    """The HTTP status of a span, in whichever convention its service writes."""
    value = span.attributes.get("http.status_code", span.attributes.get("http.response.status_code"))
    return None if value is None else int(str(value))


def _failed(span: ReadableSpan) -> bool:
    return span.status.status_code is StatusCode.ERROR or (_status_code(span) or 0) >= 400


def _tokens(span: ReadableSpan) -> int:
    return int(str(span.attributes.get("gen_ai.usage.input_tokens", 0))) + int(
        str(span.attributes.get("gen_ai.usage.output_tokens", 0))
    )


def _is_llm(span: ReadableSpan) -> bool:
    return span.attributes.get("gen_ai.operation.name") in ("chat", "embeddings")


class Traffic:
    """Spans of one workload grouped per trace, with the windows of its timeline."""

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self.spans = workload.spans()
        self.traces: dict[int, list[ReadableSpan]] = defaultdict(list)
        self.by_id: dict[int, ReadableSpan] = {}
        self.children: dict[int, list[ReadableSpan]] = defaultdict(list)
        for span in self.spans:
            self.traces[span.context.trace_id].append(span)
            self.by_id[span.context.span_id] = span
            if span.parent is not None:
                self.children[span.parent.span_id].append(span)
        for kids in self.children.values():
            kids.sort(key=_start)
        tl = workload.timeline
        self.baseline = (tl.ns(tl.baseline_start), tl.ns(tl.current_start))
        self.current = (tl.ns(tl.current_start), tl.ns(tl.end))

    def window_of(self, t: int) -> str | None:
        if self.baseline[0] <= t < self.baseline[1]:
            return "baseline"
        if self.current[0] <= t < self.current[1]:
            return "current"
        return None

    def ancestors(self, span: ReadableSpan) -> Iterable[ReadableSpan]:
        while span.parent is not None:
            span = self.by_id[span.parent.span_id]
            yield span

    def roots(self, service: str, name: str) -> Iterable[tuple[str, ReadableSpan, list[ReadableSpan]]]:
        for spans in self.traces.values():
            root = next(s for s in spans if s.parent is None)
            if root.name == name and _service(root) == service:
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
            # One GenAI span per logical call (the SDK's retries are its HTTP children).
            calls[window].append(sum(1 for s in spans if s.attributes.get("gen_ai.operation.name") == "chat"))
        return {w: float(np.mean(v)) for w, v in calls.items()}

    def abandonment(self, service: str, name: str) -> dict[str, float]:
        rates: dict[str, list[bool]] = defaultdict(list)
        for window, root, _ in self.roots(service, name):
            rates[window].append(_status_code(root) == 499)
        return {w: float(np.mean(v)) for w, v in rates.items()}

    def workflow_runs(self) -> dict[str, Counter[str]]:
        """Per window: runs, logical hop calls, attempts (HTTP attempts of the LLM hops, one per tool
        call), GenAI spans, failed calls, 429 attempts, tokens of every call and of the final calls."""
        out: dict[str, Counter[str]] = defaultdict(Counter)
        for window, root, _ in self.roots("agent-runner", "invoke_workflow claims-triage"):
            c = out[window]
            c["runs"] += 1
            hops = self.children[root.context.span_id]
            c["calls"] += len({s.name for s in hops})
            for hop in hops:
                if not _is_llm(hop):
                    c["attempts"] += 1
                    continue
                attempts = self.children[hop.context.span_id]
                c["attempts"] += len(attempts)
                c["genai"] += 1
                c["throttled"] += sum(1 for a in attempts if _status_code(a) == 429)
                c["tokens"] += _tokens(hop)
                if hop.status.status_code is StatusCode.ERROR:
                    c["failed_calls"] += 1
                else:
                    c["final_tokens"] += _tokens(hop)
        return out

    def attempt_amplification(self) -> dict[str, float]:
        return {w: c["attempts"] / c["calls"] for w, c in self.workflow_runs().items()}

    def token_amplification(self) -> dict[str, float]:
        return {w: c["tokens"] / c["final_tokens"] for w, c in self.workflow_runs().items()}

    def cold_share(self, model: str) -> dict[str, float]:
        """Share of the model's calls made below a Consumer span (queued work, not a request)."""
        counts: dict[str, list[bool]] = defaultdict(list)
        for span in self.spans:
            if span.attributes.get("gen_ai.request.model") != model:
                continue
            above = list(self.ancestors(span))
            window = self.window_of(_start(above[-1] if above else span))
            if window is not None:
                counts[window].append(any(a.kind is SpanKind.CONSUMER for a in above))
        return {w: float(np.mean(v)) for w, v in counts.items()}

    def signature(self, service: str) -> list[tuple[str, int, int]]:
        return sorted((s.name, _start(s), _end(s)) for s in self.spans if _service(s) == service)


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
        # Python's HTTP instrumentations never number resends.
        assert "http.request.resend_count" not in span.attributes
    roots = [s for s in spans if s.parent is None]
    assert {s.kind for s in roots} == {SpanKind.SERVER, SpanKind.CONSUMER, SpanKind.INTERNAL}
    versions = {s.resource.attributes["service.version"] for s in roots if s.name == "POST /chat"}
    assert versions == {"1.3.0", "1.4.0", "1.5.0"}
    workflow = [s for s in roots if s.name == "invoke_workflow claims-triage"]
    assert workflow and all(s.attributes["gen_ai.workflow.name"] == "claims-triage" for s in workflow)
    tools = {s.name for s in spans if s.attributes.get("gen_ai.operation.name") == "execute_tool"}
    assert tools == {"execute_tool lookup_policy", "execute_tool fetch_claim_history"}
    scopes = {s.instrumentation_scope.name for s in spans if s.instrumentation_scope is not None}
    assert {
        "opentelemetry.instrumentation.httpx",
        "opentelemetry.instrumentation.celery",
        "opentelemetry.instrumentation.fastapi",
        "opentelemetry.util.genai.handler",
    } <= scopes


def test_http_servers_old_and_new_conventions(everything: Traffic) -> None:
    servers = [s for s in everything.spans if s.kind is SpanKind.SERVER]
    assert {s.parent for s in servers} == {None}
    statuses: set[int] = set()
    streamed = 0
    for root in servers:
        old = _service(root) in _OLD_HTTP
        a = root.attributes
        if old:
            assert a["http.method"] and a["http.target"] == a["http.route"]
            assert "http.request.method" not in a and "http.response.status_code" not in a
        else:
            assert a["http.request.method"] and a["url.path"] == a["http.route"]
            assert "http.method" not in a and "http.status_code" not in a
        status = _status_code(root)
        assert status is not None
        statuses.add(status)
        kids = everything.children[root.context.span_id]
        asgi = [k for k in kids if "asgi.event.type" in k.attributes]
        if _service(root) not in _FASTAPI:
            assert not asgi
            continue
        # FastAPI: a receive span for the body (POST), then the send spans: the response start
        # (status) and the body — for writer-api's streamed answers one send per chunk and a last
        # empty one, the response start going out before the model call.
        asgi.sort(key=_start)
        sends = asgi[1:]
        assert [k.name for k in asgi] == [f"{root.name} http receive"] + [f"{root.name} http send"] * len(
            sends
        )
        assert all(k.kind is SpanKind.INTERNAL and _duration_ms(k) < 1 for k in asgi)
        assert _start(asgi[0]) < _start(sends[0]) and _end(asgi[-1]) <= _end(root)
        assert sends[0].attributes["asgi.event.type"] == "http.response.start"
        assert all(k.attributes["asgi.event.type"] == "http.response.body" for k in sends[1:])
        assert _status_code(sends[0]) in (200, 202, 500)
        if len(sends) == 2:
            continue
        streamed += 1
        assert _service(root) == "writer-api" and len(sends) == 6
        (call,) = [k for k in kids if _is_llm(k)]
        assert _end(sends[0]) <= _start(call)
        # The first body byte leaves when the first chunk of the answer arrives.
        first = _start(call) + round(float(call.attributes["gen_ai.response.time_to_first_chunk"]) * 1e9)
        assert abs(_start(sends[1]) - first) < 10_000
    assert streamed > 0
    assert {200, 202, 499} <= statuses
    # Abandoned requests keep 499 in the status attribute of either convention.
    abandoned = {_service(s) in _OLD_HTTP for s in servers if _status_code(s) == 499}
    assert abandoned == {True, False}


def test_model_calls_are_genai_spans_with_http_attempts(everything: Traffic) -> None:
    llm = [s for s in everything.spans if _is_llm(s)]
    assert llm and any(s.name == "chat gpt-4o-mini" for s in llm)
    retried = 0
    http_attempts = {s.context.span_id for s in llm for s in everything.children[s.context.span_id]}
    for call in llm:
        a = call.attributes
        assert call.kind is SpanKind.CLIENT
        assert call.name == f"{a['gen_ai.operation.name']} {a['gen_ai.request.model']}"
        # One provider attribute, the older one on the services running the older instrumentation.
        provider_key = "gen_ai.system" if _service(call) in _GEN_AI_SYSTEM else "gen_ai.provider.name"
        assert a[provider_key] in ("openai", "anthropic")
        assert {"gen_ai.system", "gen_ai.provider.name"} - {provider_key} & set(a) == set()

        attempts = everything.children[call.context.span_id]
        assert attempts, call.name
        old = _service(call) in _OLD_HTTP
        previous_end = _start(call)
        for i, attempt in enumerate(attempts):
            b = attempt.attributes
            assert attempt.name == "POST" and attempt.kind is SpanKind.CLIENT
            assert attempt.instrumentation_scope is not None
            assert attempt.instrumentation_scope.name == "opentelemetry.instrumentation.httpx"
            if old:
                assert b["http.method"] == "POST" and str(b["http.url"]).startswith("https://")
                assert "http.response.status_code" not in b
            else:
                assert b["http.request.method"] == "POST" and str(b["url.full"]).startswith("https://")
                assert "http.status_code" not in b
            assert b["server.address"] in ("api.openai.com", "api.anthropic.com")
            # Attempts follow each other inside the call; every one but the last failed, and the
            # SDK waited (backoff or retry-after, at least 0.375 s) before the next.
            assert _start(attempt) >= previous_end and _end(attempt) <= _end(call)
            if i:
                assert _start(attempt) - previous_end >= 375_000_000
            if i < len(attempts) - 1:
                assert _failed(attempt)
            status = _status_code(attempt)
            if status == 429 or (status or 0) >= 500:
                assert attempt.status.status_code is StatusCode.ERROR
                assert old or b["error.type"] == str(status)
            previous_end = _end(attempt)
        retried += len(attempts) > 1

        last = attempts[-1]
        if call.status.status_code is StatusCode.ERROR:
            assert a["error.type"]
            if _failed(last):
                # Retries exhausted: no usage.
                assert "gen_ai.usage.input_tokens" not in a
                assert a["error.type"] in (
                    "RateLimitError",
                    "InternalServerError",
                    "OverloadedError",
                    "APITimeoutError",
                )
            else:
                # A streamed response that stalled: partial usage, no SDK retry.
                assert a["error.type"] == "ReadTimeout" and _service(call) == "agent-runner"
                assert int(str(a["gen_ai.usage.input_tokens"])) > 0
        else:
            assert _status_code(last) == 200 and last.status.status_code is StatusCode.UNSET
            assert "error.type" not in a
            assert int(str(a["gen_ai.usage.input_tokens"])) > 0
            assert str(a["gen_ai.response.model"]).startswith(str(a["gen_ai.request.model"]))
            if a["gen_ai.operation.name"] == "chat":
                assert int(str(a["gen_ai.usage.output_tokens"])) > 0
    assert retried > 20
    # HTTP attempts are never GenAI spans and exist only under model calls.
    posts = [s for s in everything.spans if s.name == "POST" and s.kind is SpanKind.CLIENT]
    assert {s.context.span_id for s in posts} == http_attempts
    assert not any("gen_ai.operation.name" in s.attributes for s in posts)
    throttled = [s for s in posts if _status_code(s) == 429]
    assert {_service(s) in _OLD_HTTP for s in throttled} == {True, False}


def test_the_agent_calls_a_failed_hop_again(everything: Traffic) -> None:
    again = 0
    for _, root, _ in everything.roots("agent-runner", "invoke_workflow claims-triage"):
        hops = everything.children[root.context.span_id]
        by_name: dict[str, list[ReadableSpan]] = defaultdict(list)
        for hop in hops:
            by_name[hop.name].append(hop)
        assert len(by_name) == 5
        for name, calls in by_name.items():
            if len(calls) == 1:
                continue
            # A same-name sibling comes only after a failed call has ended.
            again += len(calls) - 1
            assert name.startswith("chat ")
            for before, after in itertools.pairwise(calls):
                assert before.status.status_code is StatusCode.ERROR
                assert _start(after) > _end(before)
            assert calls[-1].status.status_code is StatusCode.UNSET
    assert again > 5


def test_celery_queue_consumers_are_children_of_producers(everything: Traffic) -> None:
    producers = [s for s in everything.spans if s.name == "apply_async/summaries.summarize_document"]
    runs = [s for s in everything.spans if s.name == "run/summaries.summarize_document"]
    assert producers and runs and len(runs) <= len(producers)
    for p in producers:
        assert p.kind is SpanKind.PRODUCER
        assert p.attributes["messaging.destination"] == "doc-summaries"
        assert "messaging.destination.name" not in p.attributes
        parent = everything.by_id[p.parent.span_id] if p.parent else None
        # Enqueued by the upload request, or again by a run that asked for a retry.
        assert parent is not None and parent.name in ("POST /documents", "run/summaries.summarize_document")
    runs_of: dict[str, list[ReadableSpan]] = defaultdict(list)
    for run in runs:
        assert run.kind is SpanKind.CONSUMER and not run.links
        assert run.parent is not None
        producer = everything.by_id[run.parent.span_id]
        assert producer.kind is SpanKind.PRODUCER and producer.context.trace_id == run.context.trace_id
        task_id = run.attributes["messaging.message.id"]
        assert producer.attributes["messaging.message.id"] == task_id
        assert run.attributes["messaging.destination"] == "doc-summaries"
        assert run.attributes["celery.task_name"] == "summaries.summarize_document"
        assert _service(run) == "summary-worker" and _start(run) >= _end(producer)
        # The worker's model call sits under the run.
        calls = [k for k in everything.children[run.context.span_id] if _is_llm(k)]
        assert len(calls) == 1
        runs_of[str(task_id)].append(run)
    retried = [sorted(rs, key=_start) for rs in runs_of.values() if len(rs) > 1]
    assert len(retried) >= 5
    for rs in retried:
        # A retried task runs again with the same id, under the retry's apply_async, a child of the
        # failed run.
        for failed, again in itertools.pairwise(rs):
            assert failed.attributes["celery.state"] == "RETRY"
            retry_producer = everything.by_id[again.parent.span_id] if again.parent else None
            assert retry_producer is not None and retry_producer.parent is not None
            assert retry_producer.parent.span_id == failed.context.span_id
            assert again.attributes["celery.retries"] == rs.index(again)
        assert rs[-1].attributes["celery.state"] in ("SUCCESS", "RETRY", "FAILURE")
    assert {r.attributes["celery.state"] for r in runs} >= {"SUCCESS", "RETRY"}


def test_a_queue_on_the_newer_messaging_conventions_links_consumers(everything: Traffic) -> None:
    producers = {s.context.span_id: s for s in everything.spans if s.name == "send ticket-escalations"}
    consumers = [s for s in everything.spans if s.name == "process ticket-escalations"]
    assert producers and consumers and len(consumers) <= len(producers)
    for p in producers.values():
        assert p.kind is SpanKind.PRODUCER and p.attributes["messaging.operation.type"] == "send"
        assert _service(p) == "support-bot"
    for c in consumers:
        assert c.kind is SpanKind.CONSUMER and c.parent is None
        (link,) = c.links
        p = producers[link.context.span_id]
        assert link.context.trace_id == p.context.trace_id != c.context.trace_id
        assert c.attributes["messaging.destination.name"] == p.attributes["messaging.destination.name"]
        assert c.attributes["messaging.operation.type"] == "process"
        assert _service(c) == "escalation-router" and _start(c) >= _start(p)


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
    assert amp["baseline"] < 1.05 and amp["current"] > 1.2
    tokens = everything.token_amplification()
    assert tokens["baseline"] < 1.01 and tokens["current"] > 1.05
    runs = everything.workflow_runs()
    # The provider's 429s, read from the HTTP attempts.
    assert runs["current"]["throttled"] > 5 * max(1, runs["baseline"]["throttled"])
    assert runs["current"]["failed_calls"] > 10 and runs["baseline"]["failed_calls"] <= 1
    off = healthy.attempt_amplification()
    assert off["baseline"] < 1.05 and off["current"] < 1.05
    assert healthy.token_amplification()["current"] < 1.01


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


def _flag_of(root: ReadableSpan) -> dict[str, str] | None:
    """The attributes of the root's flag evaluation event, if it has one (never more than one)."""
    events = [e for e in root.events if e.name == "feature_flag.evaluation"]
    assert len(events) <= 1
    return {k: str(v) for k, v in events[0].attributes.items()} if events else None


def _migration(traffic: Traffic) -> dict[str, dict[str, list[tuple[ReadableSpan, list[ReadableSpan]]]]]:
    """notes-api requests per window and variant (``-`` without a flag evaluation)."""
    out: dict[str, dict[str, list[tuple[ReadableSpan, list[ReadableSpan]]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for window, root, spans in traffic.roots("notes-api", "POST /summarize"):
        flag = _flag_of(root)
        out[window][flag["feature_flag.result.variant"] if flag else "-"].append((root, spans))
    return out


def _rollout() -> FlagRollout:
    flag = SCENARIO_INFO["hot_cold_migration"].flag
    assert flag is not None
    return flag


def test_migration_flag_evaluations_have_the_openfeature_shape(everything: Traffic) -> None:
    # OpenFeature's OpenTelemetry TracingHook: one feature_flag.evaluation event on the span current
    # during the evaluation (the FastAPI Server span), never on the other spans of the request.
    flag = _rollout()
    roots = [s for s in everything.spans if s.name == "POST /summarize"]
    assert roots and all(_service(s) == "notes-api" and s.kind is SpanKind.SERVER for s in roots)
    evaluated = [s for s in roots if _flag_of(s)]
    assert len(evaluated) == len(roots)  # the scenario is on: the flag exists all period
    flagged = {s.context.span_id for s in everything.spans if s.events and _flag_of(s)}
    assert flagged == {s.context.span_id for s in evaluated}
    for root in evaluated:
        (event,) = [e for e in root.events if e.name == "feature_flag.evaluation"]
        attrs = event.attributes
        assert set(attrs) == {
            "feature_flag.key",
            "feature_flag.result.variant",
            "feature_flag.result.value",
            "feature_flag.result.reason",
            "feature_flag.context.id",
            "feature_flag.provider.name",
        }
        assert attrs["feature_flag.key"] == flag.key
        assert attrs["feature_flag.provider.name"] == flag.provider
        assert attrs["feature_flag.result.reason"] == "targeting_match"
        variant = attrs["feature_flag.result.variant"]
        assert variant in (flag.control, flag.treatment)
        # The hook writes the value as JSON: a boolean flag, true on the treatment.
        assert json.loads(str(attrs["feature_flag.result.value"])) is (variant == flag.treatment)
        # Evaluated inside the request, after authentication (the targeting key is the user).
        assert event.timestamp is not None and _start(root) < event.timestamp < _end(root)
        auth = next(k for k in everything.children[root.context.span_id] if k.name == "auth")
        assert event.timestamp > _end(auth)
    # Sticky per user: a targeting key gets one variant per rollout stage, and the current stage
    # only adds users to the treatment.
    variants: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for root in evaluated:
        f = _flag_of(root)
        assert f is not None
        window = everything.window_of(_start(root)) or "first day"
        variants[window][f["feature_flag.context.id"]].add(f["feature_flag.result.variant"])
    for users in variants.values():
        assert all(len(v) == 1 for v in users.values())
    current = {u for u, v in variants["current"].items() if v == {flag.treatment}}
    baseline = {u for u, v in variants["baseline"].items() if v == {flag.treatment}}
    assert baseline and not {u for u in baseline if variants["current"].get(u, set()) - {flag.treatment}}
    assert len(current) > len(baseline)


def test_migration_split_and_fast_async_variant(everything: Traffic) -> None:
    flag = _rollout()
    by = _migration(everything)
    current = by["current"]
    assert set(current) == {flag.control, flag.treatment}
    n_sync, n_async = len(current[flag.control]), len(current[flag.treatment])
    share = n_async / (n_sync + n_async)
    # A pseudorandom split: within three binomial standard deviations of the rollout's share.
    p = flag.treatment_share
    assert abs(share - p) < 3 * math.sqrt(p * (1 - p) / (n_sync + n_async)), share
    # The baseline day is an earlier, smaller slice.
    base_share = len(by["baseline"][flag.treatment]) / sum(len(v) for v in by["baseline"].values())
    assert 0 < base_share < share - 0.1

    def p99(rows: list[tuple[ReadableSpan, list[ReadableSpan]]]) -> float:
        return float(np.percentile([_duration_ms(root) for root, _ in rows], 99))

    sync_p99, async_p99 = p99(current[flag.control]), p99(current[flag.treatment])
    # The async variant answers 202 once the job is queued: no model call inside the request.
    assert async_p99 < 0.1 * sync_p99 and async_p99 < 200
    for root, spans in current[flag.treatment]:
        assert _status_code(root) in (202, 499)
        inside = [s for s in spans if _is_llm(s) and any(a is root for a in everything.ancestors(s))]
        hot = [s for s in inside if not any(a.kind is SpanKind.CONSUMER for a in everything.ancestors(s))]
        assert not hot
    for root, spans in current[flag.control]:
        assert _status_code(root) in (200, 499, 500)
        calls = [s for s in spans if _is_llm(s)]
        assert [s.name for s in calls] == ["chat gpt-4.1-mini"]
        assert calls[0].parent is not None and calls[0].parent.span_id == root.context.span_id
    # Abandonment follows latency: the slow sync variant loses users past the cliff, the async not.
    abandoned = {v: np.mean([_status_code(root) == 499 for root, _ in rows]) for v, rows in current.items()}
    assert abandoned[flag.control] > 0.05 > abandoned[flag.treatment]


def test_migration_async_work_runs_on_a_celery_worker(everything: Traffic) -> None:
    flag = _rollout()
    waits: list[float] = []
    for root, spans in _migration(everything)["current"][flag.treatment]:
        (producer,) = [s for s in spans if s.kind is SpanKind.PRODUCER]
        assert producer.name == "apply_async/notes.summarize_notes"
        assert producer.parent is not None and producer.parent.span_id == root.context.span_id
        assert producer.attributes["messaging.destination"] == "notes-summaries"
        assert producer.attributes["celery.task_name"] == "notes.summarize_notes"
        assert _end(producer) <= _end(root)
        runs = [s for s in spans if s.kind is SpanKind.CONSUMER]
        if not runs:
            continue  # still queued at the end of the period
        (run,) = runs
        # Like the other Celery spans: the run is a child of its apply_async, same trace, no link.
        assert run.name == "run/notes.summarize_notes" and not run.links
        assert run.parent is not None and run.parent.span_id == producer.context.span_id
        assert _service(run) == "notes-worker" and _start(run) >= _end(producer)
        assert run.attributes["messaging.message.id"] == producer.attributes["messaging.message.id"]
        assert run.attributes["messaging.destination"] == "notes-summaries"
        assert run.attributes["celery.state"] in ("SUCCESS", "FAILURE")
        assert run.instrumentation_scope is not None
        assert run.instrumentation_scope.name == "opentelemetry.instrumentation.celery"
        calls = [k for k in everything.children[run.context.span_id] if _is_llm(k)]
        assert [c.name for c in calls] == ["chat gpt-4.1-mini"]
        # Enqueue to ready: from the publish to the end of the run, long after the request ended.
        waits.append((_end(run) - _start(producer)) / 1e9)
        assert _end(run) > _end(root)
    assert len(waits) > 30
    p50, p99 = np.percentile(waits, 50), np.percentile(waits, 99)
    # Seconds, not milliseconds and not minutes: a queue with a free worker pool, no starvation.
    assert 1.5 < p50 < 10 and p99 < 60 and p99 / p50 < 20


def test_migration_switched_off_is_a_plain_sync_endpoint(healthy: Traffic) -> None:
    by = _migration(healthy)
    assert set(by["current"]) == {"-"} and set(by["baseline"]) == {"-"}
    assert not any(s.name.startswith("apply_async/notes") for s in healthy.spans)
    assert healthy.llm_calls_per_request("notes-api", "POST /summarize") == {"baseline": 1.0, "current": 1.0}
    off = healthy.p99_ms("notes-api", "POST /summarize")
    assert abs(off["current"] - off["baseline"]) < 0.2 * off["baseline"]


def _digest_days(traffic: Traffic) -> dict[int, dict[str, Any]]:
    """Per simulated day: digest-worker's scheduled runs (their batch sizes), their retries (the
    batch size and the documents each summarised again), and the summarize_document calls under a
    request (hot)."""
    start = traffic.workload.start_ns
    days: dict[int, dict[str, Any]] = defaultdict(lambda: {"sizes": [], "hot": 0, "retries": []})
    for span in traffic.spans:
        if span.name != "summarize_document":
            continue
        assert span.attributes["code.function.name"] == "summarize_document"
        assert span.attributes["code.namespace"] == "digests.summaries"
        root = list(traffic.ancestors(span))[-1]
        day = days[(_start(root) - start) // DAY_NS]
        if root.kind is SpanKind.SERVER:
            assert (_service(root), root.name) == ("digest-api", "POST /summaries/now")
            day["hot"] += 1
    for span in traffic.spans:
        if span.name != "run/digests.summarize_batch":
            continue
        size = int(str(span.attributes["messaging.batch.message_count"]))
        calls = [k for k in traffic.children[span.context.span_id] if k.name == "summarize_document"]
        day = days[(_start(list(traffic.ancestors(span))[-1] if span.parent else span) - start) // DAY_NS]
        if span.parent is None:
            # Celery beat publishes untraced: the scheduled run is its trace's root.
            assert span.kind is SpanKind.CONSUMER
            day["sizes"].append(size)
            failed = [k for k in calls if k.status.status_code is StatusCode.ERROR]
            if span.attributes["celery.state"] == "RETRY":
                # The bad document is the last one it tried.
                assert len(failed) == 1 and calls[-1] is failed[0] and len(calls) <= size
            else:
                assert span.attributes["celery.state"] == "SUCCESS" and not failed and len(calls) == size
        else:
            # self.retry(): the same task id, under the failed run's publish; the whole batch again.
            producer = traffic.by_id[span.parent.span_id]
            failed_run = traffic.by_id[producer.parent.span_id]  # type: ignore[union-attr]
            assert producer.kind is SpanKind.PRODUCER and failed_run.attributes["celery.state"] == "RETRY"
            assert span.attributes["messaging.message.id"] == failed_run.attributes["messaging.message.id"]
            day["retries"].append((size, len(calls)))
    return dict(days)


def test_batch_drift_ground_truth(everything: Traffic, healthy: Traffic) -> None:
    # (g): nightly, then hourly runs of 5, then of 3 with the synchronous endpoint on the last day,
    # when about a quarter of the runs retry their whole batch.
    days = _digest_days(everything)
    assert [days[d]["sizes"] for d in range(3)] == [[120], [5] * 24, [3] * 24]
    assert days[0]["hot"] == days[1]["hot"] == 0
    assert days[2]["hot"] > 0.5 * 400 * SCALE
    assert days[0]["retries"] == days[1]["retries"] == []
    assert 2 <= len(days[2]["retries"]) <= 12 and set(days[2]["retries"]) == {(3, 3)}
    requests = [r for w, r, _ in everything.roots("digest-api", "POST /summaries/now")]
    assert requests and all(_start(r) >= everything.current[0] for r in requests)
    # Switched off: a stable nightly job, nobody else calls its function, nothing retried.
    quiet = _digest_days(healthy)
    assert {d: v["sizes"] for d, v in quiet.items()} == {0: [120], 1: [120], 2: [120]}
    assert all(v["hot"] == 0 and v["retries"] == [] for v in quiet.values())


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
