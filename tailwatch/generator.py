"""A workload generator: days of an AI product's traffic, made with the real OpenTelemetry SDK.

Every span is created by ``opentelemetry-sdk`` tracers (one ``TracerProvider`` per service and
release, so ``service.name``/``service.version`` travel as resources) with explicit start and end
times, on a compressed clock: three simulated days end at ``end`` and take seconds to produce.
The spans follow the semantic conventions tailwatch reads (REFERENCE.md section 3): GenAI client
spans ``chat {model}`` with provider, model and token usage; one HTTP client span per attempt with
``http.request.resend_count`` on resends and ``429`` attempts marked with ``error.type``; a queue
with Producer/Consumer spans joined by a span link; an ``invoke_workflow`` agent run with LLM and
``execute_tool`` hops; users who abandon (``499``) once a response gets slow.

The traffic (all numbers per simulated day at ``scale=1``)::

    chat-api       POST /chat       2400  auth, cache, retrieval, db; from 1.5.0 a sync LLM call (a)
    assistant-api  POST /ask        1600  one sync chat gpt-4o-mini call (the shared chat pool) (b)
    upload-api     POST /documents  1000  -> queue doc-summaries -> summary-worker (long LLM call)
    search-api     GET /search      1600  auth, cache, embeddings, SELECT documents (d)
    support-bot    POST /reply      1200  retrieval, chat claude-sonnet-4 (anthropic) (e)
    agent-runner   claims-triage     400  invoke_workflow: 3 LLM hops, 2 tool hops (c)

The timeline: the simulated period is ``[end - 3d, end)``; every scenario changes the system at
``end - 1d``, so the last day is each scenario's *current* window and the day before it a clean
*baseline* (:class:`Timeline`). Scenarios that would interfere live on different services, and each
service draws its randomness from its own seeded stream, so switching one scenario off leaves the
other services' traffic unchanged and removes exactly that anomaly.

Usage::

    from tailwatch.generator import Workload
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

from collectors.errors import TailwatchError
from tailwatch import __version__

__all__ = [
    "SCENARIOS",
    "SCENARIO_INFO",
    "ExportStats",
    "FileFormat",
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
    "release_coupling", "noisy_neighbour", "retry_storm", "internal_regression", "llm_slowdown"
]
SCENARIOS: tuple[Scenario, ...] = get_args(Scenario)
FileFormat = Literal["protobuf", "jsonl"]
FILE_FORMATS: tuple[FileFormat, ...] = get_args(FileFormat)

DAY_NS = 86_400 * 10**9
_MS = 1_000_000
_S = 10**9


class GeneratorError(TailwatchError):
    """A bad generator option (unknown scenario, scale out of range, unwritable file)."""


@dataclass(frozen=True)
class ScenarioInfo:
    """What a scenario does and which alert must catch it (the demo's ground truth)."""

    name: Scenario
    letter: str
    title: str
    # Where the anomaly lives: a hot-path (service, operation), a queue or a workflow.
    service: str
    operation: str
    # The rule kind expected to fire and the `cause` annotation it must carry (None: the rule kind
    # is the diagnosis, as for retry amplification, whose alerts carry no LLM/internal verdict).
    alert_kind: str
    cause: str | None
    view: str
    story: str


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
        "the provider throttles the claims-triage models: every LLM hop retries (one span per attempt, "
        "http.request.resend_count), attempts and billed tokens multiply",
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
        "anthropic's claude-sonnet-4 gets slower; support-bot's code and traffic are unchanged",
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
        end = end.astimezone(UTC) if end.tzinfo else end.replace(tzinfo=UTC)
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


class _Tracers:
    """One SDK TracerProvider per (service, version): the resource is per provider in OpenTelemetry."""

    def __init__(self, processor: SpanProcessor, seed: int) -> None:
        self._processor = processor
        self._ids = _SeededIds(seed)
        self._tracers: dict[tuple[str, str], Tracer] = {}
        self._providers: list[TracerProvider] = []

    def get(self, service: str, version: str) -> Tracer:
        key = (service, version)
        tracer = self._tracers.get(key)
        if tracer is None:
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
            tracer = provider.get_tracer("tailwatch.generator", __version__)
            self._tracers[key] = tracer
        return tracer


def _lognormal_ns(rng: random.Random, median_ms: float, sigma: float) -> int:
    return int(rng.lognormvariate(math.log(median_ms), sigma) * _MS)


def _uniform_ns(rng: random.Random, lo_ms: float, hi_ms: float) -> int:
    return int(rng.uniform(lo_ms, hi_ms) * _MS)


def abandon_probability(latency_ms: float, cliff_ms: float = 2000.0) -> float:
    """Users mostly wait until the response passes ``cliff_ms``, then leave quickly (a steep logistic)."""
    return 0.004 + 0.55 / (1.0 + math.exp(-(latency_ms - cliff_ms) / 120.0))


@dataclass
class _Llm:
    provider: str
    model: str
    server: str
    median_ms: float
    sigma: float
    input_tokens: int
    output_tokens: int
    p429: float = 0.0
    p_timeout: float = 0.0  # failures after the prompt was sent: billed input, partial output
    timeout_ms: float = 0.0
    max_resends: int = 4


class _Trace:
    """Builds one trace with the SDK: children are laid out one after the other from a cursor."""

    def __init__(self, tracer: Tracer, rng: random.Random) -> None:
        self.tracer = tracer
        self.rng = rng

    def start(
        self,
        name: str,
        start_ns: int,
        *,
        parent: Span | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Mapping[str, Any] | None = None,
        links: Sequence[Link] = (),
    ) -> Span:
        ctx = trace.set_span_in_context(parent) if parent is not None else _EMPTY
        span = self.tracer.start_span(
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
    ) -> int:
        span = self.start(name, start_ns, parent=parent, kind=kind, attributes=attributes)
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
        end = start_ns + max(duration_ns, 1000)
        span.end(end_time=end)
        return end

    def gap(self) -> int:
        return int(self.rng.uniform(0.05, 0.4) * _MS)

    def llm(self, llm: _Llm, parent: Span, start_ns: int, operation: str = "chat") -> int:
        """A model call, one Client span per HTTP attempt; 429s back off and resend."""
        rng = self.rng
        t = start_ns
        name = f"{operation} {llm.model}"
        for attempt in range(llm.max_resends + 1):
            attrs: dict[str, Any] = {
                "gen_ai.operation.name": operation,
                "gen_ai.provider.name": llm.provider,
                "gen_ai.request.model": llm.model,
                "server.address": llm.server,
                "server.port": 443,
            }
            if attempt:
                attrs["http.request.resend_count"] = attempt
            last = attempt == llm.max_resends
            roll = rng.random()
            if not last and roll < llm.p429:
                attrs["http.response.status_code"] = 429
                attrs["error.type"] = "429"
                end = self.leaf(
                    name,
                    t,
                    _uniform_ns(rng, 20, 90),
                    parent,
                    kind=SpanKind.CLIENT,
                    attributes=attrs,
                    error="429 Too Many Requests",
                )
                # Exponential backoff with jitter, as the provider SDKs do (Retry-After ~1 s).
                t = end + int(min(8.0, 0.5 * 2**attempt) * rng.uniform(0.5, 1.0) * _S)
                continue
            if not last and roll < llm.p429 + llm.p_timeout:
                attrs["error.type"] = "timeout"
                attrs["gen_ai.usage.input_tokens"] = llm.input_tokens
                attrs["gen_ai.usage.output_tokens"] = int(llm.output_tokens * rng.uniform(0.2, 0.8))
                end = self.leaf(
                    name,
                    t,
                    int(llm.timeout_ms * _MS),
                    parent,
                    kind=SpanKind.CLIENT,
                    attributes=attrs,
                    error="request timed out",
                )
                t = end + int(rng.uniform(0.2, 0.6) * _S)
                continue
            attrs["http.response.status_code"] = 200
            attrs["gen_ai.response.model"] = llm.model
            attrs["gen_ai.usage.input_tokens"] = int(llm.input_tokens * rng.uniform(0.7, 1.3))
            attrs["gen_ai.usage.output_tokens"] = int(llm.output_tokens * rng.uniform(0.6, 1.4))
            return self.leaf(
                name,
                t,
                _lognormal_ns(rng, llm.median_ms, llm.sigma),
                parent,
                kind=SpanKind.CLIENT,
                attributes=attrs,
            )
        raise AssertionError("the last attempt always succeeds")

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

    def finish_http(self, root: Span, end_ns: int, status: int = 200) -> None:
        """Ends a Server root; past the abandonment cliff users close the connection (499)."""
        latency_ms = (end_ns - _start_of(root)) / _MS
        if self.rng.random() < abandon_probability(latency_ms):
            status = 499
        root.set_attribute("http.response.status_code", status)
        root.end(end_time=end_ns)


def _start_of(span: Span) -> int:
    start = span.start_time
    assert start is not None
    return start


def _server_attrs(method: str, route: str) -> dict[str, Any]:
    return {
        "http.request.method": method,
        "http.route": route,
        "url.path": route,
        "url.scheme": "https",
        "server.address": "api.example.com",
    }


@dataclass
class _Source:
    """One kind of traffic: its rate, its own random stream and a function that builds one trace."""

    name: str
    per_day: float
    build: Callable[[Workload, random.Random, int], None]
    rng: random.Random = field(default_factory=random.Random)
    next_ns: int = 0


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
        ]
        for source in self._sources:
            # Each service has its own stream: switching a scenario off changes nothing elsewhere.
            source.rng = random.Random(f"{seed}:{source.name}")
            source.next_ns = self._start_ns + self._gap_ns(source, self._start_ns)

    # -- what the builders ask ---------------------------------------------------------------
    def on(self, scenario: Scenario, at_ns: int) -> bool:
        """True when ``scenario`` is selected and ``at_ns`` is in its current (changed) window."""
        return scenario in self.scenarios and at_ns >= self._change_ns

    def tracer(self, service: str, at_ns: int) -> Tracer:
        return self._tracers.get(service, self.version(service, at_ns))

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
        }[service]

    @property
    def end_ns(self) -> int:
        return self._end_ns

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
                    source.next_ns += self._gap_ns(source, source.next_ns)
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
    b = _Trace(w.tracer("chat-api", t0), rng)
    root = b.start("POST /chat", t0, kind=SpanKind.SERVER, attributes=_server_attrs("POST", "/chat"))
    t = b.auth(root, t0 + b.gap()) + b.gap()
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
    # Drawn whether or not the call is made, so switching (a) off leaves the stream unchanged.
    llm = _pool_llm(w, t0, 700, 0.4, 1800, 250)
    if w.on("release_coupling", t0):
        t = b.llm(llm, root, t) + b.gap()
    else:
        rng.random()
    t = b.db("INSERT", "messages", root, t, _lognormal_ns(rng, 4, 0.4)) + b.gap()
    b.finish_http(root, t)


