"""Synthetic traces with a known ground truth, for the analytics tests and every stage that reads them.

Each builder returns ``list[SpanRow]`` shaped the way real instrumentation writes spans (GenAI,
HTTP and messaging semantic conventions), so the analysis under test sees what production sees::

    from tests.analytics.builders import T0, MS, hot_request, cold_job, workflow_run, scenario_llm_regression
    spans = hot_request("chat-api", "POST /chat", T0, 420.0, version="1.2.0", llm_ms=300.0,
                        internal=[("db.query", 40.0)])
    insert_spans(store, spans)

Times are integer nanoseconds since the epoch; ``T0`` is a fixed UTC instant so tests are repeatable.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from collectors.spans import SpanEvent, SpanLink, SpanRow, new_span_id, new_trace_id

__all__ = [
    "MS",
    "T0",
    "T0_DT",
    "S",
    "Scenario",
    "at",
    "batch_run",
    "batch_task_request",
    "cold_job",
    "dt",
    "eager_task",
    "flagged",
    "hot_request",
    "queued_request",
    "scenario_abandonment_cliff",
    "scenario_boundary",
    "scenario_cold_queues",
    "scenario_drift",
    "scenario_flag_split",
    "scenario_internal_regression",
    "scenario_llm_regression",
    "scenario_release_coupling",
    "scenario_retries",
    "streamed_request",
    "with_call",
    "with_llm_call",
    "workflow_run",
]

MS = 1_000_000
S = 1_000_000_000
T0_DT = datetime(2026, 11, 2, 8, 0, tzinfo=UTC)
T0 = int(T0_DT.timestamp()) * S


def at(offset_s: float) -> int:
    """Nanoseconds at ``offset_s`` seconds after :data:`T0`."""
    return T0 + int(offset_s * S)


def dt(ns: int) -> datetime:
    """A UTC datetime for a nanosecond timestamp (microsecond precision)."""
    return datetime.fromtimestamp(ns // 1000 / 1e6, tz=UTC)


def _kind(kind: str, legacy: bool) -> str:
    return "SPAN_KIND_" + kind.upper() if legacy else kind


def _status(status: str, legacy: bool) -> str:
    return "STATUS_CODE_" + status.upper() if legacy else status


def _llm_attrs(
    provider: str, model: str, operation: str = "chat", tokens: tuple[int, int] | None = None
) -> dict[str, str]:
    attrs = {
        "gen_ai.operation.name": operation,
        "gen_ai.provider.name": provider,
        "gen_ai.request.model": model,
    }
    if tokens is not None:
        attrs["gen_ai.usage.input_tokens"] = str(tokens[0])
        attrs["gen_ai.usage.output_tokens"] = str(tokens[1])
    return attrs


def hot_request(
    service: str,
    operation: str,
    start_ns: int,
    duration_ms: float,
    version: str = "1.0.0",
    llm_ms: float | Sequence[float] | None = None,
    internal: Sequence[tuple[str, float]] = (),
    *,
    provider: str = "openai",
    model: str = "gpt-4o",
    abandoned: bool = False,
    http_status: int | None = None,
    llm_status: str = "Unset",
    llm_throttled: bool = False,
    llm_retries: int = 0,
    trace_id: str | None = None,
    legacy: bool = False,
    mark_hot: bool = False,
) -> list[SpanRow]:
    """One hot-path request: a Server root span and, in order, its internal then its LLM children.

    ``internal`` is ``[(span_name, ms), ...]`` (plain Internal spans); ``llm_ms`` one or several
    synchronous ``chat`` calls (Client spans with GenAI attributes). Children run back to back from
    the root's start; the root lasts ``max(duration_ms, sum of children)`` and owns the rest as
    self time. ``llm_retries`` adds failed attempts (429) before each LLM call, as siblings with
    ``http.request.resend_count``. ``legacy`` writes the pre-2024 ``SPAN_KIND_*`` spellings;
    ``mark_hot`` makes the root an Internal span marked ``tailwatch.path=hot`` instead.
    """
    trace_id = trace_id or new_trace_id()
    root_id = new_span_id()
    llm_list = (
        [] if llm_ms is None else ([float(llm_ms)] if isinstance(llm_ms, int | float) else list(llm_ms))
    )
    children: list[SpanRow] = []
    cursor = start_ns
    for name, ms in internal:
        children.append(
            SpanRow(
                trace_id=trace_id,
                span_id=new_span_id(),
                parent_span_id=root_id,
                name=name,
                start_ns=cursor,
                duration_ns=int(ms * MS),
                kind=_kind("Internal", legacy),
                service=service,
                resource_attributes={"service.version": version},
                status_code=_status("Unset", legacy),
            )
        )
        cursor += int(ms * MS)
    for ms in llm_list:
        for attempt in range(llm_retries + 1):
            final = attempt == llm_retries
            attrs = _llm_attrs(provider, model, tokens=(500, 200))
            if attempt:
                attrs["http.request.resend_count"] = str(attempt)
            if not final or llm_throttled:
                attrs["http.response.status_code"] = "429"
                attrs["error.type"] = "429"
            span_ms = ms if final else 20.0
            children.append(
                SpanRow(
                    trace_id=trace_id,
                    span_id=new_span_id(),
                    parent_span_id=root_id,
                    name=f"chat {model}",
                    start_ns=cursor,
                    duration_ns=int(span_ms * MS),
                    kind=_kind("Client", legacy),
                    service=service,
                    resource_attributes={"service.version": version},
                    attributes=attrs,
                    status_code=_status(llm_status if final else "Error", legacy),
                )
            )
            cursor += int(span_ms * MS)
    total_ns = max(int(duration_ms * MS), cursor - start_ns)
    root_attrs: dict[str, str] = {}
    if http_status is not None:
        root_attrs["http.response.status_code"] = str(http_status)
    if abandoned:
        root_attrs["tailwatch.abandoned"] = "true"
    if mark_hot:
        root_attrs["tailwatch.path"] = "hot"
    root = SpanRow(
        trace_id=trace_id,
        span_id=root_id,
        name=operation,
        start_ns=start_ns,
        duration_ns=total_ns,
        kind=_kind("Internal" if mark_hot else "Server", legacy),
        service=service,
        resource_attributes={"service.version": version},
        attributes=root_attrs,
        status_code=_status("Unset", legacy),
    )
    return [root, *children]


def streamed_request(
    service: str,
    operation: str,
    start_ns: int,
    first_byte_ms: float,
    duration_ms: float,
    *,
    chunks: int = 5,
    version: str = "1.0.0",
    abandoned: bool = False,
) -> list[SpanRow]:
    """A hot-path request whose server streams its answer, as the ASGI instrumentation records it:
    one Internal ``{operation} http send`` child per ``send()`` — ``http.response.start`` at once,
    the first ``http.response.body`` at ``first_byte_ms``, ``chunks - 1`` more spread up to
    ``duration_ms`` and the final empty body at the end (``chunks`` 1: a plain response, one body
    send at ``first_byte_ms``)."""
    spans = hot_request(service, operation, start_ns, duration_ms, version=version, abandoned=abandoned)
    root = spans[0]
    at_ms = [0.5, first_byte_ms]
    if chunks > 1:
        step = (duration_ms - first_byte_ms) / chunks
        at_ms += [first_byte_ms + step * i for i in range(1, chunks)] + [duration_ms - 0.01]
    for i, t in enumerate(at_ms):
        spans.append(
            SpanRow(
                trace_id=root.trace_id,
                span_id=new_span_id(),
                parent_span_id=root.span_id,
                name=f"{operation} http send",
                start_ns=start_ns + int(t * MS),
                duration_ns=10_000,
                kind="Internal",
                service=service,
                resource_attributes={"service.version": version},
                attributes={"asgi.event.type": "http.response.start" if i == 0 else "http.response.body"},
                status_code="Unset",
            )
        )
    return spans


def cold_job(
    queue: str,
    enqueue_ns: int,
    wait_s: float,
    processing_s: float,
    *,
    completed: bool = True,
    via: str = "link",
    producer_service: str = "api",
    consumer_service: str = "worker",
    llm_model: str | None = None,
    provider: str = "openai",
    legacy: bool = False,
) -> list[SpanRow]:
    """One queued job: a Producer ``send`` span and, if ``completed``, the Consumer ``process`` span.

    The consumer starts ``wait_s`` after the enqueue and runs ``processing_s``, so enqueue-to-ready
    is ``wait_s + processing_s``. ``via="link"`` puts the consumer in its own trace with a span link
    to the producer (the batch convention); ``via="parent"`` makes it the producer's child. With
    ``llm_model`` the consumer makes one LLM call (cold-path use of a model pool).
    """
    if via not in ("link", "parent"):
        raise ValueError(f"via must be 'link' or 'parent', got {via!r}")
    producer_trace = new_trace_id()
    producer_id = new_span_id()
    spans = [
        SpanRow(
            trace_id=producer_trace,
            span_id=producer_id,
            name=f"send {queue}",
            start_ns=enqueue_ns,
            duration_ns=2 * MS,
            kind=_kind("Producer", legacy),
            service=producer_service,
            attributes={"messaging.destination.name": queue, "messaging.operation.type": "send"},
        )
    ]
    if not completed:
        return spans
    consumer_trace = new_trace_id() if via == "link" else producer_trace
    consumer_id = new_span_id()
    consumer_start = enqueue_ns + int(wait_s * S)
    spans.append(
        SpanRow(
            trace_id=consumer_trace,
            span_id=consumer_id,
            parent_span_id="" if via == "link" else producer_id,
            name=f"process {queue}",
            start_ns=consumer_start,
            duration_ns=int(processing_s * S),
            kind=_kind("Consumer", legacy),
            service=consumer_service,
            attributes={"messaging.destination.name": queue, "messaging.operation.type": "process"},
            links=(SpanLink(producer_trace, producer_id),) if via == "link" else (),
        )
    )
    if llm_model is not None:
        spans.append(
            SpanRow(
                trace_id=consumer_trace,
                span_id=new_span_id(),
                parent_span_id=consumer_id,
                name=f"chat {llm_model}",
                start_ns=consumer_start,
                duration_ns=max(1, int(processing_s * S) // 2),
                kind="Client",
                service=consumer_service,
                attributes=_llm_attrs(provider, llm_model, tokens=(800, 300)),
            )
        )
    return spans


def workflow_run(
    workflow: str,
    start_ns: int,
    hops: Sequence[str] = ("plan", "research", "answer"),
    retries: Mapping[str, int] | None = None,
    *,
    hop_ms: float = 100.0,
    tokens: tuple[int, int] = (600, 400),
    service: str = "agent-runner",
    provider: str = "openai",
    model: str = "gpt-4o",
    tool_hops: Iterable[str] = (),
) -> list[SpanRow]:
    """One agent workflow run: ``invoke_workflow {workflow}`` with one child per hop, in order.

    A hop is a ``chat`` call named after the hop (or an ``execute_tool`` span wrapping a ``chat``
    call for names in ``tool_hops``). ``retries[hop] = n`` adds n failed attempts before the final
    one: siblings with the same name and ``http.request.resend_count`` 1..n. Every attempt spends
    ``tokens`` (input, output).
    """
    retries = dict(retries or {})
    tool_set = set(tool_hops)
    trace_id = new_trace_id()
    root_id = new_span_id()
    spans: list[SpanRow] = []
    cursor = start_ns
    for hop in hops:
        for attempt in range(retries.get(hop, 0) + 1):
            final = attempt == retries.get(hop, 0)
            span_id = new_span_id()
            if hop in tool_set:
                attrs = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": hop}
            else:
                attrs = _llm_attrs(provider, model, tokens=tokens)
            if attempt:
                attrs["http.request.resend_count"] = str(attempt)
            if not final:
                attrs["error.type"] = "timeout"
            spans.append(
                SpanRow(
                    trace_id=trace_id,
                    span_id=span_id,
                    parent_span_id=root_id,
                    name=hop,
                    start_ns=cursor,
                    duration_ns=int(hop_ms * MS),
                    kind="Internal" if hop in tool_set else "Client",
                    service=service,
                    attributes=attrs,
                    status_code="Unset" if final else "Error",
                )
            )
            if hop in tool_set:
                spans.append(
                    SpanRow(
                        trace_id=trace_id,
                        span_id=new_span_id(),
                        parent_span_id=span_id,
                        name=f"chat {model}",
                        start_ns=cursor,
                        duration_ns=int(hop_ms * MS * 0.8),
                        kind="Client",
                        service=service,
                        attributes=_llm_attrs(provider, model, tokens=tokens),
                    )
                )
            cursor += int(hop_ms * MS)
    spans.insert(
        0,
        SpanRow(
            trace_id=trace_id,
            span_id=root_id,
            name=f"invoke_workflow {workflow}",
            start_ns=start_ns,
            duration_ns=cursor - start_ns + MS,
            kind="Internal",
            service=service,
            attributes={"gen_ai.operation.name": "invoke_workflow", "gen_ai.workflow.name": workflow},
        ),
    )
    return spans


# --------------------------------------------------------------------------------------------
# Scenarios: whole data sets with the answer attached.


@dataclass(frozen=True)
class Scenario:
    """Spans plus the windows to analyze them with and the expected answer."""

    spans: list[SpanRow]
    start: datetime
    end: datetime
    baseline_start: datetime
    baseline_end: datetime
    service: str = ""
    operation: str = ""
    expected: Mapping[str, object] = field(default_factory=dict)


def _attribution_scenario(kind: str, seed: int, requests: int) -> Scenario:
    """Baseline hour then current hour of ``chat-api POST /chat``; the current hour's tail is slower
    because of its LLM call (``kind="llm"``) or its ``db.query`` span (``kind="internal"``)."""
    rng = random.Random(seed)
    spans: list[SpanRow] = []
    for window in (0, 1):
        base = at(window * 3600)
        for i in range(requests):
            start = base + int(i * (3500 / requests) * S)
            llm = rng.uniform(150.0, 300.0)
            db = rng.uniform(20.0, 60.0)
            tail = i % 50 == 0  # 2% of requests form the tail
            if tail:  # fixed values, so the tail's composition is exact
                llm, db = 700.0, 150.0
                if window == 1 and kind == "llm":
                    llm += 1200.0
                if window == 1 and kind == "internal":
                    db += 1200.0
            spans += hot_request(
                "chat-api",
                "POST /chat",
                start,
                0.0,
                version="2.0.0",
                llm_ms=llm,
                internal=[("auth", 5.0), ("db.query", db)],
                provider="openai",
                model="gpt-4o",
                http_status=200,
            )
    return Scenario(
        spans=spans,
        start=dt(at(3600)),
        end=dt(at(7200)),
        baseline_start=dt(at(0)),
        baseline_end=dt(at(3600)),
        service="chat-api",
        operation="POST /chat",
        expected={
            "verdict": kind,
            "top_span": "chat gpt-4o" if kind == "llm" else "db.query",
            "delta_ms": 1200.0,
        },
    )


def scenario_llm_regression(seed: int = 7, requests: int = 400) -> Scenario:
    """The current hour's tail requests spend +1200 ms in the LLM call: verdict ``llm``."""
    return _attribution_scenario("llm", seed, requests)


