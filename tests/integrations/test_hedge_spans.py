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

The figures asserted are read off the spans the SDK produced (an ``InMemorySpanExporter``)."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterator

import openai
import pytest
from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

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


def _chat_spans_per_request(spans: tuple[ReadableSpan, ...]) -> dict[int, list[ReadableSpan]]:
    roots = {s.context.span_id for s in spans if s.parent is None}
    out: dict[int, list[ReadableSpan]] = defaultdict(list)
    for s in spans:
        if s.parent is not None and s.parent.span_id in roots and s.name == f"chat {MODEL}":
            out[s.parent.span_id].append(s)
    assert len(roots) == REQUESTS
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
