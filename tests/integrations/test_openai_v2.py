"""Flavour ``openai_v2`` (official OpenTelemetry GenAI instrumentation): see ``apps/openai_v2.py``."""

from __future__ import annotations

from tests.integrations.apps.openai_v2 import FLAVOUR as APP
from tests.integrations.contract import FlavourContract, hop_names, llm_span_shapes, workflow_span_shapes
from tests.integrations.truth import Truth

FLAVOUR = APP.name


class TestOpenAIV2(FlavourContract):
    service = APP.service

    def test_span_shapes(self, truth: Truth) -> None:
        genai = "opentelemetry.util.genai.handler"
        assert llm_span_shapes(truth) == {
            ("chat gpt-4o", "CLIENT", genai, "children"),
            ("chat gpt-4o-mini", "CLIENT", genai, "children"),
            ("chat gpt-4.1-mini", "CLIENT", genai, "children"),
            # Traceloop's Anthropic span is never made current: the SDK's HTTP attempts are its siblings.
            ("anthropic.chat", "CLIENT", "opentelemetry.instrumentation.anthropic", "siblings"),
        }
        assert workflow_span_shapes(truth) == {("invoke_workflow claims-triage", "INTERNAL", genai)}
        assert hop_names(truth) == {"chat gpt-4o-mini", "extract fields"}