def scenario_internal_regression(seed: int = 11, requests: int = 400) -> Scenario:
    """The current hour's tail requests spend +1200 ms in ``db.query``: verdict ``internal``."""
    return _attribution_scenario("internal", seed, requests)


def scenario_release_coupling(seed: int = 3, per_release: int = 600) -> Scenario:
    """Four releases of ``chat-api POST /chat``, one every 6 h over a day.

    1.0.0 → 1.1.0 and 1.2.0 → 1.3.0 change nothing; 1.2.0 adds a synchronous LLM call that makes
    the tail ≈ +800 ms (p99 steps up). Expected: only 1.2.0 significant, coupled.
    """
    rng = random.Random(seed)
    spans: list[SpanRow] = []
    versions = ("1.0.0", "1.1.0", "1.2.0", "1.3.0")
    for index, version in enumerate(versions):
        base = at(index * 6 * 3600)
        for i in range(per_release):
            start = base + int(i * (6 * 3600 - 60) / per_release * S)
            work = rng.lognormvariate(5.3, 0.35)  # ~200 ms median, tail ~450 ms
            llm = None
            if index >= 2:
                llm = rng.lognormvariate(5.0, 0.3) + (780.0 if rng.random() < 0.05 else 0.0)
            spans += hot_request(
                "chat-api",
                "POST /chat",
                start,
                work + (llm or 0.0),
                version=version,
                llm_ms=llm,
                internal=[("handler", work * 0.8)],
            )
    return Scenario(
        spans=spans,
        start=dt(at(0)),
        end=dt(at(24 * 3600)),
        baseline_start=dt(at(-24 * 3600)),
        baseline_end=dt(at(0)),
        service="chat-api",
        operation="POST /chat",
        expected={"significant": {"1.1.0": False, "1.2.0": True, "1.3.0": False}, "coupled": True},
    )


