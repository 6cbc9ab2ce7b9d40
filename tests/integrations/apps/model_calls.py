"""Model calls, streamed and not, through the real ``openai`` and ``anthropic`` clients under one LLM
instrumentation flavour, against mock providers that stream with a known time to first token.

::

    .venv/bin/python -m tests.integrations.apps.model_calls --flavour traceloop \\
        --otlp http://127.0.0.1:4318/v1/traces --out /tmp/run --requests 12

Flavours (one per process: instrumentations patch the clients globally):

* ``openai_v2``: OpenAI through ``opentelemetry-instrumentation-openai-v2``; Anthropic through the
  Anthropic SDK's own GenAI spans (anthropic ≥ 2, ``open_telemetry={"traces": True}``), the other
  GenAI-convention instrumentation of this family (no ``-anthropic`` package of openai-v2's kind
  exists).
* ``traceloop``: OpenLLMetry's ``opentelemetry-instrumentation-openai`` and
  ``-anthropic`` (the Anthropic SDK's own spans off, so that one call has one LLM span).
* ``openinference``: ``openinference-instrumentation-openai``; no Anthropic calls
  (``openinference-instrumentation-anthropic`` is not a dependency).

Each request is a SERVER span ``POST /answer`` (the service's, made by app code; ``answers.stream``
says whether the app streamed the call, ``answers.stream_helper`` whether through
``messages.stream()``, ``answers.mock.*_tokens`` the usage the mock answers with)
around one model call. Per phase (``baseline`` then
``current``, the mock's scripts swapped between them: a provider whose first token and generation
slow down and whose cache hits drop) and per request index ``i``:

* ``OPENAI_MODEL``: one call not streamed and one streamed (``stream=True`` with
  ``stream_options.include_usage``, the chunks read to the end);
* ``OPENAI_BATCH_MODEL``: three calls (other prompts), never streamed (no call of this model has a
  time to first token; its first-token delay varies little, so that a fit of duration against output
  tokens finds the mock's first-token and per-token delays);
* ``ANTHROPIC_MODEL`` (not in ``openinference``): one call not streamed and one streamed —
  ``messages.create(stream=True)`` for even ``i``, the ``messages.stream()`` helper for odd ``i``.

Before both windows a warm-up call of each kind (connections, lazy imports). Output in ``--out``:
``spans.jsonl`` (:func:`tests.integrations.apps.base.span_record` plus ``event_times``: each event's
name and time in ns) and ``run.json`` (``phases``: window bounds in ns, ``calls``: per phase the
calls made per model as ``[calls, streamed]``).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from tests.integrations.apps.base import span_record
from tests.integrations.providers import (
    MockProviders,
    ModelScript,
    cached_tokens,
    completion_tokens,
    prompt_tokens,
)

__all__ = [
    "ANTHROPIC_MODEL",
    "BATCH_CALLS_PER_REQUEST",
    "FLAVOURS",
    "OPENAI_BATCH_MODEL",
    "OPENAI_MODEL",
    "SCRIPTS",
    "CallFlavour",
    "model_call_record",
]

OPENAI_MODEL = "gpt-4o-mini"
OPENAI_BATCH_MODEL = "gpt-4.1-nano"
ANTHROPIC_MODEL = "claude-haiku-4-5"
SERVICE = "answers"
# Three non-streamed calls of OPENAI_BATCH_MODEL per request index (other prompts): enough calls in
# a window (30) for tailwatch to estimate their time to first token from duration against tokens.
BATCH_CALLS_PER_REQUEST = 3


def _script(
    first_token_s: float, token_s: float, cached: float, response_model: str | None, sigma: float = 0.8
) -> ModelScript:
    # latency_s 0: the time to first token is the mock's first_token_s draw (and the loopback's).
    return ModelScript(
        latency_s=0.0,
        first_token_s=first_token_s,
        first_token_sigma=sigma,
        token_s=token_s,
        cached_input_share=cached,
        response_model=response_model,
    )


# Per phase: the provider's first token and generation slow down and its cache hits drop.
SCRIPTS: dict[str, dict[str, ModelScript]] = {
    "baseline": {
        OPENAI_MODEL: _script(0.03, 0.002, 0.5, "gpt-4o-mini-2024-07-18"),
        OPENAI_BATCH_MODEL: _script(0.04, 0.003, 0.0, None, sigma=0.1),
        ANTHROPIC_MODEL: _script(0.035, 0.002, 0.6, "claude-haiku-4-5-20251001"),
    },
    "current": {
        OPENAI_MODEL: _script(0.08, 0.005, 0.25, "gpt-4o-mini-2024-07-18"),
        OPENAI_BATCH_MODEL: _script(0.04, 0.003, 0.0, None, sigma=0.1),
        ANTHROPIC_MODEL: _script(0.06, 0.004, 0.3, "claude-haiku-4-5-20251001"),
    },
}


@dataclass(frozen=True)
class CallFlavour:
    name: str
    instrument: Callable[[TracerProvider], None]
    anthropic: bool  # whether the flavour makes Anthropic calls
    anthropic_native: bool  # the Anthropic SDK's own spans


def _openai_v2(tp: TracerProvider) -> None:
    from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor

    OpenAIInstrumentor().instrument(tracer_provider=tp)


def _traceloop(tp: TracerProvider) -> None:
    from opentelemetry.instrumentation.anthropic import AnthropicInstrumentor
    from opentelemetry.instrumentation.openai import OpenAIInstrumentor

    OpenAIInstrumentor().instrument(tracer_provider=tp)
    AnthropicInstrumentor().instrument(tracer_provider=tp)


def _openinference(tp: TracerProvider) -> None:
    from openinference.instrumentation.openai import OpenAIInstrumentor

    OpenAIInstrumentor().instrument(tracer_provider=tp)


FLAVOURS: dict[str, CallFlavour] = {
    f.name: f
    for f in (
        CallFlavour("openai_v2", _openai_v2, anthropic=True, anthropic_native=True),
        CallFlavour("traceloop", _traceloop, anthropic=True, anthropic_native=False),
        CallFlavour("openinference", _openinference, anthropic=False, anthropic_native=False),
    )
}


def model_call_record(span: ReadableSpan) -> dict[str, Any]:
    """:func:`span_record` with each event's name and time (the chunk events are the TTFT of some)."""
    return {**span_record(span), "event_times": [[e.name, e.timestamp] for e in span.events]}


