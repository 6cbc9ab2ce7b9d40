"""A workload generator: days of an AI product's traffic, made with the real OpenTelemetry SDK.

Every span is created by ``opentelemetry-sdk`` tracers (one ``TracerProvider`` per service and
release, so ``service.name``/``service.version`` travel as resources) with explicit start and end
times, on a compressed clock: three simulated days end at ``end`` and take seconds to produce.

The spans have the shapes that the instrumentation libraries users run actually emit (REFERENCE.md
section 7), not the idealised shapes of the semantic conventions, each under the instrumentation
scope of the library that would make it:

* **Model calls** (``opentelemetry-instrumentation-openai-v2``, the SDKs sending through httpx):
  one GenAI Client span per logical call, ``chat {model}`` / ``embeddings {model}``, with
  ``gen_ai.operation.name``, ``gen_ai.provider.name`` (``gen_ai.system`` on services running the
  older instrumentation), ``gen_ai.request.model``, ``gen_ai.response.model`` and
  ``gen_ai.usage.input_tokens``/``output_tokens``. The provider SDK retries 408/409/429/5xx and
  timeouts *inside* that call: the GenAI span has one httpx Client child ``POST`` per HTTP attempt
  (``http.status_code`` on services on the old HTTP conventions, ``http.response.status_code`` on
  the others; a throttled or failed attempt has status Error), and the SDK's backoff (exponential
  with jitter, or the provider's ``retry-after``) is the gap between those children. No span carries
  ``http.request.resend_count`` (Python instrumentations never set it). A call that succeeded after
  retries has status Unset and the final usage; a call whose retries ran out has status Error,
  ``error.type`` (``RateLimitError``, ``APITimeoutError``, …) and no usage.
* **Application-level retries**: the agent re-calls a hop whose call failed (retries exhausted, or
  a streamed response that stalled): a new same-name sibling GenAI span after the failed one ended.
* **Celery** (``opentelemetry-instrumentation-celery`` defaults): ``apply_async/{task}`` Producer in
  the web request's trace, ``run/{task}`` Consumer as its *child* (same trace, no link), with
  ``messaging.destination`` (the routing key), ``messaging.message.id`` (the task id),
  ``celery.task_name``, ``celery.state``; a retried task re-runs under the retry's
  ``apply_async`` (a child of the failed run) with the same ``messaging.message.id``.
* **Feature flags** (OpenFeature with its OpenTelemetry ``TracingHook``, the flagd provider): each
  evaluation is a ``feature_flag.evaluation`` event on the span current at the time (the Server
  span) with ``feature_flag.key``, ``feature_flag.result.variant``, ``feature_flag.result.value``
  (JSON), ``feature_flag.result.reason``, ``feature_flag.context.id`` (the targeting key) and
  ``feature_flag.provider.name``.
* **Newer messaging conventions** (one queue keeps them): ``send {queue}`` Producer and
  ``process {queue}`` Consumer in its own trace, joined by a span link, with
  ``messaging.destination.name``.
* **HTTP servers**: Server roots on the old (``http.method``, ``http.status_code``,
  ``http.target``, ``http.route``) or the new conventions per service; FastAPI services add the
  small Internal children ``{route} http receive`` / ``{route} http send``. Users who abandon a
  slow response leave status ``499`` in whichever status attribute the service uses.

The traffic (all numbers per simulated day at ``scale=1``)::

    chat-api       POST /chat       2400  auth, cache, retrieval, db; from 1.5.0 a sync LLM call (a)
    assistant-api  POST /ask        1600  one sync chat gpt-4o-mini call (the shared chat pool) (b)
    upload-api     POST /documents  1000  -> Celery task summarize_document -> summary-worker (LLM)
    search-api     GET /search      1600  auth, cache, embeddings, SELECT documents (d)
    support-bot    POST /reply      1200  retrieval, chat claude-sonnet-4 (anthropic) (e);
                                          10% -> queue ticket-escalations -> escalation-router
    agent-runner   claims-triage     400  invoke_workflow: 3 LLM hops, 2 tool hops (c)
    notes-api      POST /summarize   800  a sync chat gpt-4.1-mini call; under (f) a flag sends a slice
                                          to the async variant: Celery task -> notes-worker (LLM)
    digest-worker  run/digests.summarize_batch  one nightly Celery beat run of 120 documents, each a
                                          summarize_document call (gpt-4.1-nano); under (g) hourly
                                          runs of 5, then 3, from the second day, a quarter of the
                                          last day's retried whole after a bad document
    digest-api     POST /summaries/now   400  only under (g), on the last day: summarize_document
                                          called synchronously for one document
    writer-api     POST /draft      1000  a streamed chat gpt-4o call (time to first chunk recorded)
                                          relayed to the user as it streams (a StreamingResponse:
                                          one send span per chunk); under (h) release 3.1.0
                                          triples its prompt

    service          HTTP conventions  GenAI provider attribute  server framework
    chat-api         old               gen_ai.system             FastAPI (receive/send spans)
    assistant-api    new               gen_ai.provider.name      FastAPI (receive/send spans)
    upload-api       old               -                         Flask
    summary-worker   old (httpx)       gen_ai.system             Celery worker
    search-api       new               gen_ai.provider.name      Flask
    support-bot      new               gen_ai.provider.name      Flask
    agent-runner     old (httpx)       gen_ai.provider.name      -
    notes-api        new               gen_ai.provider.name      FastAPI (receive/send spans)
    notes-worker     new (httpx)       gen_ai.provider.name      Celery worker
    digest-api       new               gen_ai.provider.name      FastAPI (receive/send spans)
    digest-worker    new (httpx)       gen_ai.provider.name      Celery worker (beat not traced)
    writer-api       new               gen_ai.provider.name      FastAPI (receive/send spans)

The timeline: the simulated period is ``[end - 3d, end)``; every scenario changes the system at
``end - 1d``, so the last day is each scenario's *current* window and the day before it a clean
*baseline* (:class:`Timeline`). The migration (f) is cut over by slices: its flag already sends
internal users and a small slice to the async variant on the earlier days, the ~30 % slice starts
at ``end - 1d``. The drift (g) unfolds over the three days instead: nightly on the first, hourly
on the second, and the synchronous endpoint on the last. Scenarios that would interfere live on
different services, and each service draws its randomness from its own seeded stream, so
switching one scenario off leaves the other services' traffic unchanged and removes exactly that
anomaly.

Usage::

    from demo.generator import Workload
    workload = Workload(seed=7, scale=1.0)
    for batch in workload.batches():          # lists of SDK ReadableSpan, time ordered by slice
        exporter.export(batch)
"""

from __future__ import annotations

import base64
import gzip
import io
import json
import math
import random
import threading
import time
import uuid
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal, get_args

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import Link, SpanKind, Status, StatusCode, Tracer

from storage import TailwatchError, as_utc

__all__ = [
    "SCENARIOS",
    "SCENARIO_INFO",
    "ExportStats",
    "FileFormat",
    "FlagRollout",
    "GeneratorError",
    "Scenario",
    "ScenarioInfo",
    "Timeline",
    "Workload",
    "export_otlp_http",
    "export_to_exporter",
    "generate",
    "parse_scenarios",
    "write_otlp_file",
]

Scenario = Literal[
    "release_coupling",
    "noisy_neighbour",
    "retry_storm",
    "internal_regression",
    "llm_slowdown",
    "hot_cold_migration",
    "batch_drift",
    "prompt_growth",
]
SCENARIOS: tuple[Scenario, ...] = get_args(Scenario)
FileFormat = Literal["protobuf", "jsonl"]
FILE_FORMATS: tuple[FileFormat, ...] = get_args(FileFormat)

DAY_NS = 86_400 * 10**9
_MS = 1_000_000
_S = 10**9
# A streamed answer relayed to the user goes out in this many body sends before the last, empty one.
_STREAM_CHUNKS = 4


class GeneratorError(TailwatchError):
    """A bad generator option (unknown scenario, scale out of range, unwritable file)."""


@dataclass(frozen=True)
class FlagRollout:
    """A feature flag that moves an operation's work off the hot path, cut over by slices.

    Its evaluations are recorded the way OpenFeature's OpenTelemetry ``TracingHook`` records them: a
    ``feature_flag.evaluation`` event on the span current during the evaluation (the Server span),
    with ``feature_flag.key``, ``feature_flag.result.variant``, ``feature_flag.result.value``,
    ``feature_flag.result.reason``, ``feature_flag.context.id`` and ``feature_flag.provider.name``.
    """

    key: str
    control: str  # the variant that keeps the model call inside the request
    treatment: str  # the variant that enqueues the work and answers at once
    # The treatment's expected share of requests in the current window (internal users included).
    treatment_share: float
    provider: str = "FlagdProvider"  # the flagd provider's metadata name


@dataclass(frozen=True)
class ScenarioInfo:
    """What a scenario does and which alert must catch it (the demo's ground truth)."""

    name: Scenario
    letter: str
    title: str
    # Where the anomaly lives: a hot-path (service, operation), a queue or a workflow.
    service: str
    operation: str
    # The rule kind expected to fire and the `cause` annotation it must carry (cause None: the rule
    # kind is the diagnosis, as for retry amplification, whose alerts carry no LLM/internal verdict;
    # alert_kind None: no alert is expected, the analysis frames are the whole evidence).
    alert_kind: str | None
    cause: str | None
    view: str
    story: str
    flag: FlagRollout | None = None
    # The architecture drift the scenario must show (kinds of analytics.drift findings), read from
    # the analysis' drift report rather than from an alert.
    drift: tuple[str, ...] = ()
    # The cause inside an ``llm`` verdict the analysis must name (analytics.llm_anatomy).
    llm_cause: str | None = None


# Scenario (f): notes-api moves its summaries off the hot path behind this flag. Internal users
# always get the queued variant; everyone else is bucketed by a sticky hash of their id, the
# bucket growing by stages (the last is the current day's ~30 %).
_NOTES_FLAG = FlagRollout(
    key="summarize-off-hot-path",
    control="sync",
    treatment="async",
    treatment_share=0.3,
)