def scenario_cold_queues(jobs: int = 500) -> Scenario:
    """A healthy queue (``emails``: 1 s to ready, little spread) and a starved one
    (``doc-summaries``: p50 3 s, p99 180 s), plus 5 pending jobs on ``doc-summaries``."""
    spans: list[SpanRow] = []
    for i in range(jobs):
        enq = at(i * 6.0)
        # Single messages: the consumer is the producer's child.
        spans += cold_job("emails", enq, 0.5 + (i % 10) * 0.02, 0.5, via="parent")
        # 98% are ready after 2.4–3.6 s (median 3 s); the slowest 2% after 180 s (the starved tail).
        wait = 179.0 if i % 50 in (0, 1) else 2.0 + ((i % 7) - 3) * 0.2
        spans += cold_job("doc-summaries", enq + MS, wait, 1.0, consumer_service="summary-worker")
    for i in range(5):
        spans += cold_job("doc-summaries", at(3000 + i), 0.0, 0.0, completed=False)
    return Scenario(
        spans=spans,
        start=dt(at(0)),
        end=dt(at(3600)),
        baseline_start=dt(at(-3600)),
        baseline_end=dt(at(0)),
        expected={"starved": {"doc-summaries": True, "emails": False}, "pending": {"doc-summaries": 5}},
    )


