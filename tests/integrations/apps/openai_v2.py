"""Flavour ``openai_v2``: the official OpenTelemetry GenAI instrumentation.

OpenAI through ``opentelemetry-instrumentation-openai-v2`` (``OpenAIInstrumentor`` of
``opentelemetry.instrumentation.openai_v2``, default semconv mode); the workflow span through
``opentelemetry-util-genai``'s ``TelemetryHandler.workflow(name)`` (what the util's users call).

Observed spans (openai-v2 2.4b0, util-genai 1.1b0, openai 3.60, httpx instrumentation 0.66b2):

- Request: ``POST /chat`` (``/agent``, ``/enqueue``, ``/support``) SERVER root from FastAPI, old HTTP
  conventions (``http.method``, ``http.route``, ``http.status_code``, ``http.target``); three
  INTERNAL children (``POST /chat http receive``, two ``POST /chat http send``). A 502 answer sets
  the root ERROR.
- LLM call: ``chat {request model}`` (``chat gpt-4o``), CLIENT, scope ``opentelemetry.util.genai.handler``
  (util-genai 1.1's ``is_experimental_mode()`` always returns True, so 2.4b0 takes its util-genai
  path with or without ``OTEL_SEMCONV_STABILITY_OPT_IN``):
  ``gen_ai.operation.name=chat``, ``gen_ai.provider.name=openai`` (no ``gen_ai.system``),
  ``gen_ai.request.model``, ``gen_ai.response.model`` (the dated snapshot), ``gen_ai.usage.input_tokens``
  / ``output_tokens``. A call the SDK gave up on: status ERROR, ``error.type="<class
  'openai.InternalServerError'>"`` (the ``str`` of the class), no usage, no response model.
- HTTP attempts: one ``POST`` CLIENT child of the LLM span per attempt (scope
  ``opentelemetry.instrumentation.httpx``; ``http.method``, ``http.url``, ``http.status_code``); 429/5xx
  attempts have status ERROR; between them the SDK's backoff (``retry-after-ms``). No
  ``http.request.resend_count``.
- Workflow: ``invoke_workflow claims-triage`` INTERNAL (util-genai ``handler.workflow``),
  ``gen_ai.operation.name=invoke_workflow``, ``gen_ai.workflow.name=claims-triage``; on an exception
  ERROR with ``error.type=openai.InternalServerError``. Its children: the ``chat gpt-4o-mini`` spans
  (classify, decide, and an app-level retry as a later same-name sibling of an ERROR one) and the app's
  ``extract fields`` INTERNAL span (ERROR when validation failed, then a second ``extract fields``).
- Queue: ``apply_async/claims.summarize`` PRODUCER child of the request's root
  (``messaging.destination=claim-summaries`` — not ``.name`` —, ``messaging.message.id`` = task id,
  ``celery.task_name``); ``run/claims.summarize`` CONSUMER, *child* of the producer (no links),
  ``celery.state`` SUCCESS/RETRY/FAILURE, same ``messaging.message.id``; the LLM span under it. A task
  retry publishes again from inside the first run: a second PRODUCER (same message id) child of the
  first CONSUMER (``celery.state=RETRY``, status UNSET), and the second CONSUMER under it
  (``celery.retries=1``). Everything stays in the request's trace.
- Anthropic (Traceloop ``AnthropicInstrumentor``, the SDK's own spans switched off): ``anthropic.chat``
  CLIENT, status OK, ``gen_ai.provider.name=anthropic``, ``gen_ai.operation.name=chat``, models, usage
  (also ``total_tokens``, cache tokens), prompt and answer in ``gen_ai.input/output.messages``. Its span
  is never made current: the SDK's HTTP attempts (``POST`` with 529 then 200) are its *siblings* under
  the request root, so a retried Anthropic call looks like one attempt under the truth's definition.
- ``load customer context`` INTERNAL (app) → ``GET`` CLIENT (httpx) → ``GET /internal/customers/{cid}``
  SERVER (a SERVER span that is not a root: not a request).
"""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider

from tests.integrations.apps.base import Flavour, WorkflowFactory, run


def instrument(tp: TracerProvider) -> None:
    from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor

    OpenAIInstrumentor().instrument(tracer_provider=tp)


def workflow(tp: TracerProvider) -> WorkflowFactory:
    from opentelemetry.util.genai.handler import TelemetryHandler

    handler = TelemetryHandler(tracer_provider=tp)
    return handler.workflow


FLAVOUR = Flavour(
    name="openai_v2",
    service="claims-api-otel",
    instrument=instrument,
    workflow=workflow,
    anthropic_native=False,
    traceloop_anthropic=True,
)

if __name__ == "__main__":
    run(FLAVOUR)