SCENARIO_INFO: Mapping[Scenario, ScenarioInfo] = {
    "release_coupling": ScenarioInfo(
        "release_coupling",
        "a",
        "release 1.5.0 adds a sync LLM call",
        "chat-api",
        "POST /chat",
        "release_coupling",
        "llm",
        "hot_path",
        "chat-api 1.5.0 ships a synchronous chat gpt-4o-mini call on POST /chat: p99 steps up with the "
        "release and sync LLM calls per request go 0 -> 1",
    ),
    "noisy_neighbour": ScenarioInfo(
        "noisy_neighbour",
        "b",
        "doc summaries share the chat model pool",
        "assistant-api",
        "POST /ask",
        "p99_regression",
        "llm",
        "attribution",
        "summary-worker moves its doc-summaries jobs onto the gpt-4o-mini pool that assistant-api calls "
        "synchronously: assistant-api's code is unchanged, its LLM spans get slower and throttled, and "
        "the cold-path share of calls to that model rises from 0",
    ),
    "retry_storm": ScenarioInfo(
        "retry_storm",
        "c",
        "provider 429 storm in the agent workflow",
        "agent-runner",
        "claims-triage",
        "retry_amplification",
        None,
        "retries",
        "the provider throttles the claims-triage models: the SDK retries inside each call (one HTTP "
        "child per attempt, 429s), calls that still fail are re-called by the agent, attempts and billed "
        "tokens multiply",
    ),
    "internal_regression": ScenarioInfo(
        "internal_regression",
        "d",
        "slow database query, LLM unchanged",
        "search-api",
        "GET /search",
        "p99_regression",
        "internal",
        "attribution",
        "the SELECT documents query of search-api loses its index and slows down; the embeddings call is "
        "unchanged",
    ),
    "llm_slowdown": ScenarioInfo(
        "llm_slowdown",
        "e",
        "LLM provider slowdown, our code unchanged",
        "support-bot",
        "POST /reply",
        "p99_regression",
        "llm",
        "attribution",
        "anthropic's claude-sonnet-4 generates each output token about five times slower; support-bot's "
        "code, prompts and traffic are unchanged (non-streamed calls: the time per token is estimated "
        "from duration against output tokens)",
        llm_cause="provider_generation",
    ),
    "hot_cold_migration": ScenarioInfo(
        "hot_cold_migration",
        "f",
        "summaries moved off the hot path by flag slices",
        "notes-api",
        "POST /summarize",
        None,
        None,
        "boundary",
        "notes-api moves its synchronous chat gpt-4.1-mini summary off the request behind the flag "
        "summarize-off-hot-path, cut over by slices (internal users, 1 %, 10 %, then ~30 % on the last "
        "day): the async variant enqueues a Celery task and answers 202 at once, its p99 falls far "
        "below the sync control's and the user now waits seconds on the queue instead",
        flag=_NOTES_FLAG,
    ),
    "batch_drift": ScenarioInfo(
        "batch_drift",
        "g",
        "a nightly summary job drifts into an online service",
        "digest-api",
        "summarize_document (digests.summaries.summarize_document)",
        None,
        None,
        "drift",
        "digest-worker's nightly Celery job summarises the day's 120 documents in one run, one "
        "summarize_document call each; from the second day it runs hourly on 5 documents, then 3; on "
        "the last day digest-api gets POST /summaries/now, which calls the same summarize_document "
        "synchronously for one document: its hot-path share of calls goes from 0 to most of them, with "
        "no latency target; and a quarter of the last day's runs meet a document not ready yet and "
        "retry the whole batch (seed 004)",
        drift=("shared_operation", "batch_shrinking", "whole_batch_retry"),
    ),
    "prompt_growth": ScenarioInfo(
        "prompt_growth",
        "h",
        "release 3.1.0 triples the prompt",
        "writer-api",
        "POST /draft",
        "p99_regression",
        "llm",
        "attribution",
        "writer-api 3.1.0 puts the user's whole document history in the system prompt: input tokens "
        "triple, the streamed gpt-4o calls' time to first token (prefill) more than doubles at the "
        "same output length and generation speed; our change, not the provider's",
        llm_cause="longer_prompts",
    ),
}


def parse_scenarios(names: Iterable[str] | None) -> tuple[Scenario, ...]:
    """Scenario names from the command line: None/empty = all; ``none`` = baseline only; commas ok."""
    if names is None:
        return SCENARIOS
    wanted: list[str] = []
    for raw in names:
        wanted.extend(part.strip() for part in raw.split(",") if part.strip())
    if not wanted or wanted == ["all"]:
        return SCENARIOS
    if wanted == ["none"]:
        return ()
    unknown = [w for w in wanted if w not in SCENARIOS]
    if unknown:
        raise GeneratorError(
            f"unknown scenario {', '.join(repr(u) for u in unknown)}; "
            f"allowed: {', '.join(SCENARIOS)} (or 'all', 'none')"
        )
    # Keep the canonical order so the same selection always generates the same traffic.
    return tuple(s for s in SCENARIOS if s in wanted)


@dataclass(frozen=True)
class Timeline:
    """The simulated period and the windows every scenario is built around (tz-aware UTC)."""

    start: datetime
    baseline_start: datetime
    current_start: datetime
    end: datetime

    @classmethod
    def ending(cls, end: datetime, days: int = 3) -> Timeline:
        end = as_utc(end)
        return cls(
            start=end - timedelta(days=days),
            baseline_start=end - timedelta(days=2),
            current_start=end - timedelta(days=1),
            end=end,
        )

    def ns(self, moment: datetime) -> int:
        return _to_ns(moment)


def _to_ns(moment: datetime) -> int:
    # Integer arithmetic: float timestamps lose the nanoseconds at this magnitude.
    delta = moment - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * _S + delta.microseconds * 1000


class _SeededIds(IdGenerator):
    """Deterministic W3C ids from the seed (the SDK's default generator reads ``random``)."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(f"ids:{seed}")

    def generate_span_id(self) -> int:
        return self._rng.getrandbits(64) or 1

    def generate_trace_id(self) -> int:
        return self._rng.getrandbits(128) or 1

    def is_trace_id_random(self) -> bool:
        return True


class _Collect(SpanProcessor):
    """Keeps ended spans until the generator hands them out as a batch."""

    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def on_end(self, span: ReadableSpan) -> None:
        self.spans.append(span)


_EMPTY = Context()


# The instrumentation scopes the spans are made under (name, version): the libraries whose shapes the
# generator reproduces, at the versions they were read from (REFERENCE.md section 7).
_SCOPES: Mapping[str, tuple[str, str]] = {
    "app": ("demo.generator", "0.1.0"),
    "genai": ("opentelemetry.util.genai.handler", "1.1b0"),
    "openai_v2": ("opentelemetry.instrumentation.openai_v2", "2.1b0"),
    "httpx": ("opentelemetry.instrumentation.httpx", "0.66b2"),
    "fastapi": ("opentelemetry.instrumentation.fastapi", "0.66b2"),
    "flask": ("opentelemetry.instrumentation.flask", "0.66b2"),
    "celery": ("opentelemetry.instrumentation.celery", "0.66b2"),
}


@dataclass(frozen=True)
class _Scopes:
    """The tracers of one (service, version), one per instrumentation scope."""

    app: Tracer
    genai: Tracer  # util-genai: GenAI spans with gen_ai.provider.name, workflow and tool spans
    openai_v2: Tracer  # the older openai-v2 instrumentation: GenAI spans with gen_ai.system
    httpx: Tracer
    fastapi: Tracer
    flask: Tracer
    celery: Tracer


class _Tracers:
    """One SDK TracerProvider per (service, version): the resource is per provider in OpenTelemetry."""

    def __init__(self, processor: SpanProcessor, seed: int) -> None:
        self._processor = processor
        self._ids = _SeededIds(seed)
        self._scopes: dict[tuple[str, str], _Scopes] = {}
        self._providers: list[TracerProvider] = []

    def scopes(self, service: str, version: str) -> _Scopes:
        key = (service, version)
        scopes = self._scopes.get(key)
        if scopes is None:
            provider = TracerProvider(
                resource=Resource.create(
                    {
                        "service.name": service,
                        "service.version": version,
                        "service.namespace": "tailwatch-demo",
                        "deployment.environment.name": "demo",
                    }
                ),
                id_generator=self._ids,
                shutdown_on_exit=False,
            )
            provider.add_span_processor(self._processor)
            self._providers.append(provider)
            scopes = _Scopes(**{k: provider.get_tracer(name, v) for k, (name, v) in _SCOPES.items()})
            self._scopes[key] = scopes
        return scopes

    def get(self, service: str, version: str) -> Tracer:
        return self.scopes(service, version).app


@dataclass(frozen=True)
class _Profile:
    """How a service is instrumented, which decides the attribute names and extra spans it emits."""

    # Instrumentations on their defaults write the old HTTP conventions (http.method,
    # http.status_code, http.url, http.target); OTEL_SEMCONV_STABILITY_OPT_IN=http the new ones.
    old_http: bool
    # openai-v2 before util-genai writes gen_ai.system (and server.address on the GenAI span);
    # util-genai >= 1.1 writes gen_ai.provider.name.
    genai_system: bool
    # "fastapi": ASGI middleware, Internal "{route} http receive/send" children; "flask": none.
    framework: str = ""


_PROFILES: Mapping[str, _Profile] = {
    "chat-api": _Profile(old_http=True, genai_system=True, framework="fastapi"),
    "assistant-api": _Profile(old_http=False, genai_system=False, framework="fastapi"),
    "upload-api": _Profile(old_http=True, genai_system=False, framework="flask"),
    "summary-worker": _Profile(old_http=True, genai_system=True),
    "search-api": _Profile(old_http=False, genai_system=False, framework="flask"),
    "support-bot": _Profile(old_http=False, genai_system=False, framework="flask"),
    "agent-runner": _Profile(old_http=True, genai_system=False),
    "escalation-router": _Profile(old_http=False, genai_system=False),
    "notes-api": _Profile(old_http=False, genai_system=False, framework="fastapi"),
    "notes-worker": _Profile(old_http=False, genai_system=False),
    "digest-api": _Profile(old_http=False, genai_system=False, framework="fastapi"),
    "digest-worker": _Profile(old_http=False, genai_system=False),
    "writer-api": _Profile(old_http=False, genai_system=False, framework="fastapi"),
}


def _lognormal_ns(rng: random.Random, median_ms: float, sigma: float) -> int:
    return int(rng.lognormvariate(math.log(median_ms), sigma) * _MS)


def _uniform_ns(rng: random.Random, lo_ms: float, hi_ms: float) -> int:
    return int(rng.uniform(lo_ms, hi_ms) * _MS)


def _task_id(rng: random.Random) -> str:
    """A Celery task id (a UUID4 string), from the service's stream so it is deterministic."""
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def abandon_probability(latency_ms: float, cliff_ms: float = 2000.0) -> float:
    """Users mostly wait until the response passes ``cliff_ms``, then leave quickly (a steep logistic)."""
    return 0.004 + 0.55 / (1.0 + math.exp(-(latency_ms - cliff_ms) / 120.0))