def scenario_abandonment_cliff(requests: int = 2000) -> Scenario:
    """``web`` ``GET /answer``: latency spread evenly over 0–4 s; below 2000 ms 2% abandon, from
    2000 ms on 40% abandon (status 499). Expected cliff_ms = 2000."""
    spans: list[SpanRow] = []
    for i in range(requests):
        duration = (i * 7919 % requests) / requests * 4000.0 + 1.0
        abandon = (i % 50 == 0) if duration < 2000 else (i % 5 in (0, 1))
        spans += hot_request(
            "web",
            "GET /answer",
            at(i * 1.5),
            duration,
            version="1.0.0",
            http_status=499 if abandon else 200,
        )
    return Scenario(
        spans=spans,
        start=dt(at(0)),
        end=dt(at(3600)),
        baseline_start=dt(at(-3600)),
        baseline_end=dt(at(0)),
        service="web",
        operation="GET /answer",
        expected={"cliff_ms": 2000},
    )


def scenario_retries(runs: int = 200) -> Scenario:
    """``claims-triage``: 3 hops, exactly 5% of calls of each hop retried once (10 of 200 runs per
    hop). Expected per-hop retry_rate 0.05, modeled amplification 1.05³ ≈ 1.1576, attempt and token
    amplification 3.15/3 = 1.05 observed."""
    hops = ("classify", "extract", "decide")
    spans: list[SpanRow] = []
    for i in range(runs):
        retries = {hop: 1 for k, hop in enumerate(hops) if (i + 7 * k) % 20 == 0}
        spans += workflow_run("claims-triage", at(i * 10.0), hops, retries)
    return Scenario(
        spans=spans,
        start=dt(at(0)),
        end=dt(at(3600)),
        baseline_start=dt(at(-3600)),
        baseline_end=dt(at(0)),
        expected={"retry_rate": 0.05, "modeled_amplification": 1.05**3, "attempt_amplification": 1.05},
    )


