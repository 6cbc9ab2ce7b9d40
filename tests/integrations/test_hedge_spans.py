"""What a hedged model call leaves in the traces, made with the real ``openai`` client under the
``openai-v2`` instrumentation against a local mock provider: a second request to the same model
sent while the first is still running, the first answer kept.

* **The loser cancelled** (the usual hedge: ``asyncio`` cancels the slower task): the instrumentation
  ends its span only on a return or an ``Exception``; ``CancelledError`` is neither, so the cancelled
  call's span is never ended and never exported. Each request keeps exactly one ``chat`` span — the
  winner's — and nothing in its trace says a second request was sent. This is why tailwatch reports
  no existing hedge of this kind (docs/analytics.md, "Where the simulation's assumptions break").
* **The loser ignored** (both run to their end, the first answer used): two overlapping sibling
  ``chat`` spans of the same model under the request, each with its own tokens.

The figures asserted are read off the spans the SDK produced (an ``InMemorySpanExporter``); the last
test sends the same spans over OTLP/HTTP to tailwatch's receiver and checks ``existing_hedges``
against them."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import openai
import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from analytics import analyze
from collectors.pipeline import IngestPipeline
from collectors.receivers import Receivers
from collectors.settings import PipelineSettings
from storage import Store
from tests.integrations.providers import ModelScript, mock_providers

MODEL = "gpt-4o"
HEDGE_AFTER_S = 0.05
REQUESTS = 4


@pytest.fixture
def traced() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    memory = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(memory))
    OpenAIInstrumentor().instrument(tracer_provider=tp)
    try:
        yield tp, memory
    finally:
        OpenAIInstrumentor().uninstrument()
        tp.shutdown()


async def _hedged_requests(base_url: str, tp: TracerProvider, cancel_loser: bool) -> None:
    client = openai.AsyncOpenAI(base_url=base_url, api_key="test", max_retries=0)
    tracer = tp.get_tracer("hedging-app")
    messages = [{"role": "user", "content": "summarise the claim"}]
    for _ in range(REQUESTS):
        with tracer.start_as_current_span("POST /answer"):
            first = asyncio.ensure_future(client.chat.completions.create(model=MODEL, messages=messages))  # type: ignore[arg-type]
            await asyncio.sleep(HEDGE_AFTER_S)
            second = asyncio.ensure_future(client.chat.completions.create(model=MODEL, messages=messages))  # type: ignore[arg-type]
            done, pending = await asyncio.wait({first, second}, return_when=asyncio.FIRST_COMPLETED)
            assert done and done.pop().result().choices
            if cancel_loser:
                for task in pending:
                    task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
    await client.close()


def _chat_spans_per_request(
    spans: tuple[ReadableSpan, ...], requests: int = REQUESTS
) -> dict[int, list[ReadableSpan]]:
    roots = {s.context.span_id for s in spans if s.parent is None}
    out: dict[int, list[ReadableSpan]] = defaultdict(list)
    for s in spans:
        if s.parent is not None and s.parent.span_id in roots and s.name == f"chat {MODEL}":
            out[s.parent.span_id].append(s)
    assert len(roots) == requests
    return out


def _run(tp: TracerProvider, cancel_loser: bool) -> None:
    with mock_providers({MODEL: ModelScript(latency_s=0.2)}) as providers:
        asyncio.run(_hedged_requests(providers.openai_base_url, tp, cancel_loser))


def test_a_cancelled_hedge_leaves_only_the_winners_span(
    traced: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    tp, memory = traced
    _run(tp, cancel_loser=True)
    per_request = _chat_spans_per_request(memory.get_finished_spans())
    # Two requests were sent for each, one span came out: the cancelled one is not in the trace.
    assert sorted(len(v) for v in per_request.values()) == [1] * REQUESTS
    for [winner] in per_request.values():
        assert winner.end_time is not None and (winner.attributes or {}).get("gen_ai.usage.input_tokens")


def test_an_ignored_hedge_leaves_two_overlapping_siblings(
    traced: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    tp, memory = traced
    _run(tp, cancel_loser=False)
    per_request = _chat_spans_per_request(memory.get_finished_spans())
    assert sorted(len(v) for v in per_request.values()) == [2] * REQUESTS
    for calls in per_request.values():
        first, second = sorted(calls, key=lambda s: s.start_time or 0)
        assert first.start_time is not None and first.end_time is not None and second.start_time is not None
        # The hedge was sent while the first call ran: siblings that overlap, each paying its tokens.
        assert first.start_time < second.start_time < first.end_time
        assert all((s.attributes or {}).get("gen_ai.usage.input_tokens") for s in calls)


HEDGE_REQUESTS = 24


async def _hedging_service(base_url: str, tp: TracerProvider) -> None:
    """The usual hedge, the loser left to run to its end in the background: wait up to
    ``HEDGE_AFTER_S`` for the first answer, else send a second request and answer with whichever
    ends first."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key="test", max_retries=0)
    tracer = tp.get_tracer("hedging-app")
    losers: list[asyncio.Future[object]] = []
    for i in range(HEDGE_REQUESTS):
        messages = [{"role": "user", "content": f"summarise claim {i}"}]
        with tracer.start_as_current_span(
            "POST /answer",
            kind=SpanKind.SERVER,
            attributes={
                "http.request.method": "POST",
                "http.route": "/answer",
                "http.response.status_code": 200,
            },
        ):
            first = asyncio.ensure_future(client.chat.completions.create(model=MODEL, messages=messages))  # type: ignore[arg-type]
            done, _ = await asyncio.wait({first}, timeout=HEDGE_AFTER_S)
            if not done:
                second = asyncio.ensure_future(client.chat.completions.create(model=MODEL, messages=messages))  # type: ignore[arg-type]
                done, pending = await asyncio.wait({first, second}, return_when=asyncio.FIRST_COMPLETED)
                losers += pending
            assert done.pop().result().choices
    await asyncio.gather(*losers)
    await client.close()