# What the providers answer in gen_ai.response.model: the dated snapshot behind the alias.
_RESPONSE_MODELS: Mapping[str, str] = {
    "gpt-4o-mini": "gpt-4o-mini-2024-07-18",
    "gpt-4.1-nano": "gpt-4.1-nano-2025-04-14",
    "gpt-4o": "gpt-4o-2024-08-06",
    "o4-mini": "o4-mini-2025-04-16",
    "gpt-4.1": "gpt-4.1-2025-04-14",
    "claude-sonnet-4": "claude-sonnet-4-20250514",
    "gpt-4.1-mini": "gpt-4.1-mini-2025-04-14",
}
_PATHS: Mapping[tuple[str, str], str] = {
    ("openai", "chat"): "/v1/chat/completions",
    ("openai", "embeddings"): "/v1/embeddings",
    ("anthropic", "chat"): "/v1/messages",
}
_BACKOFF_INITIAL_S = 0.5  # the openai and anthropic SDKs: 0.5 s x 2^n, at most 8 s, minus 0-25% jitter
_BACKOFF_MAX_S = 8.0


@dataclass
class _Llm:
    """One model endpoint as a client sees it: latency, usage and how its HTTP attempts fail."""

    provider: str
    model: str
    server: str
    median_ms: float
    sigma: float
    input_tokens: int
    output_tokens: int
    operation: str = "chat"
    # Per HTTP attempt: throttled (429), a server error (5xx; anthropic's "overloaded" is 529), no
    # response headers within the client's timeout (an APITimeoutError after the SDK's retries).
    p429: float = 0.0
    p5xx: float = 0.003
    p_timeout: float = 0.0
    timeout_ms: float = 8000.0
    max_retries: int = 2  # the SDKs' default: up to 3 HTTP attempts per call
    # Streamed responses: the HTTP attempt ends when the headers arrive; the GenAI span lasts until
    # the last chunk. A stream that stalls is not retried by the SDK: the call fails (ReadTimeout).
    stream: bool = False
    p_stall: float = 0.0
    # The call's anatomy, when set: the time to first token (median at ``input_tokens``; prefill
    # grows with the prompt: 40% fixed, 60% in proportion to the input tokens) plus each output
    # token at ``ms_per_token`` (jittered by ``token_sigma``), instead of one lognormal total.
    ttft_ms: float | None = None
    ms_per_token: float = 0.0
    token_sigma: float = 0.15