# --------------------------------------------------------------------------------------------
# The hot/cold boundary and slices of a migration.


def flagged(request: list[SpanRow], flag: str, variant: str, *, how: str = "event") -> list[SpanRow]:
    """``request`` (root first) with the flag's evaluation recorded as OpenTelemetry writes it:
    ``how="event"`` a ``feature_flag.evaluation`` event (``feature_flag.result.variant``) on the
    root's first child (or the root), ``"old-event"`` the older ``feature_flag`` event
    (``feature_flag.variant``) on the root, ``"attributes"`` span attributes on the root."""
    root, *rest = request
    if how == "attributes":
        attrs = {**root.attributes, "feature_flag.key": flag, "feature_flag.result.variant": variant}
        return [replace(root, attributes=attrs), *rest]
    if how == "old-event":
        event = SpanEvent(
            root.start_ns, "feature_flag", {"feature_flag.key": flag, "feature_flag.variant": variant}
        )
        return [replace(root, events=(*root.events, event)), *rest]
    if how != "event":
        raise ValueError(f"how must be 'event', 'old-event' or 'attributes', got {how!r}")
    event = SpanEvent(
        root.start_ns,
        "feature_flag.evaluation",
        {
            "feature_flag.key": flag,
            "feature_flag.result.variant": variant,
            "feature_flag.provider.name": "flagd",
        },
    )
    if not rest:
        return [replace(root, events=(event,))]
    first = rest[0]
    return [root, replace(first, events=(*first.events, event)), *rest[1:]]


def queued_request(
    service: str,
    operation: str,
    start_ns: int,
    duration_ms: float,
    queue: str,
    wait_s: float,
    processing_s: float,
    *,
    version: str = "1.0.0",
    abandoned: bool = False,
    model: str = "gpt-4o-mini",
) -> list[SpanRow]:
    """A hot request that enqueues its work instead of calling the model, Celery style: the root,
    an ``apply_async`` Producer child 1 ms in, and in the same trace the worker's ``run`` Consumer
    (the producer's child) starting ``wait_s`` after the enqueue and running ``processing_s``, with
    the model call below it. Enqueue-to-ready = ``wait_s + processing_s``."""
    spans = hot_request(
        service, operation, start_ns, duration_ms, version=version, http_status=499 if abandoned else 200
    )
    root = spans[0]
    producer = SpanRow(
        trace_id=root.trace_id,
        span_id=new_span_id(),
        parent_span_id=root.span_id,
        name=f"apply_async/{queue}",
        start_ns=start_ns + MS,
        duration_ns=MS,
        kind="Producer",
        service=service,
        resource_attributes={"service.version": version},
        attributes={"messaging.destination": queue, "messaging.message.id": new_span_id()},
    )
    run_start = producer.start_ns + int(wait_s * S)
    run = SpanRow(
        trace_id=root.trace_id,
        span_id=new_span_id(),
        parent_span_id=producer.span_id,
        name=f"run/{queue}",
        start_ns=run_start,
        duration_ns=int(processing_s * S),
        kind="Consumer",
        service="worker",
        attributes={"messaging.destination": queue, "celery.state": "SUCCESS"},
    )
    call = SpanRow(
        trace_id=root.trace_id,
        span_id=new_span_id(),
        parent_span_id=run.span_id,
        name=f"chat {model}",
        start_ns=run_start,
        duration_ns=int(processing_s * S * 0.9),
        kind="Client",
        service="worker",
        attributes=_llm_attrs("openai", model, tokens=(900, 300)),
    )
    return [*spans, producer, run, call]


