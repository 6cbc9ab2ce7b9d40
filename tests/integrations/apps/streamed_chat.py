"""A chat API that streams its answers: time to first byte beside total duration (issue 35).

::

    .venv/bin/python -m tests.integrations.apps.streamed_chat --otlp http://127.0.0.1:4318/v1/traces \\
        --out /tmp/run --requests 160

One FastAPI app served by uvicorn on loopback, instrumented by ``FastAPIInstrumentor`` (its ``http
send`` and ``http receive`` spans kept, as by default) and ``opentelemetry-instrumentation-openai-v2``,
relaying ``openai.AsyncOpenAI`` completions from the mock provider of
:mod:`tests.integrations.providers` (one token per chunk after a first-token delay spread over a
lognormal, then ``TOKEN_S`` per token: a request's duration is mostly generation). Endpoints (``POST``,
JSON ``{"id": n}``):

* ``/chat/stream`` — ``create(..., stream=True)`` (usage in the last chunk) in the endpoint, then a
  ``StreamingResponse`` (``text/event-stream``) relaying each chunk's content as one server-sent
  event as it arrives:
  Starlette sends ``http.response.start`` at once, one ``http.response.body`` per event, and a last
  empty one.
* ``/chat`` — the whole completion, then JSON (one ``http.response.body``).

The load driver (plain ``http.client`` threads, outside the traced system) gives up on a streamed
answer whose first body byte has not arrived ``STREAM_PATIENCE_S`` after it sent the request: it
closes the connection. Uvicorn reports the disconnect to Starlette, which cancels the response's
stream; the relay closes the model stream and, its answer unfinished, marks the request's SERVER
span ``tailwatch.abandoned = "true"`` (the abandonment convention,
``analytics.conventions.Conventions.abandon_attribute``). The ``/chat`` clients wait for their answers.

One phase (``current``) after a warm-up outside it; ``run.json`` records its bounds (ns, whole
microseconds) and what the driver saw per endpoint (answered, abandoned); ``spans.jsonl`` every span
the SDK produced (:func:`tests.integrations.apps.base.span_record` from an ``InMemorySpanExporter``
beside the OTLP/HTTP exporter, which sends them when the run ends).
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import random
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Span
from pydantic import BaseModel

from tests.integrations.apps.base import _serve, span_record
from tests.integrations.providers import MockProviders, ModelScript

__all__ = ["ABANDONED_ATTRIBUTE", "MODEL", "SERVICE", "STREAM_PATIENCE_S", "run"]

SERVICE = "chat-gateway"
MODEL = "gpt-4o-mini"
STREAM_PATH, CHAT_PATH = "/chat/stream", "/chat"
ABANDONED_ATTRIBUTE = "tailwatch.abandoned"
TOKEN_S = 0.03
# First token after 0.15 s × lognormal(0, 0.6) quantiles (0.04–0.6 s); 5–27 tokens per answer.
SCRIPT = ModelScript(
    latency_s=0.0,
    first_token_s=0.15,
    first_token_sigma=0.6,
    token_s=TOKEN_S,
    response_model="gpt-4o-mini-2024-07-18",
)
STREAM_PATIENCE_S = 0.3  # a streaming client's wait for the first body byte
CHAT_SHARE = 0.4  # /chat requests per /chat/stream request


class Question(BaseModel):
    id: int


def _messages(i: int) -> list[dict[str, str]]:
    words = " ".join(f"w{(i * 31 + k) % 97}" for k in range(3 + (i * 5) % 19))
    return [{"role": "user", "content": f"question {i}: {words}"}]


def _build(providers: MockProviders, tp: TracerProvider) -> Any:
    import anyio
    import openai
    from fastapi import FastAPI
    from fastapi.responses import StreamingResponse
    from opentelemetry import trace
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

    oai = openai.AsyncOpenAI(base_url=providers.openai_base_url, api_key="sk-test")
    app = FastAPI(title="chat-gateway")

    class RelayResponse(StreamingResponse):
        """A model stream relayed as server-sent events. When the client disconnects, Starlette
        cancels the stream (wherever it is: awaiting the model or sending a chunk); a relay that did
        not run to its end lost its client, and the request is marked abandoned."""

        def __init__(self, stream: Any, server_span: Span) -> None:
            self.finished = False
            self.server_span = server_span
            super().__init__(self.relay(stream), media_type="text/event-stream")

        async def relay(self, stream: Any) -> AsyncIterator[str]:
            try:
                async with stream:  # openai-v2 ends its call's span on leaving
                    async for chunk in stream:
                        text = chunk.choices[0].delta.content if chunk.choices else None
                        if text:
                            yield f"data: {json.dumps({'text': text})}\n\n"
            except asyncio.CancelledError:
                with anyio.CancelScope(shield=True):
                    await stream.response.aclose()  # the model's answer is no longer read
                raise
            self.finished = True

        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            await super().__call__(scope, receive, send)
            if not self.finished:
                self.server_span.set_attribute(ABANDONED_ATTRIBUTE, "true")

    @app.post(STREAM_PATH)
    async def chat_stream(question: Question) -> StreamingResponse:
        # The SERVER span, taken before the call: openai-v2 leaves its call's span current while the
        # stream is open (the response's send spans are its children).
        server_span = trace.get_current_span()
        stream = await oai.chat.completions.create(
            model=MODEL, messages=_messages(question.id), stream=True, stream_options={"include_usage": True}
        )
        return RelayResponse(stream, server_span)

    @app.post(CHAT_PATH)
    async def chat(question: Question) -> dict[str, str]:
        answer = await oai.chat.completions.create(model=MODEL, messages=_messages(question.id))
        return {"answer": answer.choices[0].message.content or ""}

    FastAPIInstrumentor.instrument_app(app, tracer_provider=tp)
    app.state.self_url = {}
    return app


def _drive(url: str, jobs: list[tuple[str, int]], concurrency: int) -> Counter[str]:
    """Each job's outcome: ``"<path> <status>"``, or ``"<path> abandoned"`` when the client gave up."""
    host, port = url.removeprefix("http://").split(":")
    local = threading.local()

    def one(job: tuple[str, int]) -> str:
        path, i = job
        conn = getattr(local, "conn", None)
        if conn is None:
            conn = local.conn = http.client.HTTPConnection(host, int(port), timeout=60)
        sent = time.monotonic()
        try:
            conn.request("POST", path, json.dumps({"id": i}), {"content-type": "application/json"})
            response = conn.getresponse()
            if path == STREAM_PATH and conn.sock is not None:
                conn.sock.settimeout(max(0.001, STREAM_PATIENCE_S - (time.monotonic() - sent)))
                try:
                    response.read1(65536)  # the first body bytes
                except TimeoutError:
                    conn.close()
                    local.conn = None
                    return f"{path} abandoned"
                conn.sock.settimeout(60)
            response.read()
        except (OSError, http.client.HTTPException):
            conn.close()
            local.conn = None
            raise
        return f"{path} {response.status}"

    with ThreadPoolExecutor(concurrency, thread_name_prefix="driver") as pool:
        return Counter(pool.map(one, jobs))