class _Trace:
    """Builds one trace with the SDK: children are laid out one after the other from a cursor."""

    def __init__(self, w: Workload, service: str, at_ns: int, rng: random.Random) -> None:
        self.scopes = w.scopes(service, at_ns)
        self.tracer = self.scopes.app
        self.profile = _PROFILES[service]
        self.rng = rng
        self.last_error = ""  # error.type of the last model call that failed
        self.first_chunk_ns: int | None = None  # when the last streamed call's first chunk arrived

    def start(
        self,
        name: str,
        start_ns: int,
        *,
        parent: Span | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Mapping[str, Any] | None = None,
        links: Sequence[Link] = (),
        tracer: Tracer | None = None,
    ) -> Span:
        ctx = trace.set_span_in_context(parent) if parent is not None else _EMPTY
        span = (tracer or self.tracer).start_span(
            name, context=ctx, kind=kind, attributes=attributes, links=links, start_time=start_ns
        )
        assert isinstance(span, Span)
        return span

    def leaf(
        self,
        name: str,
        start_ns: int,
        duration_ns: int,
        parent: Span,
        *,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Mapping[str, Any] | None = None,
        error: str | None = None,
        tracer: Tracer | None = None,
    ) -> int:
        span = self.start(name, start_ns, parent=parent, kind=kind, attributes=attributes, tracer=tracer)
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
        end = start_ns + max(duration_ns, 1000)
        span.end(end_time=end)
        return end

    def gap(self) -> int:
        return int(self.rng.uniform(0.05, 0.4) * _MS)

    # -- HTTP server roots -------------------------------------------------------------------
    def server(self, method: str, route: str, t0: int) -> tuple[Span, int]:
        """A Server root as the service's web framework instrumentation makes it; returns the span
        and the cursor after what the framework does before the handler runs."""
        p = self.profile
        name = f"{method} {route}"
        attrs: dict[str, Any]
        if p.old_http:
            attrs = {
                "http.method": method,
                "http.scheme": "https",
                "http.host": "api.example.com",
                "http.flavor": "1.1",
                "http.target": route,
                "http.route": route,
                "http.server_name": "api.example.com",
                "net.host.port": 443,
            }
        else:
            attrs = {
                "http.request.method": method,
                "url.scheme": "https",
                "url.path": route,
                "http.route": route,
                "server.address": "api.example.com",
                "server.port": 443,
                "network.protocol.version": "1.1",
            }
        fastapi = p.framework == "fastapi"
        root = self.start(
            name,
            t0,
            kind=SpanKind.SERVER,
            attributes=attrs,
            tracer=self.scopes.fastapi if fastapi else self.scopes.flask,
        )
        t = t0 + self.gap()
        if fastapi and method != "GET":
            # The ASGI middleware wraps each receive() of the request body in a span of its own.
            t = self.leaf(
                f"{name} http receive",
                t,
                _uniform_ns(self.rng, 0.02, 0.08),
                root,
                attributes={"asgi.event.type": "http.request"},
                tracer=self.scopes.fastapi,
            )
            t += self.gap()
        return root, t

    def finish_http(
        self, root: Span, end_ns: int, status: int = 200, *, stream: tuple[int, int] | None = None
    ) -> None:
        """Ends a Server root; past the abandonment cliff users close the connection (499).
        ``stream``: (when the handler returned its StreamingResponse, when the first chunk of the
        answer arrived): the body goes out chunk by chunk from then on."""
        p = self.profile
        key = "http.status_code" if p.old_http else "http.response.status_code"
        if p.framework == "fastapi":
            # The ASGI middleware's send() spans: the response start (with the status the app
            # answered) and the body — one send per chunk and a last empty one when streamed, the
            # response start then going out before the answer exists (Starlette's StreamingResponse).
            fastapi = self.scopes.fastapi
            name = f"{root.name} http send"
            start = {"asgi.event.type": "http.response.start", key: status}
            body = {"asgi.event.type": "http.response.body"}
            start_ns, body_ns = _uniform_ns(self.rng, 0.02, 0.06), _uniform_ns(self.rng, 0.005, 0.02)
            if stream is None:
                end_ns = self.leaf(name, end_ns, start_ns, root, attributes=start, tracer=fastapi)
                end_ns = self.leaf(name, end_ns, body_ns, root, attributes=body, tracer=fastapi)
            else:
                sent, first = stream
                self.leaf(name, sent, start_ns, root, attributes=start, tracer=fastapi)
                for i in range(_STREAM_CHUNKS):
                    at = first + (end_ns - first) * i // _STREAM_CHUNKS
                    self.leaf(name, at, body_ns, root, attributes=body, tracer=fastapi)
                end_ns = self.leaf(name, end_ns, body_ns, root, attributes=body, tracer=fastapi)
            end_ns += _uniform_ns(self.rng, 0.01, 0.05)
        latency_ms = (end_ns - _start_of(root)) / _MS
        if self.rng.random() < abandon_probability(latency_ms):
            # The user closed the connection before the answer arrived: the server span records
            # 499 (client closed request) in the service's own status attribute, the send span
            # above keeps what the app answered.
            status = 499
        root.set_attribute(key, status)
        if status >= 500:
            if not p.old_http:
                root.set_attribute("error.type", str(status))
            root.set_status(Status(StatusCode.ERROR))
        root.end(end_time=end_ns)

    # -- model calls -------------------------------------------------------------------------
    def _http_attempt(
        self, call: Span, llm: _Llm, start_ns: int, duration_ns: int, status: int | None, error: str = ""
    ) -> int:
        """One HTTP attempt of the provider SDK, as the httpx instrumentation records it."""
        url = f"https://{llm.server}{_PATHS[(llm.provider, llm.operation)]}"
        attrs: dict[str, Any]
        if self.profile.old_http:
            attrs = {"http.method": "POST", "http.url": url, "server.address": llm.server}
            if status is not None:
                attrs["http.status_code"] = status
        else:
            attrs = {
                "http.request.method": "POST",
                "url.full": url,
                "server.address": llm.server,
                "server.port": 443,
                "network.protocol.version": "1.1",
            }
            if status is not None:
                attrs["http.response.status_code"] = status
            if status is not None and status >= 400:
                attrs["error.type"] = str(status)
            elif error:
                attrs["error.type"] = error
        span = self.start(
            "POST", start_ns, parent=call, kind=SpanKind.CLIENT, attributes=attrs, tracer=self.scopes.httpx
        )
        if error:
            span.set_status(Status(StatusCode.ERROR, error))
        elif status is not None and status >= 400:
            span.set_status(Status(StatusCode.ERROR))  # the instrumentation sets no description
        end = start_ns + max(duration_ns, 1000)
        span.end(end_time=end)
        return end

    def llm(self, llm: _Llm, parent: Span, start_ns: int, *, must_succeed: bool = False) -> tuple[int, bool]:
        """One logical model call: a GenAI Client span with one httpx ``POST`` child per HTTP attempt.

        The SDK retries 429, 5xx and timeouts up to ``llm.max_retries`` times, sleeping between
        attempts (``retry-after`` for a 429, exponential backoff with jitter otherwise). Returns the
        call's end and whether it succeeded; ``must_succeed`` makes the call succeed (its last
        attempt answers, its stream does not stall).
        """
        rng = self.rng
        p = self.profile
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": llm.operation,
            "gen_ai.request.model": llm.model,
        }
        if p.genai_system:
            attrs["gen_ai.system"] = llm.provider
            attrs["server.address"] = llm.server
            attrs["server.port"] = 443
        else:
            attrs["gen_ai.provider.name"] = llm.provider
        call = self.start(
            f"{llm.operation} {llm.model}",
            start_ns,
            parent=parent,
            kind=SpanKind.CLIENT,
            attributes=attrs,
            tracer=self.scopes.openai_v2 if p.genai_system else self.scopes.genai,
        )
        t = start_ns + _uniform_ns(rng, 0.5, 2.5)  # the SDK builds and serialises the request
        failure = ""
        for attempt in range(llm.max_retries + 1):
            last = attempt == llm.max_retries
            forced = must_succeed and last
            roll = rng.random()
            backoff_s = min(_BACKOFF_INITIAL_S * 2**attempt, _BACKOFF_MAX_S) * (1 - 0.25 * rng.random())
            if not forced and roll < llm.p429:
                t = self._http_attempt(call, llm, t, _uniform_ns(rng, 30, 120), 429)
                failure = "RateLimitError"
                backoff_s = rng.uniform(0.5, 2.0)  # the provider's retry-after, which the SDK honours
            elif not forced and roll < llm.p429 + llm.p5xx:
                code = 529 if llm.provider == "anthropic" else rng.choice((500, 502, 503))
                t = self._http_attempt(call, llm, t, _uniform_ns(rng, 40, 400), code)
                failure = "OverloadedError" if code == 529 else "InternalServerError"
            elif not forced and roll < llm.p429 + llm.p5xx + llm.p_timeout:
                t = self._http_attempt(call, llm, t, int(llm.timeout_ms * _MS), None, "ReadTimeout")
                failure = "APITimeoutError"
            else:
                return self._answer(call, llm, t, stall=not must_succeed and rng.random() < llm.p_stall)
            if not last:
                t += int(backoff_s * _S)
        # Retries exhausted: the SDK raises, the instrumentation records the error, no usage.
        self.last_error = failure
        call.set_attribute("error.type", failure)
        call.set_status(Status(StatusCode.ERROR, failure))
        end = t + _uniform_ns(rng, 0.2, 1.0)
        call.end(end_time=end)
        return end, False

    def _answer(self, call: Span, llm: _Llm, t: int, *, stall: bool) -> tuple[int, bool]:
        """The attempt that got a 200, and the rest of the call (the body, or the stream)."""
        rng = self.rng
        input_tokens = int(llm.input_tokens * rng.uniform(0.7, 1.3))
        output_tokens = int(llm.output_tokens * rng.uniform(0.6, 1.4))
        if llm.ttft_ms is not None:
            prefill = 0.4 + 0.6 * input_tokens / llm.input_tokens
            first = _lognormal_ns(rng, llm.ttft_ms * prefill, llm.sigma)
            per_token = llm.ms_per_token * rng.lognormvariate(0.0, llm.token_sigma)
            total = first + int(output_tokens * per_token * _MS)
        else:
            total = _lognormal_ns(rng, llm.median_ms, llm.sigma)
            first = None
        if llm.stream:
            # The response headers arrive before the first token; the stream takes the rest.
            headers = min(int((total if first is None else first) * 0.9), _lognormal_ns(rng, 350, 0.35))
            if not self.profile.genai_system:
                # util-genai times the first chunk from the invocation's start (retries included).
                arrives = headers + _uniform_ns(rng, 20, 120) if first is None else max(first, headers)
                ttfc = t - _start_of(call) + min(arrives, total)
                call.set_attribute("gen_ai.response.time_to_first_chunk", ttfc / _S)
                self.first_chunk_ns = t + min(arrives, total)
            t = self._http_attempt(call, llm, t, headers, 200)
            streamed = total - headers
        else:
            # Non-streamed completions answer when the whole completion is ready.
            t = self._http_attempt(call, llm, t, total, 200)
            streamed = 0
        if stall:
            # The stream stops part-way and the client's read timeout fires: the SDK does not retry
            # a response that has begun, the call fails. Its usage is partial, not absent: the
            # provider billed the prompt and the tokens streamed so far, and the instrumentation
            # records what it saw (Anthropic's stream reports input tokens in its first event and
            # output tokens as they come; token-counting instrumentations do the same for OpenAI —
            # openai-v2 alone records usage only from the final chunk). So a re-call after a stall
            # bills the prompt twice: this is what makes billed tokens multiply in a retry storm.
            part = rng.uniform(0.2, 0.8)
            end = t + int(streamed * part) + int(llm.timeout_ms * _MS)
            call.set_attribute("gen_ai.usage.input_tokens", input_tokens)
            call.set_attribute("gen_ai.usage.output_tokens", int(output_tokens * part))
            self.last_error = "ReadTimeout"
            call.set_attribute("error.type", "ReadTimeout")
            call.set_status(Status(StatusCode.ERROR, "ReadTimeout"))
            call.end(end_time=end)
            return end, False
        end = t + streamed + _uniform_ns(rng, 0.3, 1.5)  # reading and parsing the body
        call.set_attribute("gen_ai.response.model", _RESPONSE_MODELS.get(llm.model, llm.model))
        call.set_attribute("gen_ai.usage.input_tokens", input_tokens)
        if llm.operation == "chat":
            # What the provider said, as the instrumentation copies it: anthropic's stop_reason.
            reason = "end_turn" if llm.provider == "anthropic" else "stop"
            call.set_attribute("gen_ai.response.finish_reasons", (reason,))
            call.set_attribute("gen_ai.usage.output_tokens", output_tokens)
        call.end(end_time=end)
        return end, True

    # -- everything else ---------------------------------------------------------------------
    def db(self, statement: str, table: str, parent: Span, start_ns: int, duration_ns: int) -> int:
        return self.leaf(
            f"{statement} {table}",
            start_ns,
            duration_ns,
            parent,
            kind=SpanKind.CLIENT,
            attributes={
                "db.system.name": "postgresql",
                "db.operation.name": statement,
                "db.collection.name": table,
                "db.query.summary": f"{statement} {table}",
                "server.address": "pg-main",
            },
        )

    def cache(self, parent: Span, start_ns: int) -> int:
        return self.leaf(
            "GET",
            start_ns,
            _uniform_ns(self.rng, 0.3, 2.0),
            parent,
            kind=SpanKind.CLIENT,
            attributes={"db.system.name": "redis", "db.operation.name": "GET", "server.address": "redis"},
        )

    def auth(self, parent: Span, start_ns: int) -> int:
        return self.leaf(
            "auth", start_ns, _lognormal_ns(self.rng, 6, 0.4), parent, attributes={"auth.method": "jwt"}
        )

    def s3(self, method: str, parent: Span, start_ns: int, median_ms: float) -> int:
        return self.leaf(
            method,
            start_ns,
            _lognormal_ns(self.rng, median_ms, 0.4),
            parent,
            kind=SpanKind.CLIENT,
            attributes={"rpc.system": "aws-api", "rpc.service": "S3", "rpc.method": method},
        )

    def celery_publish(
        self,
        parent: Span,
        start_ns: int,
        task_id: str,
        task: str,
        queue: str,
    ) -> tuple[Span, int]:
        """``apply_async`` of a task, as the Celery instrumentation records a publish."""
        producer = self.start(
            f"apply_async/{task}",
            start_ns,
            parent=parent,
            kind=SpanKind.PRODUCER,
            attributes={
                "celery.action": "apply_async",
                "messaging.message.id": task_id,
                "celery.task_name": task,
                "messaging.destination": queue,
            },
            tracer=self.scopes.celery,
        )
        end = start_ns + _uniform_ns(self.rng, 1, 4)
        producer.end(end_time=end)
        return producer, end

    def celery_run(
        self,
        parent: Span | None,
        start_ns: int,
        task: str,
        queue: str,
        task_id: str,
        host: str,
        retries: int = 0,
    ) -> Span:
        """``run/{task}``: the worker's Consumer span, a child of the publish (the instrumentation's
        default; no link); the root of its trace when the publisher is not traced (``None``)."""
        attrs: dict[str, Any] = {
            "celery.action": "run",
            "celery.task_name": task,
            "messaging.message.id": task_id,
            "messaging.conversation_id": task_id,
            "messaging.destination": queue,
            "celery.delivery_info": str(
                {"exchange": "", "routing_key": queue, "priority": 0, "redelivered": False}
            ),
            "celery.hostname": host,
        }
        if retries:
            attrs["celery.retries"] = retries
        return self.start(
            f"run/{task}",
            start_ns,
            parent=parent,
            kind=SpanKind.CONSUMER,
            attributes=attrs,
            tracer=self.scopes.celery,
        )

    def flag_evaluation(
        self, span: Span, at_ns: int, flag: FlagRollout, variant: str, reason: str, targeting_key: str
    ) -> None:
        """A flag evaluated while ``span`` is current, as OpenFeature's OpenTelemetry ``TracingHook``
        records it: a ``feature_flag.evaluation`` event with the flag's key, the variant and its value
        (JSON, as the hook writes it), the reason in lower case, the targeting key and the provider."""
        span.add_event(
            "feature_flag.evaluation",
            {
                "feature_flag.key": flag.key,
                "feature_flag.result.value": json.dumps(variant == flag.treatment),
                "feature_flag.result.reason": reason,
                "feature_flag.result.variant": variant,
                "feature_flag.context.id": targeting_key,
                "feature_flag.provider.name": flag.provider,
            },
            timestamp=at_ns,
        )


