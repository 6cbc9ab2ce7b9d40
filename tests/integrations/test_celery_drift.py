"""Architecture drift from the spans the real instrumentations leave: a Celery task enqueued with
``delay`` by a nightly run and, from day 10 on, also run synchronously (``apply``) inside a FastAPI
handler, under ``opentelemetry-instrumentation-celery`` and ``-fastapi``.

The broker is Celery's in-memory transport and the worker runs in this process (``start_worker``,
solo pool), so no server is needed. Fourteen simulated days are produced by moving the SDK's clock
back: each day's spans are the SDK's own, stamped on that day. The task calls
``summarise_document`` once per document under a span carrying ``code.function.name`` and
``code.namespace`` (the application's own span, as code instrumented by hand records it).

From day 11 one document of the nightly batch, and the one a request a day asks for, fails on its
first try and the task "just retries" (``self.retry``): the whole batch again, under the same task
id. The task sets its batch size on the run span (Celery records none), read through
``batch_size_attributes``.

Expected: ``summarise_document`` and the task's run are ``shared_operation`` from day 10 (0% of
their calls on the hot path then); ``POST /summaries/now`` reaches them with no latency target
(``no_latency_target`` from day 10); the task runs per request with one document
(``batch_shrinking`` from day 10); its retries reprocess the whole batch, and the requests that
asked for the bad record waited on them (``whole_batch_retry`` from day 11). The figures are read
off the SDK's spans (an ``InMemorySpanExporter`` beside the exporter writing the store)."""

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
from opentelemetry import trace
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from analytics import Conventions, drift_report
from collectors.exporter import ClickHouseSpanExporter
from storage import Store

SERVICE = "summary-app"
DAYS = 14
HOT_FROM_DAY = 10
RETRY_FROM_DAY = 11
BAD_DOC = 10_000
BATCH_ATTRIBUTE = "summaries.batch.size"
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

    def summarise_document(doc: int, attempt: int) -> str:
        with tracer.start_as_current_span(
            "summarise_document",
            attributes={"code.function.name": "summarise_document", "code.namespace": "summaries.tasks"},
        ):
            if doc == BAD_DOC and attempt == 0:
                raise ValueError("unreadable document")
            return f"summary of {doc}"

    @celery.task(bind=True, name="summaries.tasks.summarise")
    def summarise(task: Any, docs: list[int]) -> list[str]:
        # The batch size, on the run span the instrumentation opened (Celery records none).
        trace.get_current_span().set_attribute(BATCH_ATTRIBUTE, len(docs))
        try:
            return [summarise_document(d, task.request.retries) for d in docs]
        except ValueError as exc:
            # "Just retry": the whole batch again, the good documents too.
            raise task.retry(exc=exc, countdown=0, max_retries=1) from exc

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
            docs = list(range(DOCS_PER_RUN))
            if day >= RETRY_FROM_DAY:
                docs[-1] = BAD_DOC  # one bad record: the run fails and is retried whole
            with tracer.start_as_current_span("nightly-summaries"):
                result = summarise.delay(docs)
            assert len(result.get(timeout=30)) == DOCS_PER_RUN
            if day >= HOT_FROM_DAY:
                for i in range(REQUESTS_PER_DAY):
                    # One request a day asks for the bad record: its eager run is retried in the request.
                    doc = BAD_DOC if day >= RETRY_FROM_DAY and i == 0 else i
                    response = client.post("/summaries/now", params={"doc": doc})
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