def _build_assistant(w: Workload, rng: random.Random, t0: int) -> None:
    """assistant-api POST /ask: a synchronous call to the shared gpt-4o-mini pool (victim of b)."""
    b = _Trace(w.tracer("assistant-api", t0), rng)
    root = b.start("POST /ask", t0, kind=SpanKind.SERVER, attributes=_server_attrs("POST", "/ask"))
    t = b.auth(root, t0 + b.gap()) + b.gap()
    t = b.db("SELECT", "profiles", root, t, _lognormal_ns(rng, 6, 0.4)) + b.gap()
    t = b.llm(_pool_llm(w, t0, 550, 0.3, 1200, 180), root, t) + b.gap()
    b.finish_http(root, t)


def _build_document(w: Workload, rng: random.Random, t0: int) -> None:
    """upload-api enqueues a summary (Producer); summary-worker processes it (Consumer, linked)."""
    b = _Trace(w.tracer("upload-api", t0), rng)
    root = b.start(
        "POST /documents", t0, kind=SpanKind.SERVER, attributes=_server_attrs("POST", "/documents")
    )
    t = b.auth(root, t0 + b.gap()) + b.gap()
    t = (
        b.leaf(
            "PutObject",
            t,
            _lognormal_ns(rng, 35, 0.4),
            root,
            kind=SpanKind.CLIENT,
            attributes={"rpc.system": "aws-api", "rpc.service": "S3", "rpc.method": "PutObject"},
        )
        + b.gap()
    )
    message_id = f"{rng.getrandbits(64):016x}"
    producer = b.start(
        "doc-summaries send",
        t,
        parent=root,
        kind=SpanKind.PRODUCER,
        attributes={
            "messaging.system": "rabbitmq",
            "messaging.destination.name": "doc-summaries",
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
            "messaging.message.id": message_id,
        },
    )
    enqueue_ns = t
    t += _uniform_ns(rng, 1, 4)
    producer.end(end_time=t)
    b.finish_http(root, t + b.gap(), status=202)

    noisy = w.on("noisy_neighbour", enqueue_ns)
    # The worker's own batch pool (gpt-4.1-nano) normally; the shared chat pool under (b).
    wait_ns = int(rng.expovariate(1 / (7.0 if noisy else 4.0)) * _S)
    c0 = enqueue_ns + wait_ns
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
        )
    )
    if c0 >= w.end_ns:
        return  # still queued at the end of the simulated period: a pending job
    wb = _Trace(w.tracer("summary-worker", c0), rng)
    consumer = wb.start(
        "doc-summaries process",
        c0,
        kind=SpanKind.CONSUMER,
        attributes={
            "messaging.system": "rabbitmq",
            "messaging.destination.name": "doc-summaries",
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.message.id": message_id,
        },
        links=[Link(producer.get_span_context(), {"messaging.message.id": message_id})],
    )
    t = (
        wb.leaf(
            "GetObject",
            c0 + wb.gap(),
            _lognormal_ns(rng, 30, 0.4),
            consumer,
            kind=SpanKind.CLIENT,
            attributes={"rpc.system": "aws-api", "rpc.service": "S3", "rpc.method": "GetObject"},
        )
        + wb.gap()
    )
    t = wb.llm(llm, consumer, t) + wb.gap()
    t = wb.db("INSERT", "summaries", consumer, t, _lognormal_ns(rng, 5, 0.4)) + wb.gap()
    consumer.end(end_time=t)