def _start_of(span: Span) -> int:
    start = span.start_time
    assert start is not None
    return start


@dataclass
class _Source:
    """One kind of traffic: its rate, its own random stream and a function that builds one trace."""

    name: str
    per_day: float
    build: Callable[[Workload, random.Random, int], None]
    rng: random.Random = field(default_factory=random.Random)
    next_ns: int = 0
    # A scheduled job (cron, Celery beat) runs at these times rather than at random arrivals.
    schedule: Callable[[Workload], Iterator[int]] | None = None
    _times: Iterator[int] | None = None


class Workload:
    """Deterministic simulated traffic; see the module docstring for the services and scenarios.

    ``batches()`` yields lists of SDK ``ReadableSpan`` (at most ``batch_size`` each), slice by
    simulated slice in time order. The same (scenarios, scale, seed, end) yields the same spans,
    ids included.
    """

    SLICE = timedelta(minutes=15)

    def __init__(
        self,
        scenarios: Iterable[Scenario] | None = None,
        *,
        scale: float = 1.0,
        seed: int = 7,
        end: datetime | None = None,
        days: int = 3,
    ) -> None:
        if not (0 < scale <= 1000):
            raise GeneratorError(f"scale must be in (0, 1000], got {scale}")
        if days < 2:
            raise GeneratorError(f"days must be at least 2 (a baseline day and a current day), got {days}")
        chosen = None if scenarios is None else list(scenarios)
        # An explicit empty selection means "no scenario": the healthy baseline everywhere.
        self.scenarios: tuple[Scenario, ...] = parse_scenarios(chosen) if chosen != [] else ()
        self.scale = scale
        self.seed = seed
        moment = end if end is not None else datetime.now(UTC).replace(microsecond=0)
        self.timeline = Timeline.ending(moment, days)
        self._start_ns = _to_ns(self.timeline.start)
        self._change_ns = _to_ns(self.timeline.current_start)
        self._end_ns = _to_ns(self.timeline.end)
        self._collect = _Collect()
        self._tracers = _Tracers(self._collect, seed)
        self._sources = [
            _Source("chat", 2400, _build_chat),
            _Source("assistant", 1600, _build_assistant),
            _Source("documents", 1000, _build_document),
            _Source("search", 1600, _build_search),
            _Source("support", 1200, _build_support),
            _Source("claims", 400, _build_claims),
            _Source("notes", 800, _build_notes),
            _Source("digest-runs", 24, _build_digest_run, schedule=_digest_schedule),
            _Source("digest", 400, _build_digest_request),
            _Source("drafts", 1000, _build_draft),
        ]
        for source in self._sources:
            # Each service has its own stream: switching a scenario off changes nothing elsewhere.
            source.rng = random.Random(f"{seed}:{source.name}")
            if source.schedule is not None:
                source._times = source.schedule(self)
            source.next_ns = self._next_ns(source, self._start_ns)

    # -- what the builders ask ---------------------------------------------------------------
    def on(self, scenario: Scenario, at_ns: int) -> bool:
        """True when ``scenario`` is selected and ``at_ns`` is in its current (changed) window."""
        return scenario in self.scenarios and at_ns >= self._change_ns

    def tracer(self, service: str, at_ns: int) -> Tracer:
        return self._tracers.get(service, self.version(service, at_ns))

    def scopes(self, service: str, at_ns: int) -> _Scopes:
        """The service's tracers at that moment, one per instrumentation scope."""
        return self._tracers.scopes(service, self.version(service, at_ns))

    def version(self, service: str, at_ns: int) -> str:
        """Releases over time: only chat-api's 1.5.0 changes behaviour (scenario a)."""
        if service == "chat-api":
            if at_ns >= self._change_ns:
                return "1.5.0"
            if at_ns >= self._end_ns - int(2.5 * DAY_NS):
                return "1.4.0"
            return "1.3.0"
        if service == "search-api":
            # A release that changes nothing, outside the windows the rules compare.
            return "2.8.0" if at_ns >= self._end_ns - int(2.6 * DAY_NS) else "2.7.0"
        return {
            "assistant-api": "3.2.0",
            "upload-api": "0.9.4",
            "summary-worker": "0.9.4",
            "support-bot": "2.1.0",
            "agent-runner": "0.4.1",
            "escalation-router": "1.0.2",
            "notes-api": "1.12.0",
            "notes-worker": "1.12.0",
            "digest-api": "0.3.0",
            "digest-worker": "0.3.0",
            # (h) ships with the release that grew the prompt.
            "writer-api": "3.1.0" if self.on("prompt_growth", at_ns) else "3.0.0",
        }[service]

    @property
    def end_ns(self) -> int:
        return self._end_ns

    @property
    def change_ns(self) -> int:
        """When every scenario switches on: the start of the current window."""
        return self._change_ns

    # -- sizes -------------------------------------------------------------------------------
    def estimated_traces(self) -> int:
        days = (self._end_ns - self._start_ns) / DAY_NS
        return int(sum(s.per_day for s in self._sources) * self.scale * days)

    # -- generation --------------------------------------------------------------------------
    def _rate_per_ns(self, source: _Source, at_ns: int) -> float:
        # A diurnal cycle (peak mid-afternoon UTC, trough at night), the same every day so the
        # baseline and the current day see the same load shape.
        hour = (at_ns % DAY_NS) / (3600 * _S)
        diurnal = 1.0 + 0.45 * math.sin(2 * math.pi * (hour - 9.0) / 24.0)
        return source.per_day * self.scale * diurnal / DAY_NS

    def _gap_ns(self, source: _Source, at_ns: int) -> int:
        return max(1, int(source.rng.expovariate(self._rate_per_ns(source, at_ns))))

    def _next_ns(self, source: _Source, after_ns: int) -> int:
        """The source's next trace: its next scheduled time, else a random arrival after ``after_ns``."""
        if source._times is not None:
            return next(source._times, self._end_ns)
        return after_ns + self._gap_ns(source, after_ns)

    @property
    def start_ns(self) -> int:
        return self._start_ns

    def traces(self) -> Iterator[int]:
        """Builds the traces slice by slice; yields the number of traces started in each slice."""
        slice_ns = int(self.SLICE.total_seconds() * _S)
        t = self._start_ns
        while t < self._end_ns:
            upto = min(t + slice_ns, self._end_ns)
            started = 0
            for source in self._sources:
                while source.next_ns < upto:
                    source.build(self, source.rng, source.next_ns)
                    started += 1
                    source.next_ns = self._next_ns(source, source.next_ns)
            yield started
            t = upto

    def batches(
        self, batch_size: int = 512, progress: Callable[[int], None] | None = None
    ) -> Iterator[list[ReadableSpan]]:
        """The spans in export batches; ``progress(n)`` is called with traces started per slice."""
        if batch_size < 1:
            raise GeneratorError(f"batch_size must be at least 1, got {batch_size}")
        pending = self._collect.spans
        for started in self.traces():
            if progress is not None:
                progress(started)
            while len(pending) >= batch_size:
                batch = pending[:batch_size]
                del pending[:batch_size]
                yield batch
        while pending:
            batch = pending[:batch_size]
            del pending[:batch_size]
            yield batch

    def spans(self) -> list[ReadableSpan]:
        return [span for batch in self.batches() for span in batch]


# ---------------------------------------------------------------------------------------------
# The traffic: one builder per source, each called with the workload, its random stream and t0.
# ---------------------------------------------------------------------------------------------


def _gpt_4o_mini(median_ms: float, sigma: float, in_tok: int, out_tok: int, p429: float = 0.0) -> _Llm:
    return _Llm("openai", "gpt-4o-mini", "api.openai.com", median_ms, sigma, in_tok, out_tok, p429=p429)


def _pool_llm(w: Workload, at_ns: int, median_ms: float, sigma: float, in_tok: int, out_tok: int) -> _Llm:
    """A call to the shared gpt-4o-mini pool: saturated while the doc summaries share it (b)."""
    if w.on("noisy_neighbour", at_ns):
        return _gpt_4o_mini(median_ms * 1.9, sigma + 0.15, in_tok, out_tok, p429=0.06)
    return _gpt_4o_mini(median_ms, sigma, in_tok, out_tok)


def _build_chat(w: Workload, rng: random.Random, t0: int) -> None:
    """chat-api POST /chat: auth, cache, retrieval, db; 1.5.0 adds a synchronous LLM call (a)."""
    b = _Trace(w, "chat-api", t0, rng)
    root, t = b.server("POST", "/chat", t0)
    t = b.auth(root, t) + b.gap()
    hit = rng.random() < 0.3
    t = b.cache(root, t) + b.gap()
    if not hit:
        t = (
            b.leaf(
                "retrieval kb-articles",
                t,
                _lognormal_ns(rng, 70, 0.45),
                root,
                attributes={"gen_ai.operation.name": "retrieval", "gen_ai.data_source.id": "kb-articles"},
            )
            + b.gap()
        )
    t = b.db("SELECT", "conversations", root, t, _lognormal_ns(rng, 8, 0.5)) + b.gap()
    llm = _pool_llm(w, t0, 700, 0.4, 1800, 250)
    status = 200
    if w.on("release_coupling", t0):
        end, ok = b.llm(llm, root, t)
        t = end + b.gap()
        status = 200 if ok else 500  # an unhandled provider error after the SDK's retries
    else:
        rng.random()
    t = b.db("INSERT", "messages", root, t, _lognormal_ns(rng, 4, 0.4)) + b.gap()
    b.finish_http(root, t, status)


def _build_assistant(w: Workload, rng: random.Random, t0: int) -> None:
    """assistant-api POST /ask: a synchronous call to the shared gpt-4o-mini pool (victim of b)."""
    b = _Trace(w, "assistant-api", t0, rng)
    root, t = b.server("POST", "/ask", t0)
    t = b.auth(root, t) + b.gap()
    t = b.db("SELECT", "profiles", root, t, _lognormal_ns(rng, 6, 0.4)) + b.gap()
    end, ok = b.llm(_pool_llm(w, t0, 550, 0.3, 1200, 180), root, t)
    b.finish_http(root, end + b.gap(), 200 if ok else 500)


