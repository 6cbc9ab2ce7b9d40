"""Flavour ``traceloop`` (Traceloop / OpenLLMetry instrumentations): see ``apps/traceloop.py``."""

from __future__ import annotations

from tests.integrations.apps.traceloop import FLAVOUR as APP
from tests.integrations.contract import FlavourContract, hop_names, llm_span_shapes, workflow_span_shapes
from tests.integrations.truth import Truth

FLAVOUR = APP.name


class TestTraceloop(FlavourContract):
    service = APP.service

    def test_span_shapes(self, truth: Truth) -> None:
        assert llm_span_shapes(truth) == {
            ("openai.chat", "CLIENT", "opentelemetry.instrumentation.openai.v1", "children"),
            # One Anthropic call, two LLM spans: Traceloop's (no attempts below it) and, beside it, the
            # Anthropic SDK's own (on by default since anthropic 2), which holds the HTTP attempts.
            ("anthropic.chat", "CLIENT", "opentelemetry.instrumentation.anthropic", "none"),
            ("anthropic.messages.create", "CLIENT", "com.anthropic.sdk.python", "children"),
        }
        assert workflow_span_shapes(truth) == {("claims-triage.workflow", "INTERNAL", "traceloop.tracer")}
        assert hop_names(truth) == {"openai.chat", "extract fields"}
