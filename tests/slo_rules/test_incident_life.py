"""An alert over an incident's whole life, on synthetic analyses with a known answer: the baseline
it fired against is frozen, it resolves only once p99 is back near that baseline (hysteresis), its
fired text is never rewritten, the resolved state quotes the numbers that resolved it; a dry run
changes nothing; every rule says why it is where it is."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import polars as pl
import pytest

from analytics import FRAME_SCHEMAS
from slo_rules import RuleError, WebhookConfig, last_evaluation, list_alerts
from slo_rules.engine import evaluate_with
from slo_rules.outbox import outbox_rows
from slo_rules.rules import rules_from_text
from storage import Store

T = datetime(2026, 11, 2, 6, 0, tzinfo=UTC)
MINUTE = timedelta(minutes=1)

RULES = rules_from_text(
    """
rules:
  - name: chat-p99
    kind: p99_regression
    service: chat-api
    operation: "POST /chat"
    window: 10m
    baseline: previous
    min_increase: {relative: 0.25, absolute_ms: 250}
    min_requests: 200
    severity: page
"""
)


class SlidingSource:
    """p99 per minute of one operation; an analysis of [start, end) reports the p99 of its last
    minute as the current p99 and that of the minute before ``start`` as the baseline's (a sliding
    previous window), with the requests given."""

    def __init__(
        self, p99: dict[int, float], requests: int = 500, baseline_requests: int | None = None
    ) -> None:
        self.p99 = p99
        self.requests = requests
        self.baseline_requests = requests if baseline_requests is None else baseline_requests

    def at(self, minute: int) -> float:
        keys = [k for k in sorted(self.p99) if k <= minute]
        return self.p99[keys[-1]] if keys else self.p99[min(self.p99)]

    def analysis(
        self, start: datetime, end: datetime, bs: datetime | None = None, be: datetime | None = None
    ) -> Any:
        last = int((end - T) / MINUTE) - 1
        before = int((start - T) / MINUTE) - 1
        base, cur = self.at(before), self.at(last)
        frames = {name: pl.DataFrame(schema=schema) for name, schema in FRAME_SCHEMAS.items()}
        frames["attribution"] = pl.DataFrame(
            {
                "service": ["chat-api"],
                "operation": ["POST /chat"],
                "baseline_p99_ms": [base],
                "current_p99_ms": [cur],
                "delta_ms": [cur - base],
                "llm_share": [1.0],
                "internal_share": [0.0],
                "verdict": ["llm" if cur - base > 0 else "none"],
                "llm_delta_ms": [cur - base],
                "internal_delta_ms": [0.0],
                "baseline_requests": [self.baseline_requests],
                "current_requests": [self.requests],
                "exemplar_trace_ids": [["a" * 32]],
            }
        )
        return SimpleNamespace(
            **frames,
            baseline_start=bs or start - (end - start),
            baseline_end=be or start,
            start=start,
            end=end,
        )

    def good_total(self, start: datetime, end: datetime, threshold_ms: float) -> pl.DataFrame:
        raise AssertionError("not used")


def _at(minute: int) -> datetime:
    return T + minute * MINUTE


def test_the_baseline_freezes_when_it_fires_and_it_resolves_only_near_it(store: Store) -> None:
    # p99 236 ms until minute 10, then 1.8 s; from minute 25, 1.5 s (the sliding window before it
    # holds the incident: 1.8 → 1.5 s is no regression of it); from minute 40, back to 300 ms.
    source = SlidingSource({0: 236.0, 10: 1800.0, 25: 1500.0, 40: 300.0, 50: 240.0})
    fired = evaluate_with(store, RULES, _at(11), source)
    (alert,) = fired.fired
    notes = dict(alert.annotations)
    assert notes["baseline_p99_ms"] == "236.0" and notes["current_p99_ms"] == "1800.0"
    assert notes["baseline_window"] == "2026-11-02T05:51:00Z/2026-11-02T06:01:00Z"
    for minute in (12, 20, 26, 35):
        later = evaluate_with(store, RULES, _at(minute), source)
        assert later.resolved == [] and [a.fingerprint for a in later.firing] == [alert.fingerprint], minute
        (explained,) = later.explanations
        assert explained.verdict == "firing" and "frozen when it fired" in explained.reason
        # The text on-call was paged with is never rewritten.
        assert later.firing[0].annotations == notes
    # 300 ms is +64 ms over the frozen 236 ms: under the 125 ms resolve bar (half of 250 ms).
    resolved = evaluate_with(store, RULES, _at(41), source)
    (gone,) = resolved.resolved
    assert gone.fingerprint == alert.fingerprint
    assert {k: v for k, v in gone.annotations.items() if k != "resolved"} == notes
    assert gone.annotations["resolved"].startswith("p99 236 ms → 300 ms vs its baseline of 05:51–06:01")
    assert "resolves below +125 ms and +12%" in gone.annotations["resolved"]
    (row,) = list_alerts(store, include_resolved_since=T).iter_rows(named=True)
    assert row["state"] == "resolved"


def test_without_the_frozen_baseline_the_sliding_window_would_have_resolved_it(store: Store) -> None:
    # The same numbers judged against the previous window only: 1.5 s vs 1.8 s before it. This is
    # what the frozen baseline prevents (and what a new alert sees).
    source = SlidingSource({0: 1800.0, 25: 1500.0})
    result = evaluate_with(store, RULES, _at(26), source)
    assert result.fired == [] and result.explanations[0].verdict == "quiet"
    assert result.explanations[0].reason.startswith("p99 1.8 s → 1.5 s vs the previous 10m")


def test_hysteresis_is_configurable_and_never_above_the_bar_to_fire() -> None:
    rules = rules_from_text(
        "rules:\n  - {name: r, kind: p99_regression, min_increase: {relative: 0.2, absolute_ms: 200},\n"
        "     resolve_increase: {relative: 0.05, absolute_ms: 50}}\n"
    )
    rule = rules.rules[0]
    assert (rule.resolve.relative, rule.resolve.absolute_ms) == (0.05, 50)  # type: ignore[union-attr]
    with pytest.raises(RuleError, match="resolve_increase must not exceed min_increase"):
        rules_from_text(
            "rules:\n  - {name: r, kind: p99_regression, min_increase: {relative: 0.2, absolute_ms: 200},\n"
            "     resolve_increase: {relative: 0.3, absolute_ms: 50}}\n"
        )


def test_too_little_data_is_said_and_never_resolves_a_firing_alert(store: Store) -> None:
    source = SlidingSource({0: 236.0, 10: 1800.0}, baseline_requests=0)
    quiet = evaluate_with(store, RULES, _at(11), source)
    (why,) = quiet.explanations
    assert (why.verdict, why.reason) == ("skipped", "no baseline data (0 requests)")
    source.baseline_requests = 500
    (alert,) = evaluate_with(store, RULES, _at(12), source).fired
    source.requests = 20  # traffic drops mid-incident
    later = evaluate_with(store, RULES, _at(13), source)
    assert later.resolved == [] and later.firing[0].fingerprint == alert.fingerprint
    (why,) = later.explanations
    assert (
        why.verdict == "firing"
        and why.reason == "current 20 requests < 200 — too few to judge, it stays firing"
    )


def test_a_dry_run_changes_nothing_and_says_what_would_be_sent(store: Store) -> None:
    hook = WebhookConfig(url="http://127.0.0.1:9/hook")
    source = SlidingSource({0: 236.0, 10: 1800.0})
    dry = evaluate_with(store, RULES, _at(11), source, notifiers=[hook], dry_run=True)
    assert [a.alertname for a in dry.fired] == ["chat-p99"] and dry.would_send == 1 and dry.enqueued == 0
    assert "dashboard" not in dry.fired[0].annotations  # nothing persisted to link to
    assert "would be enqueued (dry run: nothing changed)" in str(dry)
    assert list_alerts(store, include_resolved_since=T).is_empty()
    assert outbox_rows(store) == [] and last_evaluation(store) is None
    real = evaluate_with(store, RULES, _at(11), source, notifiers=[hook])
    assert [a.alertname for a in real.fired] == ["chat-p99"] and real.enqueued == 1
    assert last_evaluation(store) == _at(11)


def test_rules_with_nothing_to_judge_say_so(store: Store) -> None:
    rules = rules_from_text(
        """
rules:
  - {name: other-op, kind: p99_regression, service: other, window: 10m}
  - {name: queues, kind: cold_path_starvation, window: 1h}
"""
    )
    result = evaluate_with(store, rules, _at(11), SlidingSource({0: 236.0}))
    assert [(e.rule, e.verdict, e.reason) for e in result.explanations] == [
        ("other-op", "skipped", "no request of a selected operation in the last 10m"),
        ("queues", "skipped", "no job on a selected queue in the last 1h"),
    ]