_SUMMARY_TASK = "summaries.summarize_document"
_SUMMARY_QUEUE = "doc-summaries"  # the task's route: its queue, so the routing key
_SUMMARY_MAX_RETRIES = 3  # Celery's default Task.max_retries
_WORKER_HOST = "celery@summary-worker-1"


def _build_document(w: Workload, rng: random.Random, t0: int) -> None:
    """upload-api queues a Celery task; summary-worker runs it (Consumer, child of the Producer).

    The worker's OpenAI client has ``max_retries=0`` and leaves retries to Celery: a failed model
    call ends the run with state RETRY after ``self.retry(countdown=...)`` published the same task id
    again (that ``apply_async`` is a child of the failed run); the next run is its child.
    """
    b = _Trace(w, "upload-api", t0, rng)
    root, t = b.server("POST", "/documents", t0)
    t = b.auth(root, t) + b.gap()
    t = b.s3("PutObject", root, t, 35) + b.gap()
    task_id = _task_id(rng)
    producer, published = b.celery_publish(root, t, task_id, _SUMMARY_TASK, _SUMMARY_QUEUE)
    enqueue_ns = t
    b.finish_http(root, published + b.gap(), status=202)

    noisy = w.on("noisy_neighbour", enqueue_ns)
    # The worker's own batch pool (gpt-4.1-nano) normally; the shared chat pool under (b).
    wait_ns = int(rng.expovariate(1 / (7.0 if noisy else 4.0)) * _S)
    llm_median, llm_sigma = (9000.0, 0.45) if noisy else (6000.0, 0.35)
    llm = (
        _gpt_4o_mini(llm_median, llm_sigma, 6000, 400, p429=0.06)
        if noisy
        else _Llm(
            provider="openai",
            model="gpt-4.1-nano",
            server="api.openai.com",
            median_ms=llm_median,
            sigma=llm_sigma,
            input_tokens=6000,
            output_tokens=400,
            p429=0.015,
            p5xx=0.005,
        )
    )
    llm.max_retries = 0
    parent: Span = producer
    c0 = published + wait_ns
    for retries in range(_SUMMARY_MAX_RETRIES + 1):
        if c0 >= w.end_ns:
            return  # still queued (or waiting for its retry countdown) at the end: a pending job
        wb = _Trace(w, "summary-worker", c0, rng)
        run = wb.celery_run(parent, c0, _SUMMARY_TASK, _SUMMARY_QUEUE, task_id, _WORKER_HOST, retries)
        t = wb.s3("GetObject", run, c0 + wb.gap(), 30) + wb.gap()
        t, ok = wb.llm(llm, run, t)
        t += wb.gap()
        if ok:
            t = wb.db("INSERT", "summaries", run, t, _lognormal_ns(rng, 5, 0.4)) + wb.gap()
            run.set_attribute("celery.state", "SUCCESS")
            run.end(end_time=t)
            return
        error = f"{wb.last_error}('provider error')"
        if retries == _SUMMARY_MAX_RETRIES:
            # self.retry(exc=...) past max_retries re-raises the exception: the task fails.
            run.set_attribute("celery.state", "FAILURE")
            run.add_event(
                "exception",
                {"exception.type": wb.last_error, "exception.message": "provider error"},
                timestamp=t,
            )
            run.set_status(Status(StatusCode.ERROR, error))
            run.end(end_time=t)
            return
        countdown_s = 15 * 2**retries
        run.set_attribute("celery.retry.reason", f"Retry in {countdown_s}s: {error}")
        parent, published = wb.celery_publish(run, t, task_id, _SUMMARY_TASK, _SUMMARY_QUEUE)
        run.set_attribute("celery.state", "RETRY")
        run.end(end_time=published + wb.gap())
        # The message waits out its ETA, then for a free worker.
        c0 = published + countdown_s * _S + int(rng.expovariate(2.0) * _S)


_DIGEST_TASK = "digests.summarize_batch"
_DIGEST_QUEUE = "digests"
_DIGEST_HOST = "celery@digest-worker-1"
# The function both paths call (its code attributes, as a manual span with them records it).
_DIGEST_FUNCTION = ("summarize_document", "digests.summaries")
_DIGEST_NIGHTLY = 120  # documents a day, all in one nightly run when nothing drifts


def _digest_schedule(w: Workload) -> Iterator[int]:
    """When Celery beat starts digest-worker's job: nightly at 03:00 into each simulated day; under
    (g) nightly on the first day, then hourly (at five past) from the second day on."""
    hour = 3600 * _S
    drifting = "batch_drift" in w.scenarios
    day = 0
    while True:
        base = w.start_ns + day * DAY_NS
        if drifting and day >= 1:
            yield from (base + h * hour + 300 * _S for h in range(24))
        else:
            yield base + 3 * hour
        day += 1


def _digest_llm() -> _Llm:
    return _Llm(
        provider="openai",
        model="gpt-4.1-nano",
        server="api.openai.com",
        median_ms=900.0,
        sigma=0.3,
        input_tokens=1500,
        output_tokens=200,
    )


def _summarize_document(b: _Trace, parent: Span, t: int, *, bad: bool = False) -> int:
    """``summarize_document``: the one function the batch job and (g)'s endpoint share; its span
    carries the code attributes, and the model call it makes. A ``bad`` document (its text not
    extracted yet) raises before the model call: the span records the exception."""
    name, namespace = _DIGEST_FUNCTION
    span = b.start(
        name,
        t,
        parent=parent,
        attributes={"code.function.name": name, "code.namespace": namespace},
    )
    t = b.db("SELECT", "documents", span, t + b.gap(), _lognormal_ns(b.rng, 4, 0.4)) + b.gap()
    if bad:
        message = "document has no extracted text yet"
        span.add_event(
            "exception", {"exception.type": "ValueError", "exception.message": message}, timestamp=t
        )
        span.set_status(Status(StatusCode.ERROR, f"ValueError: {message}"))
        span.end(end_time=t)
        return t + b.gap()
    end, _ = b.llm(_digest_llm(), span, t, must_succeed=True)
    span.end(end_time=end + b.gap())
    return end + 2 * b.gap()


# Under (g), on the last day, this share of the runs meets a document whose text is not extracted
# yet: the task calls self.retry() and the retry summarises the whole batch again.
_DIGEST_BAD_BATCH = 0.25
_DIGEST_RETRY_S = 60  # self.retry(countdown=60)


def _build_digest_run(w: Workload, rng: random.Random, t0: int) -> None:
    """One run of digest-worker's scheduled Celery task, ``run/digests.summarize_batch``: Celery beat
    publishes from a process without tracing, so the worker's Consumer span is its trace's root. The
    task records its batch size (``messaging.batch.message_count``; Celery sets none) and summarises
    each document in turn. Under (g) the nightly batch becomes hourly runs of 5, then of 3 on the
    last day, when a quarter of the runs hit a document not ready yet: the task retries itself
    (``self.retry``: the same task id published again under the failed run, state RETRY) and the
    retry summarises the whole batch again, the documents already done included."""
    day = (t0 - w.start_ns) // DAY_NS
    drifting = "batch_drift" in w.scenarios
    items = _DIGEST_NIGHTLY
    if drifting and day >= 1:
        items = 5 if day == 1 else 3
    b = _Trace(w, "digest-worker", t0, rng)
    task_id = _task_id(rng)
    bad = rng.randrange(items) if drifting and day >= 2 and rng.random() < _DIGEST_BAD_BATCH else None
    run = b.celery_run(None, t0, _DIGEST_TASK, _DIGEST_QUEUE, task_id, _DIGEST_HOST)
    run.set_attribute("messaging.batch.message_count", items)
    t = t0 + b.gap()
    for i in range(items):
        t = _summarize_document(b, run, t, bad=i == bad)
        if i == bad:
            break
    if bad is None:
        run.set_attribute("celery.state", "SUCCESS")
        run.end(end_time=t)
        return
    error = "ValueError('document has no extracted text yet')"
    run.set_attribute("celery.retry.reason", f"Retry in {_DIGEST_RETRY_S}s: {error}")
    producer, published = b.celery_publish(run, t, task_id, _DIGEST_TASK, _DIGEST_QUEUE)
    run.set_attribute("celery.state", "RETRY")
    run.end(end_time=published + b.gap())
    c0 = published + _DIGEST_RETRY_S * _S + int(rng.expovariate(2.0) * _S)
    if c0 >= w.end_ns:
        return  # the retry is still waiting at the end
    rb = _Trace(w, "digest-worker", c0, rng)
    retry = rb.celery_run(producer, c0, _DIGEST_TASK, _DIGEST_QUEUE, task_id, _DIGEST_HOST, retries=1)
    retry.set_attribute("messaging.batch.message_count", items)
    t = c0 + rb.gap()
    for _ in range(items):
        t = _summarize_document(rb, retry, t)
    retry.set_attribute("celery.state", "SUCCESS")
    retry.end(end_time=t)


def _build_digest_request(w: Workload, rng: random.Random, t0: int) -> None:
    """(g) digest-api POST /summaries/now, from the last day: the batch job's summarize_document
    called synchronously for one document while the user waits."""
    if not w.on("batch_drift", t0):
        return
    b = _Trace(w, "digest-api", t0, rng)
    root, t = b.server("POST", "/summaries/now", t0)
    t = b.auth(root, t) + b.gap()
    t = _summarize_document(b, root, t)
    b.finish_http(root, t)


