"""Flavour ``traceloop``: Traceloop / OpenLLMetry instrumentations, without the Traceloop SDK.

OpenAI through Traceloop's ``opentelemetry-instrumentation-openai`` (``OpenAIInstrumentor`` of
``opentelemetry.instrumentation.openai``), Anthropic through Traceloop's
``opentelemetry-instrumentation-anthropic`` with the Anthropic SDK's own spans left on (its default).
The workflow span is what Traceloop's ``@workflow(name=...)`` decorator makes (traceloop-sdk
``decorators/base.py``): tracer ``traceloop.tracer``, name ``<name>.workflow``, INTERNAL,
``traceloop.span.kind=workflow``, ``traceloop.entity.name=<name>``, ``traceloop.workflow.name=<name>``
(the SDK's span processor copies the workflow name from the context onto every span it starts, the
workflow span included), ``traceloop.entity.input``/``output`` (JSON); an exception is recorded and
sets status ERROR.

Observed spans (Traceloop instrumentations 0.62.4, openai 3.60, anthropic 2.17):

- LLM call: ``openai.chat`` CLIENT whatever the model, scope
  ``opentelemetry.instrumentation.openai.v1``: ``gen_ai.operation.name=chat``,
  ``gen_ai.provider.name=openai``, ``gen_ai.request.model``, ``gen_ai.response.model``,
  ``gen_ai.usage.input_tokens``/``output_tokens``/``total_tokens``, ``gen_ai.openai.api_base``,
  ``gen_ai.is_streaming``, prompt and answer in ``gen_ai.input/output.messages``. Failed call: ERROR,
  ``error.type=InternalServerError``. The span *is* current: the ``POST`` HTTP attempts are its
  children (as in ``openai_v2``).
- Anthropic: **two LLM spans per call**, siblings under the caller: Traceloop's ``anthropic.chat``
  (no HTTP attempt below it) and the Anthropic SDK's own ``anthropic.messages.create`` (scope
  ``com.anthropic.sdk.python``, on by default in anthropic ≥ 2): CLIENT,
  ``gen_ai.operation.name=chat``, ``gen_ai.provider.name=anthropic``, models, usage (``input_tokens``,
  ``output_tokens``, ``cache_read``/``cache_write``), and HTTP attributes of the call itself
  (``http.request.method``, ``http.response.status_code``, ``url.full``, ``server.address``) with
  ``http.request.resend_count`` when the SDK retried; the ``POST`` attempts are its children. So an
  LLM span that also looks like an HTTP attempt (CLIENT + ``http.request.method``), and one
  Anthropic call counted twice by any per-span count.
- Workflow: ``claims-triage.workflow`` INTERNAL, scope ``traceloop.tracer``, the attributes above;
  hops ``openai.chat`` (every step's call has this name: classify, decide and their app-level
  retries are same-name siblings) and ``extract fields``.
- FastAPI, httpx, Celery spans: as in ``openai_v2``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry.sdk.trace import TracerProvider

from tests.integrations.apps.base import Flavour, WorkflowFactory, run


def instrument(tp: TracerProvider) -> None:
    from opentelemetry.instrumentation.openai import OpenAIInstrumentor

    OpenAIInstrumentor().instrument(tracer_provider=tp)


def workflow(tp: TracerProvider) -> WorkflowFactory:
    tracer = tp.get_tracer("traceloop.tracer")

    @contextmanager
    def traceloop_workflow(name: str) -> Iterator[Any]:
        attributes = {
            "traceloop.span.kind": "workflow",
            "traceloop.entity.name": name,
            "traceloop.workflow.name": name,
            "traceloop.entity.input": json.dumps({"args": [], "kwargs": {}}),
        }
        with tracer.start_as_current_span(f"{name}.workflow", attributes=attributes) as span:
            yield span
            span.set_attribute("traceloop.entity.output", json.dumps({"status": "done"}))

    return traceloop_workflow


FLAVOUR = Flavour(
    name="traceloop",
    service="claims-api-traceloop",
    instrument=instrument,
    workflow=workflow,
    anthropic_native=True,
    traceloop_anthropic=True,
)

if __name__ == "__main__":
    run(FLAVOUR)