def _prompt(i: int, kind: str) -> str:
    words = " ".join(f"w{(i * 31 + k) % 97}" for k in range(4 + (i * 7) % 17))
    return f"{kind} question {i}: {words}"


Call = tuple[str, bool, int]  # model, streamed, request index


def _calls(flavour: CallFlavour, requests: int) -> list[Call]:
    out: list[Call] = []
    for i in range(requests):
        out += [(OPENAI_MODEL, False, i), (OPENAI_MODEL, True, i)]
        out += [(OPENAI_BATCH_MODEL, False, i + 100 * k) for k in range(BATCH_CALLS_PER_REQUEST)]
        if flavour.anthropic:
            out += [(ANTHROPIC_MODEL, False, i), (ANTHROPIC_MODEL, True, i)]
    return out


def _now_us_ns() -> int:
    return time.time_ns() // 1000 * 1000


def run(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="model calls under one LLM instrumentation flavour")
    parser.add_argument("--flavour", required=True, choices=sorted(FLAVOURS))
    parser.add_argument("--otlp", required=True, help="OTLP/HTTP traces endpoint")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--requests", type=int, default=12, help="request indexes per phase")
    parser.add_argument("--concurrency", type=int, default=3)
    args = parser.parse_args(argv)
    flavour = FLAVOURS[args.flavour]
    args.out.mkdir(parents=True, exist_ok=True)

    tp = TracerProvider(resource=Resource.create({"service.name": SERVICE, "service.version": "1.0.0"}))
    memory = InMemorySpanExporter()
    # Spans go to tailwatch when the run ends (as in apps/base.py: no receiver work beside the calls).
    tp.add_span_processor(
        BatchSpanProcessor(
            OTLPSpanExporter(endpoint=args.otlp),
            max_queue_size=100_000,
            max_export_batch_size=100_000,
            schedule_delay_millis=3_600_000,
        )
    )
    tp.add_span_processor(SimpleSpanProcessor(memory))
    flavour.instrument(tp)

    import anthropic
    import openai

    tracer = tp.get_tracer("answers.app")
    phases: dict[str, list[int]] = {}
    made: dict[str, dict[str, list[int]]] = {}
    with MockProviders(SCRIPTS["baseline"]) as providers:
        oai = openai.OpenAI(base_url=providers.openai_base_url, api_key="sk-test")
        claude = anthropic.Anthropic(
            base_url=providers.anthropic_base_url,
            api_key="sk-ant-test",
            open_telemetry={"traces": flavour.anthropic_native, "tracer_provider": tp},
        )

        def call(job: Call) -> None:
            model, streamed, i = job
            messages: Any = [{"role": "user", "content": _prompt(i, model)}]
            system = "You answer briefly." if model.startswith("claude") else None
            script = providers.script(model)
            p = prompt_tokens(messages, system)
            # What the app asked for and what the mock answers (its token counts are a pure function
            # of the request), beside what the instrumentation recorded.
            attributes: dict[str, Any] = {
                "http.request.method": "POST",
                "http.route": "/answer",
                "answers.stream": streamed,
                "answers.stream_helper": streamed and system is not None and i % 2 == 1,
                "answers.mock.input_tokens": p,
                "answers.mock.output_tokens": completion_tokens(p),
                "answers.mock.cached_input_tokens": cached_tokens(p, script.cached_input_share),
            }
            with tracer.start_as_current_span("POST /answer", kind=SpanKind.SERVER, attributes=attributes):
                if system is not None:
                    kwargs: Any = {"model": model, "max_tokens": 256, "messages": messages, "system": system}
                    if not streamed:
                        claude.messages.create(**kwargs)
                    elif i % 2 == 0:
                        for _event in claude.messages.create(**kwargs, stream=True):
                            pass
                    else:
                        with claude.messages.stream(**kwargs) as stream:
                            stream.until_done()
                elif streamed:
                    chunks = oai.chat.completions.create(
                        model=model, messages=messages, stream=True, stream_options={"include_usage": True}
                    )
                    for _chunk in chunks:
                        pass
                else:
                    oai.chat.completions.create(model=model, messages=messages)

        warm_up = {(m, s): (m, s, 1000) for m, s, _ in _calls(flavour, 1)}
        for job in warm_up.values():
            call(job)
        time.sleep(0.2)
        t = _now_us_ns()
        for phase in ("baseline", "current"):
            for model, script in SCRIPTS[phase].items():
                providers.set_script(model, script)
            jobs = _calls(flavour, args.requests)
            with ThreadPoolExecutor(args.concurrency) as pool:
                list(pool.map(call, jobs))
            time.sleep(0.1)
            end = _now_us_ns()
            phases[phase] = [t, end]
            t = end
            made[phase] = {}
            for model, streamed, _ in jobs:
                counts = made[phase].setdefault(model, [0, 0])
                counts[0] += 1
                counts[1] += int(streamed)

    assert tp.force_flush(30_000), "the span processors did not flush"
    tp.shutdown()
    spans = memory.get_finished_spans()
    with (args.out / "spans.jsonl").open("w") as f:
        for span in spans:
            f.write(json.dumps(model_call_record(span)) + "\n")
    run_info = {"flavour": flavour.name, "phases": phases, "calls": made, "spans": len(spans)}
    (args.out / "run.json").write_text(json.dumps(run_info, indent=2))


if __name__ == "__main__":
    run()