def _build_search(w: Workload, rng: random.Random, t0: int) -> None:
    """search-api GET /search: embeddings + SELECT documents; under (d) the query slows down."""
    b = _Trace(w.tracer("search-api", t0), rng)
    root = b.start("GET /search", t0, kind=SpanKind.SERVER, attributes=_server_attrs("GET", "/search"))
    t = b.auth(root, t0 + b.gap()) + b.gap()
    t = b.cache(root, t) + b.gap()
    embeddings = _Llm(
        provider="openai",
        model="text-embedding-3-small",
        server="api.openai.com",
        median_ms=60,
        sigma=0.3,
        input_tokens=40,
        output_tokens=0,
    )
    t = b.llm(embeddings, root, t, operation="embeddings") + b.gap()
    base = rng.lognormvariate(math.log(25), 0.5)
    if w.on("internal_regression", t0):
        # The planner switched to a sequential scan: an order of magnitude slower, heavier tail.
        query_ms = base * 14 * rng.lognormvariate(0, 0.25)
    else:
        rng.lognormvariate(0, 0.25)
        query_ms = base
    t = b.db("SELECT", "documents", root, t, int(query_ms * _MS)) + b.gap()
    t = b.leaf("rerank", t, _lognormal_ns(rng, 15, 0.3), root, attributes={"rerank.top_k": 20}) + b.gap()
    b.finish_http(root, t)