def scenario_boundary(per_release: int = 600) -> Scenario:
    """A day of three operations and the budget that applies to each:

    * ``chat-api POST /chat`` — :func:`scenario_release_coupling`: 1.2.0 adds a synchronous model
      call; configured budget 800 ms. Over budget with the call, within it without: move it off.
    * ``status GET /status`` — 50–150 ms, no model call; budget 500 ms (globs ``stat*``,
      ``GET /*``): keep.
    * ``reports POST /report`` — 2.2–2.8 s of internal work and a 40 ms model call; budget 2 s
      (``reports``, any operation): over budget even without the call, optimise internal work.
    * ``web GET /answer`` — :func:`scenario_abandonment_cliff`: no budget configured, so the cliff
      (2000 ms) is its budget.

    ``expected["budgets"]`` is the ``latency_budgets`` convention in its config-file form."""
    rng = random.Random(13)
    spans = list(scenario_release_coupling(per_release=per_release).spans)
    for i in range(1000):
        spans += hot_request("status", "GET /status", at(i * 80.0), 50.0 + rng.random() * 100.0)
    for i in range(400):
        internal = 2200.0 + rng.random() * 600.0
        spans += hot_request(
            "reports", "POST /report", at(i * 200.0), 0.0, llm_ms=40.0, internal=[("render pdf", internal)]
        )
    spans += scenario_abandonment_cliff().spans
    return Scenario(
        spans=spans,
        start=dt(at(0)),
        end=dt(at(24 * 3600)),
        baseline_start=dt(at(-24 * 3600)),
        baseline_end=dt(at(0)),
        expected={
            "budgets": [
                {"service": "chat-api", "operation": "POST /chat", "budget": "800ms"},
                {"service": "stat*", "operation": "GET /*", "budget_ms": 500},
                {"service": "reports", "budget": "2s"},
            ],
            "recommendation": {
                ("chat-api", "POST /chat"): "move_off_hot_path",
                ("status", "GET /status"): "keep",
                ("reports", "POST /report"): "optimise_internal",
                ("web", "GET /answer"): "optimise_internal",
            },
        },
    )


def scenario_flag_split(requests: int = 1000) -> Scenario:
    """``docs-api POST /summarize`` under the flag ``summary-mode``: 70% ``sync`` (the model is
    called in the request: 600–1400 ms, 10% abandoned) and 30% ``async`` (the request enqueues a
    job on ``summaries`` and returns in 30–70 ms, 2% abandoned; the job is ready 2–8 s later, a
    few after 60 s). The evaluation is recorded every way OpenTelemetry records it. Neither variant
    has a conventional control name, so the control is ``sync``, the variant with most requests."""
    rng = random.Random(29)
    spans: list[SpanRow] = []
    ways = ("event", "old-event", "attributes")
    for i in range(requests):
        start = at(i * 3.0)
        if i % 10 < 7:
            index = i // 10 * 7 + i % 10
            request = hot_request(
                "docs-api",
                "POST /summarize",
                start,
                0.0,
                llm_ms=600.0 + rng.random() * 800.0,
                internal=[("load doc", 20.0)],
                http_status=499 if index % 10 == 0 else 200,
            )
            spans += flagged(request, "summary-mode", "sync", how=ways[i % 3])
        else:
            index = i // 10 * 3 + i % 10 - 7
            wait = 60.0 + rng.random() * 10.0 if index % 50 == 0 else 1.0 + rng.random() * 5.0
            request = queued_request(
                "docs-api",
                "POST /summarize",
                start,
                30.0 + rng.random() * 40.0,
                "summaries",
                wait,
                1.0 + rng.random(),
                abandoned=index % 50 == 1,
            )
            spans += flagged(request, "summary-mode", "async", how=ways[i % 3])
    return Scenario(
        spans=spans,
        start=dt(at(0)),
        end=dt(at(3600)),
        baseline_start=dt(at(-3600)),
        baseline_end=dt(at(0)),
        service="docs-api",
        operation="POST /summarize",
        expected={"flag": "summary-mode", "control": "sync", "requests": {"sync": 700, "async": 300}},
    )


DAY = 86_400 * S


def with_call(
    spans: list[SpanRow],
    span_name: str,
    function: str = "",
    namespace: str = "",
    *,
    parent: int = 0,
    ms: float = 5.0,
) -> list[SpanRow]:
    """``spans`` with one more Internal span, a child of ``spans[parent]`` starting with it: a call
    of a function recognised by its span name and, when given, ``code.function.name`` /
    ``code.namespace`` (the code semantic conventions the Python instrumentations set)."""
    host = spans[parent]
    attrs = {}
    if function:
        attrs["code.function.name"] = function
    if namespace:
        attrs["code.namespace"] = namespace
    call = SpanRow(
        trace_id=host.trace_id,
        span_id=new_span_id(),
        parent_span_id=host.span_id,
        name=span_name,
        start_ns=host.start_ns,
        duration_ns=int(ms * MS),
        kind="Internal",
        service=host.service,
        attributes=attrs,
    )
    return [*spans, call]


def eager_task(spans: list[SpanRow], task: str) -> list[SpanRow]:
    """``spans`` (a request) with a Celery task run eagerly inside it (``apply()``): a Consumer
    ``run/<task>`` span right under the root, no Producer, as Celery's instrumentation records it."""
    root = spans[0]
    run = SpanRow(
        trace_id=root.trace_id,
        span_id=new_span_id(),
        parent_span_id=root.span_id,
        name=f"run/{task}",
        start_ns=root.start_ns,
        duration_ns=root.duration_ns,
        kind="Consumer",
        service=root.service,
        attributes={"celery.action": "run", "celery.state": "SUCCESS", "messaging.destination": "celery"},
    )
    return [*spans, run]