def _now_us_ns() -> int:
    return time.time_ns() // 1000 * 1000


def run(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="a streaming chat API with impatient clients")
    parser.add_argument("--otlp", required=True, help="OTLP/HTTP traces endpoint")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--requests", type=int, default=160, help="/chat/stream requests")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()

    tp = TracerProvider(resource=Resource.create({"service.name": SERVICE, "service.version": "1.0.0"}))
    memory = InMemorySpanExporter()
    # Spans go to tailwatch when the run ends (as in apps/base.py: no receiver work beside the load).
    tp.add_span_processor(
        BatchSpanProcessor(
            OTLPSpanExporter(endpoint=args.otlp),
            max_queue_size=1_000_000,
            max_export_batch_size=1_000_000,
            schedule_delay_millis=3_600_000,
        )
    )
    tp.add_span_processor(SimpleSpanProcessor(memory))
    from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor

    OpenAIInstrumentor().instrument(tracer_provider=tp)

    rng = random.Random(args.seed)
    with MockProviders({MODEL: SCRIPT}) as providers:
        app = _build(providers, tp)
        with _serve(app) as url:
            _drive(url, [(p, 1000 + i) for p in (STREAM_PATH, CHAT_PATH) for i in range(args.concurrency)], 4)
            time.sleep(0.3)
            start = _now_us_ns()
            jobs = [(STREAM_PATH, i) for i in range(args.requests)]
            jobs += [(CHAT_PATH, i) for i in range(round(args.requests * CHAT_SHARE))]
            rng.shuffle(jobs)
            outcomes = _drive(url, jobs, args.concurrency)
            time.sleep(0.5)  # the abandoned requests' SERVER spans end after their clients left
            end = _now_us_ns()

    assert tp.force_flush(30_000), "the span processors did not flush"
    tp.shutdown()
    spans = memory.get_finished_spans()
    with (args.out / "spans.jsonl").open("w") as f:
        for span in spans:
            f.write(json.dumps(span_record(span)) + "\n")
    run_info = {
        "service": SERVICE,
        "phases": {"current": [start, end]},
        "outcomes": dict(outcomes),
        "spans": len(spans),
        "seconds": round(time.monotonic() - began, 2),
    }
    (args.out / "run.json").write_text(json.dumps(run_info, indent=2))
    print(json.dumps(run_info))


if __name__ == "__main__":
    run()