def _build_search(w: Workload, rng: random.Random, t0: int) -> None:
    """search-api GET /search: embeddings + SELECT documents; under (d) the query slows down."""
    b = _Trace(w, "search-api", t0, rng)
    root, t = b.server("GET", "/search", t0)
    t = b.auth(root, t) + b.gap()
    t = b.cache(root, t) + b.gap()
    embeddings = _Llm(
        provider="openai",
        model="text-embedding-3-small",
        server="api.openai.com",
        median_ms=60,
        sigma=0.3,
        input_tokens=40,
        output_tokens=0,
        operation="embeddings",
    )
    end, ok = b.llm(embeddings, root, t)
    t = end + b.gap()
    base = rng.lognormvariate(math.log(25), 0.5)
    if w.on("internal_regression", t0):
        # The planner switched to a sequential scan: an order of magnitude slower, heavier tail.
        query_ms = base * 14 * rng.lognormvariate(0, 0.25)
    else:
        rng.lognormvariate(0, 0.25)
        query_ms = base
    t = b.db("SELECT", "documents", root, t, int(query_ms * _MS)) + b.gap()
    t = b.leaf("rerank", t, _lognormal_ns(rng, 15, 0.3), root, attributes={"rerank.top_k": 20}) + b.gap()
    b.finish_http(root, t, 200 if ok else 500)


_ESCALATION_QUEUE = "ticket-escalations"


def _build_support(w: Workload, rng: random.Random, t0: int) -> None:
    """support-bot POST /reply: retrieval + chat claude-sonnet-4; under (e) the provider slows.

    One reply in ten is escalated to a human through a RabbitMQ queue instrumented with the newer
    messaging conventions: ``send`` Producer here, ``process`` Consumer in escalation-router's own
    trace, joined by a span link.
    """
    b = _Trace(w, "support-bot", t0, rng)
    root, t = b.server("POST", "/reply", t0)
    t = (
        b.leaf(
            "retrieval tickets",
            t,
            _lognormal_ns(rng, 45, 0.4),
            root,
            attributes={"gen_ai.operation.name": "retrieval", "gen_ai.data_source.id": "tickets"},
        )
        + b.gap()
    )
    slow = w.on("llm_slowdown", t0)
    llm = _Llm(
        provider="anthropic",
        model="claude-sonnet-4",
        server="api.anthropic.com",
        median_ms=700,
        sigma=0.3,
        input_tokens=2500,
        output_tokens=300,
        # About 300 ms to the first token and 1.3 ms per output token; under (e) each token takes
        # five times as long, the first one does not.
        ttft_ms=300,
        ms_per_token=1.33 * (5.5 if slow else 1.0),
        token_sigma=0.35 if slow else 0.15,
    )
    end, ok = b.llm(llm, root, t)
    t = end + b.gap()
    t = b.db("INSERT", "replies", root, t, _lognormal_ns(rng, 4, 0.4)) + b.gap()
    escalate = rng.random() < 0.1
    if escalate:
        t = _escalate(w, b, rng, root, t) + b.gap()
    b.finish_http(root, t, 200 if ok else 500)


def _build_draft(w: Workload, rng: random.Random, t0: int) -> None:
    """writer-api POST /draft: a streamed chat gpt-4o call (util-genai records its time to first
    chunk) relayed to the user as it streams; under (h) release 3.1.0 sends three times the prompt."""
    b = _Trace(w, "writer-api", t0, rng)
    root, t = b.server("POST", "/draft", t0)
    t = b.auth(root, t) + b.gap()
    t = b.db("SELECT", "documents", root, t, _lognormal_ns(rng, 6, 0.4)) + b.gap()
    grown = w.on("prompt_growth", t0)
    llm = _Llm(
        provider="openai",
        model="gpt-4o",
        server="api.openai.com",
        median_ms=1600,
        sigma=0.3,
        input_tokens=1500 * (3 if grown else 1),
        output_tokens=120,
        stream=True,
        # The first token's median at the call's input tokens: 600 ms at 1,500; at three times the
        # prompt 40% of it stays fixed and 60% (prefill) triples.
        ttft_ms=600 * ((0.4 + 0.6 * 3) if grown else 1.0),
        ms_per_token=8.0,
    )
    # The handler returns a StreamingResponse: its headers go out now, its body as the answer streams
    # (the body's generator makes the call once the response start is sent).
    sent = t
    end, ok = b.llm(llm, root, t + int(0.1 * _MS))
    t = end + b.gap()
    first = b.first_chunk_ns
    b.finish_http(root, t, 200 if ok else 500, stream=(sent, first) if ok and first is not None else None)


def _escalate(w: Workload, b: _Trace, rng: random.Random, root: Span, t: int) -> int:
    message_id = f"{rng.getrandbits(64):016x}"
    attrs = {
        "messaging.system": "rabbitmq",
        "messaging.destination.name": _ESCALATION_QUEUE,
        "messaging.rabbitmq.destination.routing_key": _ESCALATION_QUEUE,
        "messaging.message.id": message_id,
    }
    producer = b.start(
        f"send {_ESCALATION_QUEUE}",
        t,
        parent=root,
        kind=SpanKind.PRODUCER,
        attributes={**attrs, "messaging.operation.type": "send", "messaging.operation.name": "send"},
    )
    end = t + _uniform_ns(rng, 1, 3)
    producer.end(end_time=end)
    c0 = t + _lognormal_ns(rng, 300, 0.6)
    if c0 >= w.end_ns:
        return end  # still queued at the end of the simulated period
    cb = _Trace(w, "escalation-router", c0, rng)
    consumer = cb.start(
        f"process {_ESCALATION_QUEUE}",
        c0,
        kind=SpanKind.CONSUMER,
        attributes={**attrs, "messaging.operation.type": "process", "messaging.operation.name": "process"},
        links=[Link(producer.get_span_context())],
    )
    ct = cb.db("SELECT", "on_call", consumer, c0 + cb.gap(), _lognormal_ns(rng, 5, 0.4)) + cb.gap()
    ct = cb.db("UPDATE", "tickets", consumer, ct, _lognormal_ns(rng, 4, 0.4)) + cb.gap()
    consumer.end(end_time=ct)
    return end


_CLAIMS_HOPS: tuple[tuple[str, str, float, int, int], ...] = (
    # (kind, model or tool, median ms, input tokens, output tokens)
    ("llm", "gpt-4o", 1400, 2200, 350),
    ("tool", "lookup_policy", 120, 0, 0),
    ("llm", "o4-mini", 2600, 3000, 600),
    ("tool", "fetch_claim_history", 200, 0, 0),
    ("llm", "gpt-4.1", 1800, 4000, 500),
)
_CLAIMS_CALLS = 3  # the agent gives each LLM hop up to three calls


def _build_claims(w: Workload, rng: random.Random, t0: int) -> None:
    """agent-runner's claims-triage workflow: streamed LLM hops, two tool hops (c).

    Inside each call the SDK retries 429s, 5xx and timeouts (HTTP attempt children); when a call
    still fails (retries exhausted, or its stream stalled) the agent waits and calls the hop again:
    a same-name sibling after the failed one. Under the storm the provider throttles a fifth of the
    attempts and overloaded streams stall, so attempts and billed tokens multiply.
    """
    b = _Trace(w, "agent-runner", t0, rng)
    genai = b.scopes.genai
    root = b.start(
        "invoke_workflow claims-triage",
        t0,
        attributes={"gen_ai.operation.name": "invoke_workflow", "gen_ai.workflow.name": "claims-triage"},
        tracer=genai,
    )
    storm = w.on("retry_storm", t0)
    t = t0 + b.gap()
    for kind, what, median_ms, in_tok, out_tok in _CLAIMS_HOPS:
        if kind == "tool":
            t = (
                b.leaf(
                    f"execute_tool {what}",
                    t,
                    _lognormal_ns(rng, median_ms, 0.4),
                    root,
                    attributes={
                        "gen_ai.operation.name": "execute_tool",
                        "gen_ai.tool.name": what,
                        "gen_ai.tool.type": "function",
                    },
                    tracer=genai,
                )
                + b.gap()
            )
            continue
        llm = _Llm(
            provider="openai",
            model=what,
            server="api.openai.com",
            median_ms=median_ms,
            sigma=0.35,
            input_tokens=in_tok,
            output_tokens=out_tok,
            # A few throttled attempts always; the storm throttles a fifth of them, overloads the
            # backends (5xx, requests that time out before answering) and stalls streams.
            p429=0.20 if storm else 0.02,
            p5xx=0.03 if storm else 0.003,
            p_timeout=0.03 if storm else 0.0,
            stream=True,
            p_stall=0.10 if storm else 0.0,
        )
        for call in range(_CLAIMS_CALLS):
            # The demo keeps the last call successful so every run has all five hops.
            end, ok = b.llm(llm, root, t, must_succeed=call == _CLAIMS_CALLS - 1)
            t = end + b.gap()
            if ok:
                break
            t += int(rng.uniform(1.0, 3.0) * _S)  # the agent's own pause before calling again
    root.end(end_time=t)


_NOTES_TASK = "notes.summarize_notes"
_NOTES_QUEUE = "notes-summaries"
_NOTES_WORKER_HOST = "celery@notes-worker-1"
_NOTES_USERS = 4000  # accounts that summarise notes, equally active
_NOTES_STAFF = 120  # the first ones are the team's own (internal users: 3 % of requests)
# The rollout's stages, in hash buckets of 100 on the async variant (staff aside): 1 % on the first
# simulated day, 10 % on the baseline day, 28 % on the current day (with staff, ~30 % of requests).
_NOTES_BUCKETS = (1, 10, 28)


def _notes_llm() -> _Llm:
    return _Llm(
        provider="openai",
        model="gpt-4.1-mini",
        server="api.openai.com",
        median_ms=1500,
        sigma=0.35,
        input_tokens=5000,
        output_tokens=450,
    )


def _notes_variant(w: Workload, t0: int, user: int, targeting_key: str) -> str | None:
    """The variant the flag gives this user at ``t0`` (None while the scenario is off: no flag).

    flagd's targeting: staff always get the async variant, everyone else is bucketed by a sticky hash
    of flag key and targeting key (so a user keeps a variant as the slice grows).
    """
    if "hot_cold_migration" not in w.scenarios:
        return None
    flag = _NOTES_FLAG
    if user < _NOTES_STAFF:
        return flag.treatment
    if w.on("hot_cold_migration", t0):
        buckets = _NOTES_BUCKETS[2]
    elif t0 >= w.change_ns - DAY_NS:
        buckets = _NOTES_BUCKETS[1]
    else:
        buckets = _NOTES_BUCKETS[0]
    bucket = zlib.crc32(f"{flag.key}{targeting_key}".encode()) % 100
    return flag.treatment if bucket < buckets else flag.control