def with_llm_call(spans: list[SpanRow], tokens: tuple[int, int], *, parent: int = 0) -> list[SpanRow]:
    """``spans`` with one more model call (a GenAI ``chat`` Client span with its token usage), a
    child of ``spans[parent]``."""
    host = spans[parent]
    call = SpanRow(
        trace_id=host.trace_id,
        span_id=new_span_id(),
        parent_span_id=host.span_id,
        name="chat gpt-4o-mini",
        start_ns=host.start_ns,
        duration_ns=50 * MS,
        kind="Client",
        service=host.service,
        attributes=_llm_attrs("openai", "gpt-4o-mini", tokens=tokens),
    )
    return [*spans, call]


def batch_task_request(
    start_ns: int,
    items: int,
    *,
    fail_first: bool,
    retry_items: int | None = None,
    api: str = "index-api",
    worker: str = "index-worker",
    task: str = "reindex",
    linked: bool = False,
) -> list[SpanRow]:
    """``index-api POST /reindex/now`` enqueuing a Celery batch task (``apply_async/reindex`` with its
    task id as ``messaging.message.id``) and, in the same trace, the worker's ``run/reindex`` of
    ``items`` documents. With ``fail_first`` that run ends in RETRY with one failed
    ``index_document`` child, and a second run of the same task id processes ``retry_items``
    (default: the whole batch again) successfully. ``linked``: each run is the root of its own trace,
    linked to the producer (the messaging conventions' shape) instead of its child."""
    spans = hot_request(api, f"POST /{task}/now", start_ns, 40.0, http_status=202)
    root, task_id = spans[0], new_span_id()
    producer = SpanRow(
        trace_id=root.trace_id,
        span_id=new_span_id(),
        parent_span_id=root.span_id,
        name=f"apply_async/{task}",
        start_ns=start_ns + MS,
        duration_ns=MS,
        kind="Producer",
        service=api,
        attributes={"messaging.destination": task, "messaging.message.id": task_id},
    )
    spans.append(producer)
    tries = (
        [(items, "RETRY"), (items if retry_items is None else retry_items, "SUCCESS")]
        if fail_first
        else [(items, "SUCCESS")]
    )
    for n, (size, state) in enumerate(tries):
        run = SpanRow(
            trace_id=new_trace_id() if linked else root.trace_id,
            span_id=new_span_id(),
            parent_span_id="" if linked else producer.span_id,
            links=(SpanLink(root.trace_id, producer.span_id),) if linked else (),
            name=f"run/{task}",
            start_ns=start_ns + (2 + 60 * n) * S,
            duration_ns=30 * S,
            kind="Consumer",
            service=worker,
            attributes={
                "messaging.destination": task,
                "messaging.message.id": task_id,
                "messaging.batch.message_count": str(size),
                "celery.state": state,
            },
        )
        spans.append(run)
        if state == "RETRY":
            spans.append(
                SpanRow(
                    trace_id=run.trace_id,
                    span_id=new_span_id(),
                    parent_span_id=run.span_id,
                    name="index_document",
                    start_ns=run.start_ns,
                    duration_ns=MS,
                    kind="Internal",
                    service=worker,
                    status_code="Error",
                )
            )
    return spans


def batch_run(
    service: str,
    name: str,
    start_ns: int,
    items: int,
    *,
    duration_s: float = 60.0,
    size_attribute: str = "messaging.batch.message_count",
) -> list[SpanRow]:
    """One run of a scheduled job: a root span marked ``tailwatch.path=cold`` carrying its batch size
    the way the messaging conventions do (``messaging.batch.message_count``)."""
    return [
        SpanRow(
            trace_id=new_trace_id(),
            span_id=new_span_id(),
            name=name,
            start_ns=start_ns,
            duration_ns=int(duration_s * S),
            kind="Internal",
            service=service,
            attributes={"tailwatch.path": "cold", size_attribute: str(items)},
        )
    ]


