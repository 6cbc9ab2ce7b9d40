"""Architecture drift from the spans the real instrumentations leave: a Celery task enqueued with
``delay`` by a nightly run and, from day 10 on, also run synchronously (``apply``) inside a FastAPI
handler, under ``opentelemetry-instrumentation-celery`` and ``-fastapi``.

The broker is Celery's in-memory transport and the worker runs in this process (``start_worker``,
solo pool), so no server is needed. Fourteen simulated days are produced by moving the SDK's clock
back: each day's spans are the SDK's own, stamped on that day. The task calls
``summarise_document`` once per document under a span carrying ``code.function.name`` and
``code.namespace`` (the application's own span, as code instrumented by hand records it).

Expected: ``summarise_document`` is a ``shared_operation`` from day 10 (0% of its calls on the hot
path then, the share the SDK's spans hold now), and ``POST /summaries/now`` reaches it with no
latency target (``no_latency_target`` from day 10). The figures are read off the SDK's spans (an
``InMemorySpanExporter`` beside the exporter writing the store)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import opentelemetry.sdk.trace as sdk_trace
import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker
from fastapi import FastAPI
from fastapi.testclient import TestClient
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from analytics import drift_report
from collectors.exporter import ClickHouseSpanExporter
from storage import Store

SERVICE = "summary-app"
DAYS = 14
HOT_FROM_DAY = 10
DOCS_PER_RUN = 20
REQUESTS_PER_DAY = 26
DAY_NS = 86_400 * 10**9


class ShiftedClock:
    """``time.time_ns`` moved back by ``offset_ns``: the SDK stamps its spans on a simulated day."""

    def __init__(self) -> None:
        self.offset_ns = 0

    def __call__(self) -> int:
        return time.time_ns() - self.offset_ns


@pytest.fixture
def traced(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[TracerProvider, InMemorySpanExporter, ShiftedClock]]:
    clock = ShiftedClock()
    monkeypatch.setattr(sdk_trace, "time_ns", clock)
    memory = InMemorySpanExporter()
    tp = TracerProvider(resource=Resource.create({"service.name": SERVICE}))
    tp.add_span_processor(SimpleSpanProcessor(memory))
    tp.add_span_processor(SimpleSpanProcessor(ClickHouseSpanExporter(store)))
    CeleryInstrumentor().instrument(tracer_provider=tp)
    try:
        yield tp, memory, clock
    finally:
        CeleryInstrumentor().uninstrument()
        tp.shutdown()


def _apps(tp: TracerProvider) -> tuple[Celery, Any, FastAPI]:
    celery = Celery("summaries", broker="memory://", backend="cache+memory://")
    celery.conf.update(task_default_queue="summaries", broker_connection_retry_on_startup=False)
    tracer = tp.get_tracer("summaries")

    def summarise_document(doc: int) -> str:
        with tracer.start_as_current_span(
            "summarise_document",
            attributes={"code.function.name": "summarise_document", "code.namespace": "summaries.tasks"},
        ):
            return f"summary of {doc}"

    @celery.task(name="summaries.tasks.summarise")
    def summarise(docs: list[int]) -> list[str]:
        return [summarise_document(d) for d in docs]

    api = FastAPI()

    @api.post("/summaries/now")
    def summarise_now(doc: int) -> dict[str, str]:
        # Synchronously, in the request: the task's code run eagerly for one document.
        return {"summary": summarise.apply(args=[[doc]]).get()[0]}

    FastAPIInstrumentor.instrument_app(api, tracer_provider=tp)
    return celery, summarise, api


def _run_days(tp: TracerProvider, clock: ShiftedClock, first_day_ns: int) -> None:
    celery, summarise, api = _apps(tp)
    tracer = tp.get_tracer("scheduler")
    with start_worker(celery, pool="solo", perform_ping_check=False), TestClient(api) as client:
        for day in range(DAYS):
            # Day ``day`` starts at first_day_ns; one hour in, the nightly run enqueues its batch.
            clock.offset_ns = time.time_ns() - (first_day_ns + day * DAY_NS + 3600 * 10**9)
            with tracer.start_as_current_span("nightly-summaries"):
                result = summarise.delay(list(range(DOCS_PER_RUN)))
            assert len(result.get(timeout=30)) == DOCS_PER_RUN
            if day >= HOT_FROM_DAY:
                for i in range(REQUESTS_PER_DAY):
                    response = client.post("/summaries/now", params={"doc": i})
                    assert response.status_code == 200, response.text


def _path(span: ReadableSpan, by_id: dict[int, ReadableSpan]) -> str:
    """'hot' when the span's trace root is the FastAPI server span and no Consumer span delivered by a
    queue (its parent a Producer) lies between them; else 'cold'."""
    node = span
    while node.parent is not None and node.parent.span_id in by_id:
        parent = by_id[node.parent.span_id]
        if node.kind.name == "CONSUMER" and parent.kind.name == "PRODUCER":
            return "cold"
        node = parent
    return "hot" if node.kind.name == "SERVER" else "cold"


def test_a_celery_task_shared_with_a_fastapi_handler_is_found_with_its_first_day(
    store: Store, traced: tuple[TracerProvider, InMemorySpanExporter, ShiftedClock]
) -> None:
    tp, memory, clock = traced
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    start = today - timedelta(days=DAYS + 1)
    first_day_ns = int(start.timestamp()) * 10**9
    _run_days(tp, clock, first_day_ns)
    spans = memory.get_finished_spans()
    by_id = {s.context.span_id: s for s in spans}

    # The spans as the instrumentations made them: the nightly run's consumer below its producer, the
    # handler's eager run right under the server span.
    kinds = Counter((s.name, s.kind.name) for s in spans)
    assert (
        kinds[("run/summaries.tasks.summarise", "CONSUMER")]
        == DAYS + (DAYS - HOT_FROM_DAY) * REQUESTS_PER_DAY
    )
    assert kinds[("apply_async/summaries.tasks.summarise", "PRODUCER")] == DAYS
    assert kinds[("POST /summaries/now", "SERVER")] == (DAYS - HOT_FROM_DAY) * REQUESTS_PER_DAY

    findings = drift_report(store, start + timedelta(days=DAYS), days=DAYS)
    got = {(f.kind, f.operation or f.queue): f for f in findings}
    shared = got.get(("shared_operation", "summarise_document (summaries.tasks.summarise_document)"))
    assert shared is not None, [f.to_dict() for f in findings]
    no_target = got.get(("no_latency_target", "POST /summaries/now"))
    assert no_target is not None, [f.to_dict() for f in findings]
    assert {f.kind for f in findings} == {"shared_operation", "no_latency_target"}
    assert shared.since == start + timedelta(days=HOT_FROM_DAY)
    assert no_target.since == start + timedelta(days=HOT_FROM_DAY)
    assert shared.service == no_target.service == SERVICE

    # Its hot share then and now, counted from the SDK's spans of the first and last three days.
    def share(lo: int, hi: int) -> tuple[float, Counter[str]]:
        calls = Counter(
            _path(s, by_id)
            for s in spans
            if s.name == "summarise_document"
            and first_day_ns + lo * DAY_NS <= (s.start_time or 0) < first_day_ns + hi * DAY_NS
        )
        return calls["hot"] / (calls["hot"] + calls["cold"]), calls

    then, _ = share(0, 3)
    now, calls_now = share(DAYS - 3, DAYS)
    assert then == 0.0 and shared.evidence["hot_share_then"] == 0.0
    assert shared.evidence["hot_share_now"] == pytest.approx(now)
    assert shared.evidence["hot_calls_per_day_now"] == pytest.approx(calls_now["hot"] / 3)
    requests_now = sum(
        1
        for s in spans
        if s.name == "POST /summaries/now" and (s.start_time or 0) >= first_day_ns + (DAYS - 3) * DAY_NS
    )
    assert no_target.evidence["requests"] == (DAYS - HOT_FROM_DAY) * REQUESTS_PER_DAY
    assert no_target.evidence["requests_per_day_now"] == pytest.approx(requests_now / 3)
