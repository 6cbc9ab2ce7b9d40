"""Burn-rate tiers and the alert lifecycle on synthetic counts with a known answer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import polars as pl
import pytest

from analytics import FRAME_SCHEMAS
from slo_rules import WebhookConfig, list_alerts
from slo_rules.engine import evaluate_with
from slo_rules.kinds import burn_rate
from slo_rules.outbox import outbox_rows
from slo_rules.rules import rules_from_text
from slo_rules.state import advance, fingerprint
from storage import Store, open_store

T = datetime(2026, 11, 2, 0, 0, tzinfo=UTC)


@dataclass
class SyntheticSource:
    """Per-minute traffic of one operation: ``rate`` requests, ``bad(minute)`` of them slow."""

    rate: int
    bad: Callable[[int], float]
    active: Callable[[int], bool] | None = None  # minutes with traffic (default: all)
    analysis_frames: dict[str, pl.DataFrame] = field(default_factory=dict)
    calls: list[tuple[datetime, datetime]] = field(default_factory=list)

    def good_total(self, start: datetime, end: datetime, threshold_ms: float) -> pl.DataFrame:
        self.calls.append((start, end))
        first = int((start - T).total_seconds() // 60)
        last = int((end - T).total_seconds() // 60)
        total = sum(self.requests(m) for m in range(first, last))
        bad = sum(self.bad(m) * self.requests(m) for m in range(first, last))
        return pl.DataFrame(
            {"service": ["chat-api"], "operation": ["POST /chat"], "good": [total - bad], "total": [total]}
        )

    def requests(self, minute: int) -> int:
        return self.rate if self.active is None or self.active(minute) else 0

    def analysis(
        self, start: datetime, end: datetime, bs: datetime | None = None, be: datetime | None = None
    ) -> Any:
        # Every frame of a real analysis, empty unless the test gives it.
        empty = {name: pl.DataFrame(schema=schema) for name, schema in FRAME_SCHEMAS.items()}
        return SimpleNamespace(**(empty | self.analysis_frames))


SLO = """
rules:
  - name: chat-slo
    kind: latency_slo
    service: chat-api
    operation: "POST /chat"
    threshold_ms: 1000
    target: 0.999
    window: 30d
    severity: page
"""


def _run(store: Store, source: SyntheticSource, minutes: range) -> dict[str, list[tuple[str, int]]]:
    """Evaluate every 5 minutes; per tier (slo_window label) the transitions with their minute."""
    rules = rules_from_text(SLO)
    seen: dict[str, list[tuple[str, int]]] = {}
    for minute in minutes:
        result = evaluate_with(store, rules, T + timedelta(minutes=minute), source)
        for state in result.fired:
            seen.setdefault(state.labels["slo_window"], []).append(("firing", minute))
        for state in result.resolved:
            seen.setdefault(state.labels["slo_window"], []).append(("resolved", minute))
    return seen


def test_burn_rate_math() -> None:
    assert burn_rate(990, 1000, 0.999) == pytest.approx(10.0)
    assert burn_rate(1000, 1000, 0.99) == 0.0
    assert burn_rate(0, 0, 0.99) == 0.0


def test_fast_burn_pages_once_and_suppresses_slower_tiers(store: Store) -> None:
    # 2% slow for three hours = 20× the 0.1% budget. 1h/5m (14.4×) fires when 43.2 of the last 60
    # minutes burned (first 5-minute tick: +45) and resolves when the 5 m window is clean (+185).
    # 6h/30m (6×) would fire from +110 but the page already covers it; 1d and 3d never reach 3× / 1×.
    source = SyntheticSource(rate=100, bad=lambda m: 0.02 if 0 <= m < 180 else 0.0)
    seen = _run(store, source, range(-10, 305, 5))
    assert seen == {"1h": [("firing", 45), ("resolved", 185)]}
    (row,) = list_alerts(store, include_resolved_since=T).iter_rows(named=True)
    assert row["state"] == "resolved" and row["severity"] == "page"
    assert "error budget burning" in row["summary"] and "over 1h" in row["summary"]


def test_slow_burn_tickets_from_the_6h_tier(store: Store) -> None:
    # 1% slow (10×) for 8 hours: 1h never reaches 14.4×; 6h/30m fires at the first tick with
    # 10·m/360 ≥ 6 (m ≥ 216 → +220) and resolves when the last 30 minutes burn < 6× (+495);
    # 1d/2h and 3d/6h qualify from +435 but stay suppressed behind it.
    source = SyntheticSource(rate=100, bad=lambda m: 0.01 if 0 <= m < 480 else 0.0)
    seen = _run(store, source, range(200, 545, 5))
    assert seen == {"6h": [("firing", 220), ("resolved", 495)]}
    # Windows are evaluated once per distinct length, not once per tier and window.
    per_eval = {(e - s) for s, e in source.calls}
    assert per_eval == {timedelta(hours=h) for h in (1, 6, 24, 72)} | {
        timedelta(minutes=5),
        timedelta(minutes=30),
        timedelta(hours=2),
    }


def test_low_traffic_is_guarded_by_min_events(store: Store) -> None:
    # Twenty requests in twenty minutes, every one slow: a 1000× burn, on too few events to page.
    source = SyntheticSource(rate=1, bad=lambda m: 1.0, active=lambda m: 0 <= m < 20)
    assert _run(store, source, range(0, 40, 5)) == {}


REGRESSION = """
rules:
  - name: p99
    kind: p99_regression
    window: 1h
    min_increase: {relative: 0.2, absolute_ms: 100}
    min_requests: 100
    for: 10m
