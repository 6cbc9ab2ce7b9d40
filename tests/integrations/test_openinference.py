"""Flavour ``openinference`` (Arize OpenInference instrumentation): see ``apps/openinference.py``."""

from __future__ import annotations

from tests.integrations.apps.openinference import FLAVOUR as APP
from tests.integrations.contract import FlavourContract, hop_names, llm_span_shapes, workflow_span_shapes
from tests.integrations.truth import Truth

FLAVOUR = APP.name


class TestOpenInference(FlavourContract):
    service = APP.service

    def test_span_shapes(self, truth: Truth) -> None:
        assert llm_span_shapes(truth) == {
            ("ChatCompletion", "INTERNAL", "openinference.instrumentation.openai", "children"),
            ("anthropic.messages.create", "CLIENT", "com.anthropic.sdk.python", "children"),
        }
        assert workflow_span_shapes(truth) == {("claims-triage", "INTERNAL", "claims.agents")}
        assert hop_names(truth) == {"ChatCompletion", "extract fields"}