def _build_notes(w: Workload, rng: random.Random, t0: int) -> None:
    """notes-api POST /summarize, being moved off the hot path behind a flag (f).

    The sync variant (control, and the whole service while the scenario is off) calls chat
    gpt-4.1-mini inside the request. The async variant records the job, publishes a Celery task and
    answers 202 at once; notes-worker runs it seconds later (``run`` Consumer, a child of the
    ``apply_async`` Producer in the same trace) with the same model call, and the UI gets the summary
    pushed when the run ends. The flag's evaluation is a ``feature_flag.evaluation`` event on the
    Server span, written as OpenFeature's OpenTelemetry hook writes it.
    """
    b = _Trace(w, "notes-api", t0, rng)
    root, t = b.server("POST", "/summarize", t0)
    t = b.auth(root, t) + b.gap()
    user = rng.randrange(_NOTES_USERS)
    targeting_key = f"user-{user:05d}"
    variant = _notes_variant(w, t0, user, targeting_key)
    if variant is not None:
        t += _uniform_ns(rng, 0.02, 0.1)  # an in-process flagd evaluation
        b.flag_evaluation(root, t, _NOTES_FLAG, variant, "targeting_match", targeting_key)
        t += b.gap()
    if variant != _NOTES_FLAG.treatment:
        t = b.db("SELECT", "notes", root, t, _lognormal_ns(rng, 6, 0.4)) + b.gap()
        end, ok = b.llm(_notes_llm(), root, t)
        t = end + b.gap()
        if ok:
            t = b.db("INSERT", "summaries", root, t, _lognormal_ns(rng, 4, 0.4)) + b.gap()
        b.finish_http(root, t, 200 if ok else 500)
        return

    task_id = _task_id(rng)
    t = b.db("INSERT", "summary_jobs", root, t, _lognormal_ns(rng, 4, 0.4)) + b.gap()
    producer, published = b.celery_publish(root, t, task_id, _NOTES_TASK, _NOTES_QUEUE)
    b.finish_http(root, published + b.gap(), status=202)

    # Waiting for a free worker (a pool sized for the slice: no backlog), then the same model call.
    c0 = published + int(rng.expovariate(1 / 1.5) * _S)
    if c0 >= w.end_ns:
        return  # still queued at the end of the simulated period
    wb = _Trace(w, "notes-worker", c0, rng)
    run = wb.celery_run(producer, c0, _NOTES_TASK, _NOTES_QUEUE, task_id, _NOTES_WORKER_HOST)
    t = wb.db("SELECT", "notes", run, c0 + wb.gap(), _lognormal_ns(rng, 6, 0.4)) + wb.gap()
    t, ok = wb.llm(_notes_llm(), run, t)
    t += wb.gap()
    if ok:
        t = wb.db("UPDATE", "summary_jobs", run, t, _lognormal_ns(rng, 4, 0.4)) + wb.gap()
        run.set_attribute("celery.state", "SUCCESS")
    else:
        # The SDK's own retries ran out: the task raises and Celery marks it failed.
        run.set_attribute("celery.state", "FAILURE")
        run.add_event(
            "exception",
            {"exception.type": wb.last_error, "exception.message": "provider error"},
            timestamp=t,
        )
        run.set_status(Status(StatusCode.ERROR, f"{wb.last_error}('provider error')"))
    run.end(end_time=t)


def generate(
    scenarios: Iterable[Scenario] | None = None,
    scale: float = 1.0,
    seed: int = 7,
    end: datetime | None = None,
    *,
    days: int = 3,
    batch_size: int = 512,
) -> Iterator[list[ReadableSpan]]:
    """The traffic as batches of SDK ``ReadableSpan``: ``Workload(...).batches(batch_size)``."""
    return Workload(scenarios, scale=scale, seed=seed, end=end, days=days).batches(batch_size)


# ---------------------------------------------------------------------------------------------
# Export: through any SDK SpanExporter (OTLP/HTTP to a receiver), or to OTLP files.
# ---------------------------------------------------------------------------------------------


@dataclass
class ExportStats:
    """What an export did: spans and batches sent, batches the exporter reported as failed."""

    spans: int = 0
    batches: int = 0
    failed_batches: int = 0
    failed_spans: int = 0
    seconds: float = 0.0

    @property
    def spans_per_s(self) -> float:
        return self.spans / self.seconds if self.seconds > 0 else 0.0


def export_to_exporter(
    workload: Workload,
    exporter: SpanExporter | Callable[[], SpanExporter],
    *,
    batch_size: int = 512,
    progress: Callable[[int], None] | None = None,
    concurrency: int = 1,
) -> ExportStats:
    """Sends every batch through an SDK exporter (its own retry logic applies); never raises for a
    failed batch, it counts it, like the SDK's processors do.

    With ``concurrency > 1``, ``exporter`` is a factory: each sender thread gets its own exporter
    (an HTTP session is not shared across threads) and up to ``2 * concurrency`` batches are in
    flight, so building spans overlaps with the receiver's work instead of waiting for it.
    """
    if concurrency < 1:
        raise GeneratorError(f"concurrency must be at least 1, got {concurrency}")
    stats = ExportStats()
    began = time.perf_counter()

    def account(batch: Sequence[ReadableSpan], result: SpanExportResult) -> None:
        stats.batches += 1
        stats.spans += len(batch)
        if result is not SpanExportResult.SUCCESS:
            stats.failed_batches += 1
            stats.failed_spans += len(batch)

    if concurrency == 1:
        single = exporter if isinstance(exporter, SpanExporter) else exporter()
        for batch in workload.batches(batch_size, progress):
            account(batch, single.export(batch))
    else:
        if isinstance(exporter, SpanExporter):
            raise GeneratorError("concurrent export needs an exporter factory, one exporter per thread")
        factory = exporter
        local = threading.local()
        made: list[SpanExporter] = []
        made_lock = threading.Lock()

        def send(batch: list[ReadableSpan]) -> SpanExportResult:
            mine = getattr(local, "exporter", None)
            if mine is None:
                mine = local.exporter = factory()
                with made_lock:
                    made.append(mine)
            return mine.export(batch)

        in_flight: deque[tuple[list[ReadableSpan], Future[SpanExportResult]]] = deque()
        with ThreadPoolExecutor(concurrency, thread_name_prefix="tailwatch-export") as pool:
            for batch in workload.batches(batch_size, progress):
                in_flight.append((batch, pool.submit(send, batch)))
                while len(in_flight) > 2 * concurrency:
                    done_batch, future = in_flight.popleft()
                    account(done_batch, future.result())
            while in_flight:
                done_batch, future = in_flight.popleft()
                account(done_batch, future.result())
        for one in made:
            one.shutdown()
    stats.seconds = time.perf_counter() - began
    return stats


def export_otlp_http(
    workload: Workload,
    endpoint: str,
    *,
    headers: Mapping[str, str] | None = None,
    timeout_s: float = 30.0,
    batch_size: int = 512,
    progress: Callable[[int], None] | None = None,
    concurrency: int = 1,
) -> ExportStats:
    """Exports over OTLP/HTTP (protobuf) with the official ``OTLPSpanExporter``.

    ``endpoint`` is the full traces URL, e.g. ``http://127.0.0.1:4318/v1/traces``.
    """
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    def make() -> SpanExporter:
        return OTLPSpanExporter(endpoint=endpoint, headers=dict(headers or {}), timeout=timeout_s)

    if concurrency > 1:
        return export_to_exporter(
            workload, make, batch_size=batch_size, progress=progress, concurrency=concurrency
        )
    exporter = make()
    try:
        return export_to_exporter(workload, exporter, batch_size=batch_size, progress=progress)
    finally:
        exporter.shutdown()


def file_format_for(path: Path) -> FileFormat:
    """``.jsonl`` / ``.jsonl.gz`` are JSON lines; anything else is protobuf."""
    name = path.name.lower().removesuffix(".gz")
    return "jsonl" if name.endswith((".jsonl", ".ndjson", ".json")) else "protobuf"


def _hex_ids(node: Any) -> None:
    # MessageToDict renders bytes as base64; OTLP/JSON wants trace and span ids as hex.
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("traceId", "spanId", "parentSpanId") and isinstance(value, str):
                node[key] = base64.b64decode(value).hex()
            else:
                _hex_ids(value)
    elif isinstance(node, list):
        for item in node:
            _hex_ids(item)


def write_otlp_file(
    workload: Workload,
    path: Path,
    *,
    file_format: FileFormat | None = None,
    batch_size: int = 512,
    progress: Callable[[int], None] | None = None,
) -> ExportStats:
    """Writes the traffic as OTLP: ``protobuf`` is one ``ExportTraceServiceRequest`` (batches are
    concatenated, which protobuf reads as one message with every ``resource_spans``); ``jsonl`` is
    one OTLP/JSON request per line, as the Collector's file exporter writes. ``.gz`` compresses."""
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    fmt = file_format or file_format_for(path)
    if fmt not in FILE_FORMATS:
        raise GeneratorError(f"unknown file format {fmt!r}; allowed: {', '.join(FILE_FORMATS)}")
    stats = ExportStats()
    began = time.perf_counter()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        raw: io.BufferedIOBase = (
            gzip.open(path, "wb", compresslevel=3)  # noqa: SIM115 - closed by the with below
            if path.suffix == ".gz"
            else open(path, "wb")  # noqa: SIM115
        )
    except OSError as exc:
        raise GeneratorError(f"cannot write {path}: {exc.strerror or exc}") from exc
    with raw:
        for batch in workload.batches(batch_size, progress):
            request = encode_spans(batch)
            if fmt == "protobuf":
                raw.write(request.SerializeToString())
            else:
                body = MessageToDict(request, use_integers_for_enums=True)
                _hex_ids(body)
                raw.write(json.dumps(body, separators=(",", ":")).encode() + b"\n")
            stats.batches += 1
            stats.spans += len(batch)
    stats.seconds = time.perf_counter() - began
    return stats
