"""The rule kinds: one module each, a function from a rule and the evaluation context to candidates.

``EVALUATORS`` is keyed by the ``kind`` a rule file names (the ``RuleKind`` literal pydantic selects
the rule's model by), so a rule always meets the evaluator written for its model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from slo_rules.kinds import (
    abandonment,
    architecture_drift,
    cold_path_starvation,
    latency_slo,
    llm_cost,
    p99_regression,
    release_coupling,
    retry_amplification,
    slice_regression,
)
from slo_rules.kinds._common import Candidate, Context
from slo_rules.kinds.latency_slo import burn_rate
from slo_rules.rules import AnyRule, RuleKind

__all__ = ["EVALUATORS", "Candidate", "Context", "Evaluator", "burn_rate", "candidates"]

# Each evaluator takes its own rule model; ``Any`` lets one mapping hold them all.
Evaluator = Callable[[Any, Context], list[Candidate]]

EVALUATORS: Mapping[RuleKind, Evaluator] = {
    "latency_slo": latency_slo.candidates,
    "p99_regression": p99_regression.candidates,
    "release_coupling": release_coupling.candidates,
    "cold_path_starvation": cold_path_starvation.candidates,
    "abandonment": abandonment.candidates,
    "retry_amplification": retry_amplification.candidates,
    "slice_regression": slice_regression.candidates,
    "architecture_drift": architecture_drift.candidates,
    "llm_cost_regression": llm_cost.cost_candidates,
    "llm_cache_drop": llm_cost.cache_candidates,
}


def candidates(rule: AnyRule, ctx: Context) -> list[Candidate]:
    """What ``rule`` sees at ``ctx.at``: one candidate per alert it raises or checks."""
    return EVALUATORS[rule.kind](rule, ctx)