def test_a_celery_task_shared_with_a_fastapi_handler_drifts_from_its_first_day(
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
    # handler's eager run right under the server span; each retry a run more, a retried nightly run
    # published again.
    retried = DAYS - RETRY_FROM_DAY
    assert (
        kinds[("run/summaries.tasks.summarise", "CONSUMER")]
        == DAYS + (DAYS - HOT_FROM_DAY) * REQUESTS_PER_DAY + 2 * retried
    )
    assert kinds[("apply_async/summaries.tasks.summarise", "PRODUCER")] == DAYS + retried
    assert kinds[("POST /summaries/now", "SERVER")] == (DAYS - HOT_FROM_DAY) * REQUESTS_PER_DAY

    conventions = Conventions(batch_size_attributes=(BATCH_ATTRIBUTE,))
    findings = drift_report(store, start + timedelta(days=DAYS), conventions, days=DAYS)
    got = {(f.kind, f.operation or f.queue): f for f in findings}
    shared = got.get(("shared_operation", "summarise_document (summaries.tasks.summarise_document)"))
    assert shared is not None, [f.to_dict() for f in findings]
    no_target = got.get(("no_latency_target", "POST /summaries/now"))
    assert no_target is not None, [f.to_dict() for f in findings]
    # The task's run itself is shared code too (run eagerly in the request, delivered by the queue).
    assert sorted(k for k in got if k[0] == "shared_operation") == [
        ("shared_operation", "run/summaries.tasks.summarise"),
        ("shared_operation", "summarise_document (summaries.tasks.summarise_document)"),
    ]
    assert {f.kind for f in findings} == {
        "shared_operation",
        "batch_shrinking",
        "whole_batch_retry",
        "no_latency_target",
    }
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

    # Batches: the runs carrying a size, per day then and now, from the SDK's spans.
    runs = [s for s in spans if s.name == "run/summaries.tasks.summarise"]
    assert all(BATCH_ATTRIBUTE in (s.attributes or {}) for s in runs)

    def day_of(span: ReadableSpan) -> int:
        return ((span.start_time or 0) - first_day_ns) // DAY_NS

    def size(span: ReadableSpan) -> int:
        return int((span.attributes or {})[BATCH_ATTRIBUTE])  # type: ignore[arg-type]

    then_runs = [s for s in runs if day_of(s) < 3]
    now_runs = [s for s in runs if day_of(s) >= DAYS - 3]
    batch = got[("batch_shrinking", "run/summaries.tasks.summarise")]
    assert batch.since == start + timedelta(days=HOT_FROM_DAY)
    assert batch.evidence["runs_per_day_then"] == pytest.approx(len(then_runs) / 3)
    assert batch.evidence["runs_per_day_now"] == pytest.approx(len(now_runs) / 3)
    assert batch.evidence["items_per_run_then"] == pytest.approx(sum(map(size, then_runs)) / len(then_runs))
    assert batch.evidence["items_per_run_now"] == pytest.approx(sum(map(size, now_runs)) / len(now_runs))

    # Retries: the runs of one task id after a failed one (celery.state RETRY/FAILURE or an error
    # status), their items against the failed items (the failed run's children with an error status).
    def failed(span: ReadableSpan) -> bool:
        state = (span.attributes or {}).get("celery.state")
        return state in ("RETRY", "FAILURE") or span.status.status_code.name == "ERROR"

    jobs: dict[str, list[ReadableSpan]] = {}
    for run in sorted(runs, key=lambda s: s.start_time or 0):
        jobs.setdefault(str((run.attributes or {})["messaging.message.id"]), []).append(run)
    retried_jobs = [tries for tries in jobs.values() if len(tries) > 1 and any(map(failed, tries))]
    failed_items = reprocessed = waited = 0
    for tries in retried_jobs:
        first = next(i for i, t in enumerate(tries) if failed(t))
        for t in tries:
            if failed(t):
                bad = sum(
                    1
                    for s in spans
                    if s.parent is not None
                    and s.parent.span_id == t.context.span_id
                    and s.status.status_code.name == "ERROR"
                )
                failed_items += max(bad, 1)
        reprocessed += sum(size(t) for t in tries[first + 1 :])
        waited += any(_path(t, by_id) == "hot" for t in tries)
    assert len(retried_jobs) == 2 * retried  # a nightly run and one request's run a day
    retry = got[("whole_batch_retry", "run/summaries.tasks.summarise")]
    assert retry.since == start + timedelta(days=RETRY_FROM_DAY)
    assert retry.evidence["retried_jobs"] == len(retried_jobs)
    assert retry.evidence["failed_items"] == failed_items
    assert retry.evidence["items_reprocessed"] == reprocessed
    assert retry.evidence["items_reprocessed_per_failed_item"] == pytest.approx(reprocessed / failed_items)
    assert retry.evidence["jobs_hot_requests_waited_on"] == waited == retried
