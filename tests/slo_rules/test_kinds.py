"""The rule kinds' registry and the frames they read, on small synthetic analyses."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import polars as pl
import pytest

from slo_rules.engine import DEFAULT_DASHBOARD_URL, evaluate_with
from slo_rules.kinds import EVALUATORS
from slo_rules.rules import RULE_KINDS, rules_from_text
from storage import Store

T = datetime(2026, 11, 2, 0, 0, tzinfo=UTC)


@dataclass
class FrameSource:
    """An analysis made of the given frames only (a frame it lacks is a wrong name)."""

    frames: dict[str, pl.DataFrame] = field(default_factory=dict)

    def analysis(
        self, start: datetime, end: datetime, bs: datetime | None = None, be: datetime | None = None
    ) -> Any:
        return SimpleNamespace(**self.frames)

    def good_total(self, start: datetime, end: datetime, threshold_ms: float) -> pl.DataFrame:
        return pl.DataFrame(schema={"service": pl.String, "operation": pl.String, "good": pl.Int64})


def test_every_rule_kind_has_an_evaluator() -> None:
    assert sorted(EVALUATORS) == sorted(RULE_KINDS)


RETRIES = """
rules:
  - name: retries
    kind: retry_amplification
    workflow: claims-*
    window: 1h
    max_attempt_amplification: 1.03
"""


def _retry_frames(**extra: list[Any]) -> dict[str, pl.DataFrame]:
    return {
        "retry_amplification": pl.DataFrame(
            {
                "workflow": ["claims-triage"],
                "runs": [100],
                "attempt_amplification": [1.05],
                "token_amplification": [1.01],
                "modeled_amplification": [1.1576],
                **extra,
            }
        ),
        "retry_hops": pl.DataFrame({"workflow": ["claims-triage"], "hop": ["extract"], "retry_rate": [0.05]}),
    }


@pytest.mark.parametrize(
    ("extra", "exemplar"),
    [
        ({"exemplar_trace_id": ["c" * 32]}, "c" * 32),
        ({"exemplar_trace_id": [""]}, None),  # no run was retried: nothing to open
        ({}, None),  # an analysis from before the column existed
    ],
)
def test_retry_alerts_carry_the_most_retried_run(
    store: Store, extra: dict[str, list[Any]], exemplar: str | None
) -> None:
    result = evaluate_with(store, rules_from_text(RETRIES), T, FrameSource(_retry_frames(**extra)))
    assert result.errors == []
    (storm,) = result.fired
    assert storm.annotations.get("exemplar_trace_ids") == exemplar
    assert "1.050× attempts (limit 1.03×)" in storm.annotations["summary"]
    assert "retries by hop: extract 5.0%" in storm.annotations["summary"]


RELEASE_P99 = """
rules:
  - name: release-p99
    kind: p99_regression
    window: 1d
    baseline: previous_release
"""


def test_a_missing_frame_is_an_error_naming_it(store: Store) -> None:
    result = evaluate_with(store, rules_from_text(RELEASE_P99), T, FrameSource(_retry_frames()))
    (error,) = result.errors
    assert error.startswith("rule release-p99: AttributeError") and "'releases'" in error


def test_an_empty_frame_is_no_alert(store: Store) -> None:
    empty = {"releases": pl.DataFrame(schema={"service": pl.String, "operation": pl.String})}
    result = evaluate_with(store, rules_from_text(RELEASE_P99), T, FrameSource(empty))
    assert result.errors == [] and result.alerts == []


def test_naive_times_are_utc_and_the_environment_is_not_read(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Settings are resolved by the caller (tailwatch.config); the engine takes its argument or default.
    monkeypatch.setenv("TAILWATCH_DASHBOARD_URL", "http://elsewhere.example/dashboards")
    source = FrameSource(_retry_frames())
    result = evaluate_with(store, rules_from_text(RETRIES), T.replace(tzinfo=None), source)
    assert result.at == T
    (storm,) = result.fired
    assert storm.starts_at == T
    assert storm.annotations["dashboard"] == DEFAULT_DASHBOARD_URL + "/retries.html"
    (notification,) = result.notifications
    assert notification.external_url == DEFAULT_DASHBOARD_URL