"""


def _attribution(delta: float, verdict: str = "llm") -> dict[str, pl.DataFrame]:
    return {
        "attribution": pl.DataFrame(
            {
                "service": ["chat-api"],
                "operation": ["POST /chat"],
                "baseline_p99_ms": [1200.0],
                "current_p99_ms": [1200.0 + delta],
                "delta_ms": [delta],
                "llm_share": [0.87],
                "internal_share": [0.13],
                "verdict": [verdict],
                "llm_delta_ms": [delta * 0.87],
                "internal_delta_ms": [delta * 0.13],
                "baseline_requests": [500],
                "current_requests": [500],
                "exemplar_trace_ids": [["a" * 32]],
            }
        ),
        "attribution_spans": pl.DataFrame(
            {
                "service": ["chat-api", "chat-api"],
                "operation": ["POST /chat", "POST /chat"],
                "span_name": ["chat gpt-4o", "rerank"],
                "class": ["llm", "internal"],
                "provider": ["openai", ""],
                "model": ["gpt-4o", ""],
                "delta_ms": [delta * 0.87, delta * 0.13],
            }
        ),
    }


def test_pending_for_then_firing_restart_repeat_and_resolve(store_dsn: str) -> None:
    rules = rules_from_text(REGRESSION)
    hook = WebhookConfig("http://127.0.0.1:9/hook")
    source = SyntheticSource(rate=1, bad=lambda m: 0.0, analysis_frames=_attribution(2200.0))
    with open_store(store_dsn) as store:
        from storage import ensure_schema

        ensure_schema(store)
        first = evaluate_with(store, rules, T, source, notifiers=[hook])
        assert [a.state for a in first.alerts] == ["pending"] and first.enqueued == 0
        assert evaluate_with(store, rules, T + timedelta(minutes=5), source, notifiers=[hook]).fired == []
        fired = evaluate_with(store, rules, T + timedelta(minutes=10), source, notifiers=[hook])
        (alert,) = fired.fired
        assert alert.starts_at == T  # active since the first evaluation that saw it
        assert alert.annotations["summary"] == (
            "chat-api: p99 of POST /chat 1.2 s → 3.4 s; 87% of the increase is in LLM spans "
            "(openai gpt-4o), internal +286 ms"
        )
        assert alert.fingerprint == fingerprint(alert.labels)
        assert fired.enqueued == 1
    # A restart (new process state, same store) neither pages again nor forgets.
    with open_store(store_dsn) as store:
        again = evaluate_with(store, rules, T + timedelta(minutes=15), source, notifiers=[hook])
        assert again.fired == [] and again.enqueued == 0 and [a.state for a in again.alerts] == ["firing"]
        # Still firing four hours after the notification: one repeat.
        repeat = evaluate_with(store, rules, T + timedelta(hours=4, minutes=10), source, notifiers=[hook])
        assert [a.fingerprint for a in repeat.repeated] == [alert.fingerprint] and repeat.enqueued == 1
        assert (
            evaluate_with(store, rules, T + timedelta(hours=4, minutes=15), source, notifiers=[hook]).enqueued
            == 0
        )
        source.analysis_frames = _attribution(10.0)
        done = evaluate_with(store, rules, T + timedelta(hours=5), source, notifiers=[hook])
        assert [a.fingerprint for a in done.resolved] == [alert.fingerprint] and done.enqueued == 1
        rows = outbox_rows(store)
        assert len(rows) == 3 and len({r.id for r in rows}) == 3
        assert [r.notification.count('"status":"resolved"') > 0 for r in rows] == [False, False, True]


def test_pending_that_clears_never_notifies() -> None:
    labels = {"alertname": "x", "severity": "page"}
    state, transition = advance(
        None,
        True,
        T,
        for_=timedelta(minutes=10),
        repeat_interval=timedelta(hours=4),
        labels=labels,
        annotations={},
        rule="x",
    )
    assert state is not None and state.state == "pending" and transition is None
    cleared, transition = advance(
        state,
        False,
        T + timedelta(minutes=5),
        for_=timedelta(minutes=10),
        repeat_interval=timedelta(hours=4),
        labels=labels,
        annotations={},
        rule="x",
    )
    assert cleared is not None and cleared.state == "inactive" and transition is None


def test_fingerprint_is_order_independent() -> None:
    a = fingerprint({"alertname": "x", "service": "s"})
    assert a == fingerprint({"service": "s", "alertname": "x"}) and len(a) == 16
    assert a != fingerprint({"alertname": "x", "service": "t"})


def test_readers_on_a_store_without_alert_tables(raw_store: Store) -> None:
    from slo_rules import alert_history

    assert list_alerts(raw_store).is_empty()
    assert "cause" in list_alerts(raw_store).columns
    assert alert_history(raw_store, T, T + timedelta(days=1)).columns[:4] == [
        "fingerprint",
        "alertname",
        "status",
        "at",
    ]


def _two_operations(delta: float) -> dict[str, pl.DataFrame]:
    frames = _attribution(delta)
    return {
        name: pl.concat([frame, frame.with_columns(pl.lit("POST /reply").alias("operation"))])
        for name, frame in frames.items()
    }


def test_grouping_and_per_alert_pagerduty_events(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    from slo_rules import PagerDutyConfig

    monkeypatch.setenv("TW_KEY", "k")
    rules = rules_from_text(REGRESSION.replace("    for: 10m\n", ""))
    hook, pd = (
        WebhookConfig("http://127.0.0.1:9/a"),
        PagerDutyConfig("TW_KEY", url="http://127.0.0.1:9/v2/enqueue"),
    )
    source = SyntheticSource(rate=1, bad=lambda m: 0.0, analysis_frames=_two_operations(900.0))
    result = evaluate_with(store, rules, T, source, notifiers=[hook, pd])
    assert len(result.fired) == 2 and result.enqueued == 3
    (grouped,) = result.notifications
    assert grouped.group_key == '{}:{alertname="p99"}' and len(grouped.alerts) == 2
    assert grouped.common_labels == {
        "alertname": "p99",
        "path": "hot",
        "service": "chat-api",
        "severity": "ticket",
    }
    rows = outbox_rows(store)
    assert sorted(r.notifier for r in rows) == ["pagerduty", "pagerduty", "webhook"]
    assert len({r.id for r in rows}) == 3


class _Broken(SyntheticSource):
    def analysis(
        self, start: datetime, end: datetime, bs: datetime | None = None, be: datetime | None = None
    ) -> Any:
        raise RuntimeError("analysis exploded")


def test_a_failing_rule_keeps_its_alerts_and_spares_the_others(store: Store) -> None:
    rules = rules_from_text(REGRESSION.replace("    for: 10m\n", "") + SLO.replace("rules:\n", ""))
    healthy = SyntheticSource(rate=100, bad=lambda m: 0.0, analysis_frames=_attribution(900.0))
    assert [a.alertname for a in evaluate_with(store, rules, T, healthy).fired] == ["p99"]
    broken = _Broken(rate=100, bad=lambda m: 0.02)
    result = evaluate_with(store, rules, T + timedelta(hours=1, minutes=30), broken)
    assert result.errors == ["rule p99: RuntimeError: analysis exploded"]
    assert result.resolved == []  # the p99 alert is not resolved by an outage of its data
    # The SLO rule still ran (it reads good/total): its 1h tier fires, explained as far as possible.
    (slo,) = result.fired
    assert slo.labels["slo_window"] == "1h" and slo.annotations["cause"] == "none"
    assert "analysis exploded" in slo.annotations["attribution_error"]
    assert {a.alertname for a in result.firing} == {"p99", "chat-slo"}
