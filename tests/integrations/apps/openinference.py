"""Flavour ``openinference``: Arize OpenInference instrumentation.

OpenAI through ``openinference-instrumentation-openai`` (``OpenAIInstrumentor`` of
``openinference.instrumentation.openai``); Anthropic through the Anthropic SDK's own spans only. The
workflow is an OpenInference AGENT span made by app code with ``OITracer.start_as_current_span(...,
openinference_span_kind="agent")`` (what ``@tracer.agent`` does), named after the workflow.

Observed spans (openinference-instrumentation-openai 0.1.66, openinference-instrumentation 0.1.72):

- LLM call: ``ChatCompletion`` **INTERNAL** (not CLIENT), scope ``openinference.instrumentation.openai``:
  ``openinference.span.kind=LLM``, ``llm.system=openai`` (no ``llm.provider``, no ``gen_ai.*``),
  ``llm.model_name`` = the *response* model (``gpt-4o-mini-2024-07-18``; the requested model only
  inside the JSON of ``llm.invocation_parameters``), ``llm.token_count.prompt``/``completion``/``total``,
  ``input.value``/``output.value`` (full JSON), ``llm.input_messages.*``/``llm.output_messages.*``.
  A call the SDK gave up on: ERROR with an ``exception`` event, *no* ``llm.model_name`` (so its model
  is empty) and no ``error.type``. Status OK on success. The ``POST`` HTTP attempts are its children.
- Workflow: ``claims-triage`` INTERNAL, scope ``claims.agents``, ``openinference.span.kind=AGENT``,
  ``input.value``/``output.value``; no name attribute (the workflow name is the span name). ERROR
  (with an ``exception`` event) when the run failed. Hops ``ChatCompletion`` and ``extract fields``.
- Anthropic: the SDK's own ``anthropic.messages.create`` only (see ``traceloop.py``), HTTP attempts as
  its children.
- FastAPI, httpx, Celery spans: as in ``openai_v2``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry.sdk.trace import TracerProvider

from tests.integrations.apps.base import Flavour, WorkflowFactory, run


def instrument(tp: TracerProvider) -> None:
    from openinference.instrumentation.openai import OpenAIInstrumentor

    OpenAIInstrumentor().instrument(tracer_provider=tp)


def workflow(tp: TracerProvider) -> WorkflowFactory:
    from openinference.instrumentation import OITracer, TraceConfig

    tracer = OITracer(tp.get_tracer("claims.agents"), config=TraceConfig())

    @contextmanager
    def agent(name: str) -> Iterator[Any]:
        with tracer.start_as_current_span(name, openinference_span_kind="agent") as span:
            span.set_input({"workflow": name})
            yield span
            span.set_output("done")

    return agent


FLAVOUR = Flavour(
    name="openinference",
    service="claims-api-openinference",
    instrument=instrument,
    workflow=workflow,
    anthropic_native=True,
    traceloop_anthropic=False,
)

if __name__ == "__main__":
    run(FLAVOUR)