def _tokens(span: ReadableSpan) -> int:
    attrs = span.attributes or {}
    return int(attrs.get("gen_ai.usage.input_tokens", 0)) + int(attrs.get("gen_ai.usage.output_tokens", 0))


def test_existing_hedges_match_the_spans(store: Store, tmp_path: Path) -> None:
    memory = InMemorySpanExporter()
    pipeline = IngestPipeline(
        store, PipelineSettings(batch_rows=1_000, flush_interval_s=0.05, spool_dir=tmp_path / "spool")
    )
    pipeline.start()
    receivers = Receivers(pipeline, http="127.0.0.1:0", grpc=None)
    receivers.start()
    # The service's own provider: the OTLP exporter to tailwatch beside the in-memory one.
    service = TracerProvider(resource=Resource.create({"service.name": "answers"}))
    service.add_span_processor(
        BatchSpanProcessor(OTLPSpanExporter(endpoint=f"http://127.0.0.1:{receivers.http_port}/v1/traces"))
    )
    service.add_span_processor(SimpleSpanProcessor(memory))
    OpenAIInstrumentor().instrument(tracer_provider=service)
    start = datetime.now(UTC) - timedelta(seconds=1)
    try:
        with mock_providers({MODEL: ModelScript(latency_s=0.08, latency_sigma=1.0)}) as providers:
            asyncio.run(_hedging_service(providers.openai_base_url, service))
        assert service.force_flush(30_000)
    finally:
        OpenAIInstrumentor().uninstrument()
        service.shutdown()
        receivers.stop()
        pipeline.stop(timeout_s=60)
    end = datetime.now(UTC) + timedelta(seconds=1)

    # Expected, from the spans the SDK produced: per request its chat spans in start order.
    spans = memory.get_finished_spans()
    per_request = _chat_spans_per_request(spans, HEDGE_REQUESTS)
    hedges = wins = 0
    saved: list[float] = []
    lost_tokens = won_tokens = 0
    for calls in per_request.values():
        if len(calls) < 2:
            continue
        first, second = sorted(calls, key=lambda s: s.start_time or 0)
        assert first.end_time and second.start_time and second.end_time
        assert first.start_time and first.start_time < second.start_time < first.end_time
        assert first.status.status_code != StatusCode.ERROR and second.status.status_code != StatusCode.ERROR
        hedges += 1
        won = second.end_time < first.end_time
        wins += won
        saved.append((first.end_time - min(first.end_time, second.end_time)) / 1e6)
        lost_tokens += _tokens(first if won else second)
        won_tokens += _tokens(second if won else first)
    # Heavy-tailed calls: some requests hedge, and the hedge wins some of them and loses others.
    assert 0 < wins < hedges < HEDGE_REQUESTS

    [row] = analyze(store, start, end).to_dict()["existing_hedges"]
    assert (row["service"], row["provider"], row["model"]) == ("answers", "openai", MODEL)
    assert (row["hedges"], row["wins"], row["losers_cut"]) == (hedges, wins, 0)
    assert row["win_rate"] == pytest.approx(wins / hedges, rel=1e-12)
    # Span times are whole nanoseconds in the store and in the SDK.
    assert row["latency_saved_ms"] == pytest.approx(sum(saved) / len(saved), abs=1e-6)
    assert row["extra_tokens_ratio"] == pytest.approx(lost_tokens / won_tokens, rel=1e-12)