def _build_support(w: Workload, rng: random.Random, t0: int) -> None:
    """support-bot POST /reply: retrieval + chat claude-sonnet-4; under (e) the provider slows."""
    b = _Trace(w.tracer("support-bot", t0), rng)
    root = b.start("POST /reply", t0, kind=SpanKind.SERVER, attributes=_server_attrs("POST", "/reply"))
    t = (
        b.leaf(
            "retrieval tickets",
            t0 + b.gap(),
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
        median_ms=700 * (2.4 if slow else 1.0),
        sigma=0.45 if slow else 0.3,
        input_tokens=2500,
        output_tokens=300,
    )
    t = b.llm(llm, root, t) + b.gap()
    t = b.db("INSERT", "replies", root, t, _lognormal_ns(rng, 4, 0.4)) + b.gap()
    b.finish_http(root, t)


_CLAIMS_HOPS: tuple[tuple[str, str, float, int, int], ...] = (
    # (kind, model or tool, median ms, input tokens, output tokens)
    ("llm", "gpt-4o", 1400, 2200, 350),
    ("tool", "lookup_policy", 120, 0, 0),
    ("llm", "o4-mini", 2600, 3000, 600),
    ("tool", "fetch_claim_history", 200, 0, 0),
    ("llm", "gpt-4.1", 1800, 4000, 500),
)


def _build_claims(w: Workload, rng: random.Random, t0: int) -> None:
    """agent-runner's claims-triage workflow: LLM hops retry on 429 (c), tool hops never do."""
    b = _Trace(w.tracer("agent-runner", t0), rng)
    root = b.start(
        "invoke_workflow claims-triage",
        t0,
        attributes={"gen_ai.operation.name": "invoke_workflow", "gen_ai.workflow.name": "claims-triage"},
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
            # A few throttled attempts always; the storm throttles a quarter of them and
            # overloaded requests time out after the prompt was billed.
            p429=0.25 if storm else 0.02,
            p_timeout=0.08 if storm else 0.0,
            timeout_ms=8000,
            max_resends=6,
        )
        t = b.llm(llm, root, t) + b.gap()
    root.end(end_time=t)


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