def scenario_drift(days: int = 14) -> Scenario:
    """Fourteen days of a document-summary job drifting into an online service, beside healthy
    traffic. Day ``d`` is [T0 + d days, T0 + d + 1 days); the drift window is the whole span.

    Drifting (``expected`` holds each finding's key and first day):

    * ``summary-worker nightly-summaries``: 1 run a day of 200 documents (days 0–4), then 24 runs a
      day of 8 (days 5–9), then of 4 (days 10–13): ``batch_shrinking`` from day 5. Each document is
      one ``summarise_document`` call (``summaries.tasks.summarise_document``) and one model call
      of 700 tokens, after a 5000-token setup call per run: tokens per document 725 then, 1325
      (days 5–9) and 1950 now: ``unit_cost_rising`` from day 5 (the first day past 1.5 × 725).
    * ``summary-api POST /summaries/now`` from day 10: 60 requests a day, each calling
      ``summarise_document`` synchronously (half of them through a Celery task run eagerly): its
      hot share goes from 0 to 60 / (60 + 96):
      ``shared_operation`` from day 10, and the endpoint reaches it with no latency target:
      ``no_latency_target`` from day 10.
    * queue ``doc-index``: 50 jobs a day, all done, until day 9; then 80 a day of which 30 stay
      pending: ``queue_unbounded`` from day 10.

    Healthy, raising nothing:

    * ``report-worker nightly-report``: one run a day of 100 items and one model call, calling
      ``load_template`` 70 times; ``web GET /templates`` calls it 30 times a day: a shared helper
      at a steady 30% hot.
    * ``web POST /reports``, Celery style (the worker's run in the request's trace, below the
      enqueue), from day 7 on, 40 a day: the worker's ``render_report`` call is cold work, as is the
      nightly job's (5 a day), so ``render_report`` stays 0% hot.
    * queue ``emails``: 50 jobs a day, one of them crossing midnight into the next day: bounded.
    * ``digest-worker run/digest``: a batch task that fails once a day and retries its bad record
      alone (1 item reprocessed per failed item).

    And ``index-worker run/reindex`` (10 Celery batch tasks of 50 documents a day, enqueued by
    ``index-api POST /reindex/now``): from day 10 each fails on one document and its retry runs all
    50 again: ``whole_batch_retry`` from day 10, 50 items reprocessed per failed item.
    """
    spans: list[SpanRow] = []
    fn = ("summarise_document", "summarise_document", "summaries.tasks")
    for d in range(days):
        base = T0 + d * DAY
        # The drifting job.
        runs, per_run = (1, 200) if d < 5 else (24, 8) if d < 10 else (24, 4)
        for r in range(runs):
            run = batch_run("summary-worker", "nightly-summaries", base + r * 3600 * S + 60 * S, per_run)
            # A fixed setup prompt per run (5000 tokens) then one call per document (700 tokens).
            run = with_llm_call(run, (5000, 0))
            for _ in range(per_run):
                run = with_call(run, *fn)
                run = with_llm_call(run, (500, 200))
            spans += run
        if d >= 10:
            for i in range(60):
                request = hot_request("summary-api", "POST /summaries/now", base + (i * 600 + 30) * S, 900.0)
                if i % 2:
                    # Half run the task eagerly (Celery's apply()): synchronous, still the hot path.
                    request = eager_task(request, "summarise")
                    spans += with_call(request, *fn, parent=len(request) - 1, ms=800.0)
                else:
                    spans += with_call(request, *fn, ms=800.0)
        for i in range(80 if d >= 10 else 50):
            spans += cold_job(
                "doc-index", base + (i * 900 + 5) * S, 1.0, 2.0, completed=not (d >= 10 and i >= 50)
            )
        # Healthy traffic.
        report = with_llm_call(
            batch_run("report-worker", "nightly-report", base + 2 * 3600 * S, 100), (900, 100)
        )
        for _ in range(70):
            report = with_call(report, "load_template", "load_template", "common.templates")
        for _ in range(5):
            report = with_call(report, "render_report", "render_report", "reports.tasks")
        spans += report
        for i in range(30):
            request = with_llm_call(
                hot_request("web", "GET /templates", base + (i * 1200 + 40) * S, 50.0), (300, 80)
            )
            spans += with_call(request, "load_template", "load_template", "common.templates", ms=3.0)
        if d >= 7:
            for i in range(40):
                request = queued_request(
                    "web", "POST /reports", base + (i * 1500 + 50) * S, 80.0, "reports", 2.0, 5.0
                )
                run = next(k for k, sp in enumerate(request) if sp.kind == "Consumer")
                spans += with_call(request, "render_report", "render_report", "reports.tasks", parent=run)
        # Whole-batch retries from day 10 (a bad document makes the task retry all 50); before, and
        # for the healthy digest task retrying only its bad record, nothing.
        for i in range(10):
            # Half the tasks run in their own trace, linked to the request that enqueued them.
            spans += batch_task_request(base + (i * 3000 + 90) * S, 50, fail_first=d >= 10, linked=i % 2 == 1)
        spans += batch_task_request(
            base + 5000 * S,
            50,
            fail_first=True,
            retry_items=1,
            api="digest-api",
            worker="digest-worker",
            task="digest",
        )
        for i in range(49):
            spans += cold_job("emails", base + (i * 1500 + 7) * S, 0.5, 0.5, via="parent")
        spans += cold_job("emails", base + DAY - 1 * S, 3.0, 0.5, via="parent")
    start = dt(T0)
    end = dt(T0 + days * DAY)
    return Scenario(
        spans=spans,
        start=start,
        end=end,
        baseline_start=start,
        baseline_end=start,
        expected={
            (
                "shared_operation",
                "summary-api",
                "summarise_document (summaries.tasks.summarise_document)",
                "",
            ): 10,
            ("batch_shrinking", "summary-worker", "nightly-summaries", ""): 5,
            ("unit_cost_rising", "summary-worker", "nightly-summaries", ""): 5,
            ("queue_unbounded", "", "", "doc-index"): 10,
            ("whole_batch_retry", "index-worker", "run/reindex", ""): 10,
            ("no_latency_target", "summary-api", "POST /summaries/now", ""): 10,
            ("no_latency_target", "web", "GET /templates", ""): 0,
        },
    )
