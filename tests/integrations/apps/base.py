"""The scenario app every flavour runs: a claims-handling API with an LLM on its hot path.

One process holds everything a small production deployment spreads over a few: the FastAPI app
(served by uvicorn on loopback, instrumented by ``FastAPIInstrumentor``), an in-process Celery worker
(``CeleryInstrumentor``; broker ``memory://``), the OpenAI and Anthropic SDKs talking to the mock
providers of :mod:`tests.integrations.providers` through ``httpx2`` (``HTTPX2ClientInstrumentor``:
one CLIENT span per HTTP attempt), and an ``httpx`` client for an internal lookup
(``HTTPXClientInstrumentor``). The flavour adds its LLM instrumentor and its workflow span.

Endpoints (all ``POST``, JSON ``{"id": n}``):

* ``/chat`` — one chat completion on ``CHAT_MODEL`` (the mock throttles every 4th call once: the
  SDK retries inside the call). In the current phase the mock makes ``CHAT_MODEL`` slower: a
  provider slowdown (attribution: ``llm``).
* ``/agent`` — the ``claims-triage`` workflow span (made by the flavour's app code) around three
  sequential steps on ``AGENT_MODEL``: ``classify`` (an LLM call), ``extract fields`` (an app
  INTERNAL span around an LLM call whose answer fails validation on the first try for every 4th
  claim: the span ends in ERROR and the app runs the step again, so the failed try's tokens are
  spent twice) and ``decide`` (an LLM call). The mock throttles some calls once (SDK retries inside
  the call) and answers every 8th call with 500 on every attempt, so the SDK gives up and the app
  calls again once (an application-level retry: a same-name sibling after a failed one); when the
  second try fails too the request answers 502.
* ``/enqueue`` — enqueues the ``claims.summarize`` Celery task and returns at once; the task calls
  ``TASK_MODEL``; every 6th call fails (503) on every attempt and the task retries itself
  (``self.retry(countdown=0.05)``: the same task id runs again).
* ``/support`` — an app span ``load customer context`` (INTERNAL) around an internal HTTP lookup
  (``GET /internal/customers/{id}`` on this same app: a CLIENT span and a non-root SERVER span) and
  a ``time.sleep``, then an Anthropic ``messages.create`` on ``SUPPORT_MODEL``. In the current phase
  the sleep grows: an app slowdown (attribution: ``internal``).

The load driver is outside the traced system (like users' browsers): plain ``http.client``, so the
FastAPI SERVER span is each trace's root. After a warm-up (a few requests per endpoint, before both
windows: first calls pay for lazy imports and connections), two phases, ``baseline`` then
``current``, each ending once the queue is drained; ``run.json`` records the window bounds (ns,
whole microseconds) so that every span of a phase starts inside its window: baseline ``[t0, t1)``,
current ``[t1, t2)``.

Output in ``--out``: ``spans.jsonl`` (every span the SDK produced, from an ``InMemorySpanExporter``
beside the OTLP exporter) and ``run.json``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import BaseModel

from tests.integrations.providers import Every, FailurePlan, MockProviders, ModelScript

__all__ = [
    "AGENT_MODEL",
    "CHAT_MODEL",
    "QUEUE",
    "SERVICE_VERSION",
    "SUPPORT_MODEL",
    "TASK_MODEL",
    "WORKFLOW",
    "Flavour",
    "WorkflowFactory",
    "run",
    "span_record",
]

SERVICE_VERSION = "2.3.1"
CHAT_MODEL = "gpt-4o"
AGENT_MODEL = "gpt-4o-mini"
TASK_MODEL = "gpt-4.1-mini"
SUPPORT_MODEL = "claude-sonnet-4"
WORKFLOW = "claims-triage"
QUEUE = "claim-summaries"
TASK_NAME = "claims.summarize"

SCRIPTS: dict[str, ModelScript] = {
    CHAT_MODEL: ModelScript(
        latency_s=0.03,
        plan=FailurePlan(rules=(Every(4, (429,), offset=1),)),
        response_model="gpt-4o-2024-08-06",
    ),
    AGENT_MODEL: ModelScript(
        latency_s=0.015,
        plan=FailurePlan(rules=(Every(8, (500, 500, 500), offset=3), Every(5, (429,), offset=2))),
        response_model="gpt-4o-mini-2024-07-18",
    ),
    TASK_MODEL: ModelScript(latency_s=0.02, plan=FailurePlan(rules=(Every(6, (503, 503, 503), offset=2),))),
    SUPPORT_MODEL: ModelScript(
        latency_s=0.03,
        plan=FailurePlan(rules=(Every(6, (529,), offset=4),)),
        response_model="claude-sonnet-4-20250514",
    ),
}
CHAT_SLOWDOWN_S = 0.5  # CHAT_MODEL's latency in the current phase
INTERNAL_BASE_S = 0.01  # the sleep in /support's "load customer context"
INTERNAL_SLOWDOWN_S = 0.6  # … in the current phase
ENDPOINTS = ("/chat", "/agent", "/enqueue", "/support")

WorkflowFactory = Callable[[str], AbstractContextManager[Any]]


@dataclass(frozen=True)
class Flavour:
    """What a flavour module supplies: its name and service, its LLM instrumentation (called with
    the tracer provider, before any client exists) and the app code that opens the workflow span."""

    name: str
    service: str
    instrument: Callable[[TracerProvider], None]
    workflow: Callable[[TracerProvider], WorkflowFactory]
    # Anthropic: the SDK's own spans (anthropic ≥ 2 emits one CLIENT span per API call by default)
    # and/or Traceloop's AnthropicInstrumentor.
    anthropic_native: bool = True
    traceloop_anthropic: bool = False


# --- the span dump -----------------------------------------------------------------------------
def _value(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v


def span_record(span: ReadableSpan) -> dict[str, Any]:
    ctx = span.get_span_context()
    assert ctx is not None
    parent = span.parent
    return {
        "trace_id": format(ctx.trace_id, "032x"),
        "span_id": format(ctx.span_id, "016x"),
        "parent_span_id": format(parent.span_id, "016x") if parent is not None else "",
        "name": span.name,
        "kind": span.kind.name,
        "start_ns": span.start_time,
        "end_ns": span.end_time,
        "attributes": {k: _value(v) for k, v in (span.attributes or {}).items()},
        "status": span.status.status_code.name,
        "status_description": span.status.description or "",
        "links": [
            {
                "trace_id": format(link.context.trace_id, "032x"),
                "span_id": format(link.context.span_id, "016x"),
            }
            for link in span.links
        ],
        "events": [e.name for e in span.events],
        "resource": {k: _value(v) for k, v in span.resource.attributes.items()},
        "scope": span.instrumentation_scope.name if span.instrumentation_scope else "",
    }


def _now_us_ns() -> int:
    """Now, in ns, truncated to whole microseconds (Python datetimes carry µs)."""
    return time.time_ns() // 1000 * 1000


# --- the app -----------------------------------------------------------------------------------
class Claim(BaseModel):
    id: int


class ExtractionError(ValueError):
    pass


class _State:
    def __init__(self) -> None:
        self.internal_s = INTERNAL_BASE_S
        self.lock = threading.Lock()
        self.task_ids: list[str] = []


def _prompt(kind: str, claim: int, extra: int = 0) -> str:
    words = " ".join(f"w{(claim * 31 + i) % 97}" for i in range(5 + (claim * 7 + extra) % 13))
    return f"{kind} claim {claim}: {words}"


def _build(flavour: Flavour, tp: TracerProvider, providers: MockProviders, state: _State) -> tuple[Any, Any]:
    """The FastAPI app and the Celery app (clients created after instrumentation)."""
    import anthropic
    import httpx
    import openai
    from celery import Celery
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

    oai = openai.OpenAI(base_url=providers.openai_base_url, api_key="sk-test")  # max_retries: default 2
    claude = anthropic.Anthropic(
        base_url=providers.anthropic_base_url,
        api_key="sk-ant-test",
        open_telemetry={"traces": flavour.anthropic_native, "tracer_provider": tp},
    )
    tracer = tp.get_tracer("claims.app", SERVICE_VERSION)
    workflow = flavour.workflow(tp)
    self_url: dict[str, str] = {}
    lookup: dict[str, httpx.Client] = {}

    celery_app = Celery("claims", broker="memory://", backend="cache+memory://")
    celery_app.conf.update(
        broker_transport_options={"polling_interval": 0.01},
        task_default_queue=QUEUE,
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=False,
    )

    @celery_app.task(bind=True, name=TASK_NAME, max_retries=2)
    def summarize(self: Any, claim: int) -> int:
        try:
            r = oai.chat.completions.create(
                model=TASK_MODEL, messages=[{"role": "user", "content": _prompt("summarize", claim)}]
            )
        except openai.APIStatusError as exc:
            raise self.retry(exc=exc, countdown=0.05) from exc
        return r.usage.total_tokens if r.usage else 0

    app = FastAPI(title="claims")

    def chat_call(model: str, prompt: str) -> str:
        r = oai.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}])
        return r.choices[0].message.content or ""

    @app.post("/chat")
    def chat(claim: Claim) -> Any:
        try:
            return {"answer": chat_call(CHAT_MODEL, _prompt("question", claim.id))}
        except openai.APIError as exc:
            return JSONResponse({"error": str(exc)}, status_code=502)

    def call_with_retry(prompt: str) -> str:
        try:
            return chat_call(AGENT_MODEL, prompt)
        except openai.APIStatusError:  # the SDK gave up: the application retries once
            return chat_call(AGENT_MODEL, prompt)

    def extract_fields(claim: int, first_try: bool) -> str:
        with tracer.start_as_current_span("extract fields"):
            out = chat_call(AGENT_MODEL, _prompt("extract", claim, 1))
            if first_try and claim % 4 == 1:  # the model's answer fails validation
                raise ExtractionError(f"claim {claim}: the extracted fields do not validate")
            return out

    @app.post("/agent")
    def agent(claim: Claim) -> Any:
        try:
            with workflow(WORKFLOW):
                call_with_retry(_prompt("classify", claim.id))
                try:
                    extract_fields(claim.id, first_try=True)
                except (ExtractionError, openai.APIStatusError):
                    extract_fields(claim.id, first_try=False)
                call_with_retry(_prompt("decide", claim.id, 2))
            return {"ok": True}
        except openai.APIError as exc:
            return JSONResponse({"error": str(exc)}, status_code=502)

    @app.post("/enqueue")
    def enqueue(claim: Claim) -> Any:
        result = summarize.delay(claim.id)
        with state.lock:
            state.task_ids.append(result.id)
        return {"task_id": result.id}

    @app.get("/internal/customers/{cid}")
    def customer(cid: int) -> Any:
        return {"id": cid, "tier": ("gold", "silver", "bronze")[cid % 3]}

    @app.post("/support")
    def support(claim: Claim) -> Any:
        if "client" not in lookup:
            lookup.setdefault("client", httpx.Client(base_url=self_url["url"], timeout=10))
        with tracer.start_as_current_span("load customer context") as span:
            customer = lookup["client"].get(f"/internal/customers/{claim.id}").json()
            span.set_attribute("customer.tier", customer["tier"])
            time.sleep(state.internal_s)
        try:
            msg = claude.messages.create(
                model=SUPPORT_MODEL,
                max_tokens=256,
                system="You answer insurance customers.",
                messages=[{"role": "user", "content": _prompt(f"support {customer['tier']}", claim.id)}],
            )
        except anthropic.APIError as exc:
            return JSONResponse({"error": str(exc)}, status_code=502)
        return {"answer": msg.content[0].text if msg.content else ""}

    FastAPIInstrumentor.instrument_app(app, tracer_provider=tp)
    app.state.self_url = self_url
    return app, celery_app


@contextmanager
def _serve(app: Any) -> Iterator[str]:
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False, timeout_keep_alive=30)
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    url = f"http://127.0.0.1:{port}"
    app.state.self_url["url"] = url
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


# --- the load driver ---------------------------------------------------------------------------
def _drive(url: str, jobs: list[tuple[str, int]], concurrency: int) -> Counter[str]:
    host, port = url.removeprefix("http://").split(":")
    local = threading.local()

    def one(job: tuple[str, int]) -> str:
        path, claim = job
        conn = getattr(local, "conn", None)
        if conn is None:
            conn = local.conn = http.client.HTTPConnection(host, int(port), timeout=60)
        body = json.dumps({"id": claim})
        try:
            conn.request("POST", path, body, {"content-type": "application/json"})
            response = conn.getresponse()
            response.read()
        except (OSError, http.client.HTTPException):
            local.conn = None
            raise
        return f"{path} {response.status}"

    with ThreadPoolExecutor(concurrency, thread_name_prefix="driver") as pool:
        return Counter(pool.map(one, jobs))


def _drain(celery_app: Any, state: _State, timeout_s: float = 30.0) -> dict[str, int]:
    from celery.result import AsyncResult

    with state.lock:
        ids = list(state.task_ids)
    deadline = time.monotonic() + timeout_s
    while True:
        states = [AsyncResult(i, app=celery_app).state for i in ids]
        if all(s in ("SUCCESS", "FAILURE") for s in states) or time.monotonic() > deadline:
            return dict(Counter(states))
        time.sleep(0.02)


# --- main --------------------------------------------------------------------------------------
def run(flavour: Flavour, argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=f"tailwatch integration app, flavour {flavour.name}")
    parser.add_argument("--otlp", required=True, help="OTLP/HTTP traces endpoint, e.g. http://h:p/v1/traces")
    parser.add_argument("--out", required=True, type=Path, help="directory for spans.jsonl and run.json")
    parser.add_argument("--requests", type=int, default=30, help="requests per endpoint per phase")
    parser.add_argument("--concurrency", type=int, default=6)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--stream", action="store_true", help="export spans during the run (500 ms batches)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()

    tp = TracerProvider(
        resource=Resource.create(
            {
                "service.name": flavour.service,
                "service.version": SERVICE_VERSION,
                "deployment.environment.name": "integration",
            }
        )
    )
    memory = InMemorySpanExporter()
    # The exporter holds every span until the run ends (force_flush): on a 2-core machine the
    # receiver's inserts running beside the load stall the app by up to a few hundred ms, noise in the
    # one-trace tails the attribution compares. ``--stream`` exports as a service normally does.
    if args.stream:
        batch = BatchSpanProcessor(OTLPSpanExporter(endpoint=args.otlp), schedule_delay_millis=500)
    else:
        batch = BatchSpanProcessor(
            OTLPSpanExporter(endpoint=args.otlp),
            max_queue_size=1_000_000,
            max_export_batch_size=1_000_000,
            schedule_delay_millis=3_600_000,
        )
    tp.add_span_processor(batch)
    tp.add_span_processor(SimpleSpanProcessor(memory))
    trace.set_tracer_provider(tp)

    from opentelemetry.instrumentation.anthropic import AnthropicInstrumentor
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.instrumentation.httpx import HTTPX2ClientInstrumentor, HTTPXClientInstrumentor

    HTTPXClientInstrumentor().instrument(tracer_provider=tp)
    HTTPX2ClientInstrumentor().instrument(tracer_provider=tp)
    CeleryInstrumentor().instrument(tracer_provider=tp)
    if flavour.traceloop_anthropic:
        AnthropicInstrumentor().instrument(tracer_provider=tp)
    flavour.instrument(tp)

    from celery.contrib.testing.worker import start_worker

    rng = random.Random(args.seed)
    state = _State()
    phases: dict[str, list[int]] = {}
    responses: dict[str, dict[str, int]] = {}
    tasks: dict[str, dict[str, int]] = {}
    with MockProviders(SCRIPTS) as providers:
        app, celery_app = _build(flavour, tp, providers, state)
        with (
            _serve(app) as url,
            start_worker(
                celery_app, pool="threads", concurrency=4, perform_ping_check=False, loglevel="WARNING"
            ),
        ):
            # Warm-up, outside both windows: first calls pay for lazy imports, clients and connections.
            _drive(url, [(p, 1000 + i) for p in ENDPOINTS for i in range(args.concurrency)], args.concurrency)
            _drain(celery_app, state)
            state.task_ids.clear()
            time.sleep(0.3)
            t = _now_us_ns()
            for phase in ("baseline", "current"):
                if phase == "current":
                    providers.set_latency(CHAT_MODEL, CHAT_SLOWDOWN_S)
                    state.internal_s = INTERNAL_SLOWDOWN_S
                jobs = [(p, i) for p in ENDPOINTS for i in range(args.requests)]
                rng.shuffle(jobs)
                responses[phase] = dict(_drive(url, jobs, args.concurrency))
                tasks[phase] = _drain(celery_app, state)
                state.task_ids.clear()
                time.sleep(0.3)  # the last SERVER spans end after their responses are read
                end = _now_us_ns()
                phases[phase] = [t, end]
                t = end
        mock_stats = providers.stats()

    assert tp.force_flush(30_000), "the span processors did not flush"
    tp.shutdown()
    spans = memory.get_finished_spans()
    with (args.out / "spans.jsonl").open("w") as f:
        for span in spans:
            f.write(json.dumps(span_record(span)) + "\n")
    run_info = {
        "flavour": flavour.name,
        "service": flavour.service,
        "phases": phases,
        "responses": responses,
        "tasks": tasks,
        "mock": mock_stats,
        "spans": len(spans),
        "seconds": round(time.monotonic() - began, 2),
    }
    (args.out / "run.json").write_text(json.dumps(run_info, indent=2))
    print(json.dumps({k: run_info[k] for k in ("flavour", "spans", "seconds", "responses", "tasks")}))
