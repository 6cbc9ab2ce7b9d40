"""Rule evaluation: rules + analysis → alert candidates → lifecycle → transitions → outbox.

:func:`evaluate` is stateless in-process: it reads every alert's last state from the store,
advances it, writes the new state, and enqueues one notification per transition and notifier.
Running it twice for the same instant changes nothing; a restarted process picks up where the
last one stopped.

A rule whose data cannot be computed (an analytics error) is reported in
``EvaluationResult.errors`` and its alerts keep their state: an outage of the analysis never
resolves a firing alert.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import polars as pl

from slo_rules.annotate import attribution_annotations, fmt_ms, fmt_pct, fmt_s
from slo_rules.notifiers import AlertPayload, Notification, NotifierConfig, PagerDutyConfig
from slo_rules.outbox import enqueue
from slo_rules.rules import (
    AbandonmentRule,
    ColdPathStarvationRule,
    LatencySloRule,
    P99RegressionRule,
    ReleaseCouplingRule,
    RetryAmplificationRule,
    Route,
    RuleSet,
    format_duration,
)
from slo_rules.schema import MIGRATIONS as RULES_MIGRATIONS
from slo_rules.source import AnalyticsSource, DataSource
from slo_rules.state import (
    AlertState,
    Transition,
    advance,
    fingerprint,
    load_states,
    write_events,
    write_states,
)
from storage import Store, TailwatchError, ensure_schema

__all__ = ["Candidate", "EvaluationResult", "burn_rate", "evaluate", "evaluate_with"]

log = logging.getLogger("tailwatch.slo_rules")

DASHBOARD_URL_ENV = "TAILWATCH_DASHBOARD_URL"
DEFAULT_DASHBOARD_URL = "http://127.0.0.1:4318/dashboards"


@dataclass
class Candidate:
    """One alert a rule would raise now (``active``) or is checking (inactive burn-rate tiers)."""

    rule: Any
    labels: dict[str, str]
    active: bool
    annotations: Callable[[], dict[str, str]]
    # Burn-rate tiers: alerts of one SLO share ``group``; lower ``rank`` is a faster tier.
    group: str = ""
    rank: int = 0
    long_window: timedelta | None = None


@dataclass
class EvaluationResult:
    """What one evaluation found and did."""

    at: datetime
    alerts: list[AlertState] = field(default_factory=list)  # pending and firing after this evaluation
    fired: list[AlertState] = field(default_factory=list)
    resolved: list[AlertState] = field(default_factory=list)
    repeated: list[AlertState] = field(default_factory=list)
    notifications: list[Notification] = field(default_factory=list)
    enqueued: int = 0
    analyses_run: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def firing(self) -> list[AlertState]:
        return [a for a in self.alerts if a.state == "firing"]

    def __str__(self) -> str:
        text = (
            f"{len(self.firing)} firing, {len(self.alerts) - len(self.firing)} pending; "
            f"{len(self.fired)} fired, {len(self.resolved)} resolved, {len(self.repeated)} repeated; "
            f"{self.enqueued} notifications enqueued; {self.analyses_run} analyses"
        )
        return text + (f"; {len(self.errors)} rule errors" if self.errors else "")


def burn_rate(good: float, total: float, target: float) -> float:
    """How fast the error budget burns: (bad / total) / (1 − target); 0 without traffic."""
    if total <= 0:
        return 0.0
    return ((total - good) / total) / (1.0 - target)


# ---------------------------------------------------------------------------------------------
# Per-kind candidates


def _frame(analysis: Any, name: str) -> pl.DataFrame:
    frame = getattr(analysis, name, None)
    return frame if isinstance(frame, pl.DataFrame) else pl.DataFrame()


def _labels(rule: Any, severity: str, **selector: str) -> dict[str, str]:
    labels = {"alertname": rule.name, "severity": severity}
    labels.update({k: v for k, v in selector.items() if v != ""})
    labels.update(rule.labels)
    return labels


class _Context:
    def __init__(self, source: DataSource, at: datetime, dashboard_url: str) -> None:
        self.source = source
        self.at = at
        self.dashboard_url = dashboard_url.rstrip("/")

    def dashboard(self, view: str) -> str:
        return f"{self.dashboard_url}/{view}.html"

    def window(self, length: timedelta) -> tuple[datetime, datetime]:
        return self.at - length, self.at

    def attribution(
        self,
        start: datetime,
        end: datetime,
        service: str,
        operation: str,
        baseline: tuple[datetime, datetime] | None,
    ) -> dict[str, str]:
        try:
            analysis = self.source.analysis(start, end, *(baseline or (None, None)))
        except Exception as exc:
            log.warning("attribution of %s %s failed: %s", service, operation, exc)
            return {"cause": "none", "attribution_error": f"{type(exc).__name__}: {exc}"}
        return attribution_annotations(analysis, service, operation)


def _finish(
    annotations: dict[str, str], summary_head: str, attribution: Mapping[str, str], rule: Any
) -> dict[str, str]:
    """Summary = the rule's own finding, then the attribution sentence; then the rule's extras."""
    out = dict(annotations)
    tail = attribution.get("summary_tail")
    out.update({k: v for k, v in attribution.items() if k != "summary_tail"})
    out.setdefault("cause", "none")
    out["summary"] = f"{summary_head}; {tail}" if tail else summary_head
    if rule.description:
        out.setdefault("description", rule.description)
    out.update(rule.annotations)
    return out


def _latency_slo(rule: LatencySloRule, ctx: _Context) -> list[Candidate]:
    tiers = rule.tiers()
    frames: dict[timedelta, pl.DataFrame] = {}
    for tier in tiers:
        for length in (tier.long, tier.short_window):
            if length not in frames:
                start, end = ctx.window(length)
                frames[length] = ctx.source.good_total(start, end, rule.threshold_ms)
    keys: set[tuple[str, str]] = set()
    counts: dict[timedelta, dict[tuple[str, str], tuple[float, float]]] = {}
    for length, frame in frames.items():
        table: dict[tuple[str, str], tuple[float, float]] = {}
        for row in frame.iter_rows(named=True):
            key = (str(row["service"]), str(row["operation"]))
            if not rule.selects(*key):
                continue
            table[key] = (float(row["good"]), float(row["total"]))
            keys.add(key)
        counts[length] = table
    out: list[Candidate] = []
    for service, operation in sorted(keys):
        for rank, tier in enumerate(tiers):
            good_l, total_l = counts[tier.long].get((service, operation), (0.0, 0.0))
            good_s, total_s = counts[tier.short_window].get((service, operation), (0.0, 0.0))
            burn_l = burn_rate(good_l, total_l, rule.target)
            burn_s = burn_rate(good_s, total_s, rule.target)
            active = total_l >= rule.min_events and burn_l >= tier.factor and burn_s >= tier.factor
            labels = _labels(
                rule,
                tier.severity,
                service=service,
                operation=operation,
                path="hot",
                slo_window=format_duration(tier.long),
            )

            def annotate(
                tier: Any = tier,
                service: str = service,
                operation: str = operation,
                burn_l: float = burn_l,
                burn_s: float = burn_s,
                total_l: float = total_l,
                good_l: float = good_l,
            ) -> dict[str, str]:
                long_w, short_w = format_duration(tier.long), format_duration(tier.short_window)
                head = (
                    f"{operation} ({service}): error budget burning {burn_l:.1f}× over {long_w} and "
                    f"{burn_s:.1f}× over {short_w} (limit {tier.factor:g}×; SLO {fmt_pct(rule.target, 1)} "
                    f"under {fmt_ms(rule.threshold_ms)} over {format_duration(rule.window)})"
                )
                start, end = ctx.window(tier.long)
                attribution = ctx.attribution(start, end, service, operation, None)
                budget_used = burn_l * tier.long / rule.window
                return _finish(
                    {
                        "burn_rate_long": f"{burn_l:.2f}",
                        "burn_rate_short": f"{burn_s:.2f}",
                        "burn_rate_threshold": f"{tier.factor:g}",
                        "windows": f"{long_w}/{short_w}",
                        "slow_requests": f"{int(total_l - good_l)}/{int(total_l)}",
                        "error_budget_consumed": f"{budget_used:.3f}",
                        "dashboard": ctx.dashboard("attribution"),
                    },
                    head,
                    attribution,
                    rule,
                )

            out.append(
                Candidate(
                    rule,
                    labels,
                    active,
                    annotate,
                    group=f"{rule.name}\x00{service}\x00{operation}",
                    rank=rank,
                    long_window=tier.long,
                )
            )
    return out


def _p99_regression(rule: P99RegressionRule, ctx: _Context) -> list[Candidate]:
    start, end = ctx.window(rule.window)
    analysis = ctx.source.analysis(start, end)
    out: list[Candidate] = []
    if rule.baseline == "previous":
        for row in _frame(analysis, "attribution").iter_rows(named=True):
            service, operation = str(row["service"]), str(row["operation"])
            if not rule.selects(service, operation):
                continue
            out.append(
                _regression_candidate(
                    rule,
                    ctx,
                    service,
                    operation,
                    row.get("baseline_p99_ms"),
                    row.get("current_p99_ms"),
                    row.get("baseline_requests"),
                    row.get("current_requests"),
                    (start, end, None),
                    "the previous " + format_duration(rule.window),
                )
            )
        return out
    latest: dict[tuple[str, str], dict[str, Any]] = {}
    for row in _frame(analysis, "releases").iter_rows(named=True):
        key = (str(row["service"]), str(row["operation"]))
        released = _as_utc(row.get("released_at"))
        if not rule.selects(*key) or released is None or not start <= released < end:
            continue
        if key not in latest or released > latest[key]["released_at"]:
            latest[key] = {**row, "released_at": released}
    for (service, operation), row in sorted(latest.items()):
        released = row["released_at"]
        out.append(
            _regression_candidate(
                rule,
                ctx,
                service,
                operation,
                row.get("p99_before_ms"),
                row.get("p99_after_ms"),
                row.get("requests_before"),
                row.get("requests_after"),
                (released, end, None),
                f"the release before {row.get('version')}",
            )
        )
    return out


def _regression_candidate(
    rule: P99RegressionRule,
    ctx: _Context,
    service: str,
    operation: str,
    base: Any,
    cur: Any,
    n_base: Any,
    n_cur: Any,
    window: tuple[datetime, datetime, tuple[datetime, datetime] | None],
    against: str,
) -> Candidate:
    base_f = float(base) if base is not None else None
    cur_f = float(cur) if cur is not None else None
    enough = int(n_base or 0) >= rule.min_requests and int(n_cur or 0) >= rule.min_requests
    active = False
    if enough and base_f is not None and cur_f is not None:
        delta = cur_f - base_f
        active = delta >= rule.min_increase.absolute_ms and delta >= rule.min_increase.relative * base_f
    labels = _labels(rule, rule.severity, service=service, operation=operation, path="hot")

    def annotate() -> dict[str, str]:
        attribution = ctx.attribution(window[0], window[1], service, operation, window[2])
        head = f"{service} {operation}: p99 {fmt_ms(base_f)} → {fmt_ms(cur_f)} vs {against}"
        tail = attribution.pop("summary_tail", "")
        if tail:
            # The attribution sentence already states the p99 change; lead with it.
            head = f"{service}: {tail}"
        extra = {
            "baseline": rule.baseline,
            "requests": f"{int(n_base or 0)} → {int(n_cur or 0)}",
            "dashboard": ctx.dashboard("attribution"),
        }
        return _finish(extra, head, attribution, rule)

    return Candidate(rule, labels, active, annotate)


def _as_utc(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    return None


def _release_coupling(rule: ReleaseCouplingRule, ctx: _Context) -> list[Candidate]:
    start, end = ctx.window(rule.window)
    analysis = ctx.source.analysis(start, end)
    findings: dict[tuple[str, str], list[tuple[datetime, str, dict[str, Any]]]] = {}
    keys: set[tuple[str, str]] = set()
    for row in _frame(analysis, "releases").iter_rows(named=True):
        key = (str(row["service"]), str(row["operation"]))
        released = _as_utc(row.get("released_at"))
        if not rule.selects(*key) or released is None or not start <= released < end:
            continue
        keys.add(key)
        raw_before = row.get("sync_llm_calls_per_request_before")
        before = float(raw_before or 0.0)
        after = float(row.get("sync_llm_calls_per_request_after") or 0.0)
        version = str(row.get("version"))
        # The first version seen has nothing before it: no "added calls" without a comparison.
        if raw_before is not None and after - before >= rule.min_sync_llm_increase:
            findings.setdefault(key, []).append(
                (
                    released,
                    f"release {version} added {after - before:.1f} synchronous LLM calls per request "
                    f"({before:.1f} → {after:.1f})",
                    row,
                )
            )
        delta = float(row.get("p99_delta_ms") or 0.0)
        if rule.significant_step and bool(row.get("significant")) and delta > 0:
            findings.setdefault(key, []).append(
                (
                    released,
                    f"release {version} stepped p99 up {fmt_ms(row.get('p99_before_ms'))} → "
                    f"{fmt_ms(row.get('p99_after_ms'))}",
                    row,
                )
            )
    trend: dict[tuple[str, str], dict[str, Any]] = {}
    if rule.coupled_trend:
        for row in _frame(analysis, "release_coupling").iter_rows(named=True):
            key = (str(row["service"]), str(row["operation"]))
            if rule.selects(*key):
                keys.add(key)
                if bool(row.get("coupled")):
                    trend[key] = row
    out: list[Candidate] = []
    for service, operation in sorted(keys):
        found = sorted(findings.get((service, operation), []), key=lambda f: f[0])
        coupled = trend.get((service, operation))
        active = bool(found) or coupled is not None
        labels = _labels(rule, rule.severity, service=service, operation=operation, path="hot")

        def annotate(
            service: str = service,
            operation: str = operation,
            found: list[tuple[datetime, str, dict[str, Any]]] = found,
            coupled: dict[str, Any] | None = coupled,
        ) -> dict[str, str]:
            parts = []
            # Several findings for one release (more LLM calls *and* a p99 step) read as one clause.
            seen_versions: dict[str, list[str]] = {}
            for _, text, row in found:
                seen_versions.setdefault(str(row.get("version")), []).append(text)
            for texts in seen_versions.values():
                parts.append(" and ".join([texts[0], *[t.split(" ", 2)[2] for t in texts[1:]]]))
            extra: dict[str, str] = {"dashboard": ctx.dashboard("hot_path")}
            if coupled is not None:
                parts.append(
                    f"p99 rises with releases (Spearman ρ {float(coupled.get('spearman_rho') or 0):.2f}, "
                    f"{float(coupled.get('p99_slope_ms_per_release') or 0):+.0f} ms per release over "
                    f"{coupled.get('releases')} releases)"
                )
                extra["spearman_rho"] = f"{float(coupled.get('spearman_rho') or 0):.3f}"
                extra["p99_slope_ms_per_release"] = (
                    f"{float(coupled.get('p99_slope_ms_per_release') or 0):.1f}"
                )
            attribution: dict[str, str] = {}
            if found:
                released, _, row = found[-1]
                extra["release"] = str(row.get("version"))
                extra["released_at"] = released.isoformat()
                extra["sync_llm_calls_per_request"] = (
                    f"{float(row.get('sync_llm_calls_per_request_before') or 0):.2f} → "
                    f"{float(row.get('sync_llm_calls_per_request_after') or 0):.2f}"
                )
                attribution = ctx.attribution(released, ctx.at, service, operation, None)
            head = f"{service} {operation}: " + "; ".join(parts)
            return _finish(extra, head, attribution, rule)

        out.append(Candidate(rule, labels, active, annotate))
    return out


def _cold_path(rule: ColdPathStarvationRule, ctx: _Context) -> list[Candidate]:
    start, end = ctx.window(rule.window)
    analysis = ctx.source.analysis(start, end)
    previous_pending: dict[str, int] = {}
    if rule.max_pending_growth is not None:
        before = ctx.source.analysis(start - rule.window, start)
        for row in _frame(before, "cold_path").iter_rows(named=True):
            previous_pending[str(row["queue"])] = int(row.get("pending") or 0)
    out: list[Candidate] = []
    for row in _frame(analysis, "cold_path").iter_rows(named=True):
        queue = str(row["queue"])
        if not rule.selects(queue):
            continue
        ratio = float(row.get("p99_over_p50") or 0.0)
        p99 = row.get("p99_s")
        pending = int(row.get("pending") or 0)
        reasons = []
        explicit = (
            rule.max_p99_over_p50 is not None
            or rule.max_p99_s is not None
            or rule.max_pending is not None
            or rule.max_pending_growth is not None
        )
        if int(row.get("jobs") or 0) >= rule.min_jobs:
            if rule.max_p99_over_p50 is not None and ratio > rule.max_p99_over_p50:
                reasons.append(f"p99/p50 {ratio:.0f}× (limit {rule.max_p99_over_p50:g}×)")
            if rule.max_p99_s is not None and p99 is not None and float(p99) > rule.max_p99_s:
                reasons.append(f"p99 {fmt_s(float(p99))} (limit {fmt_s(rule.max_p99_s)})")
            if not explicit and bool(row.get("starved")):
                reasons.append(f"p99/p50 {ratio:.0f}×")
        if rule.max_pending is not None and pending > rule.max_pending:
            reasons.append(f"{pending} jobs pending (limit {rule.max_pending})")
        if rule.max_pending_growth is not None and pending > 0:
            was = previous_pending.get(queue, 0)
            if pending / max(was, 1) > rule.max_pending_growth:
                reasons.append(
                    f"backlog grew from {was} to {pending} pending jobs (limit {rule.max_pending_growth:g}×)"
                )
        labels = _labels(rule, rule.severity, queue=queue, path="cold")

        def annotate(
            row: dict[str, Any] = row, reasons: list[str] = reasons, queue: str = queue
        ) -> dict[str, str]:
            wait, proc = row.get("queue_wait_p99_s"), row.get("processing_p99_s")
            bottleneck = "queue_wait" if float(wait or 0) >= float(proc or 0) else "processing"
            head = (
                f"queue {queue} starved: enqueue-to-ready p50 {fmt_s(row.get('p50_s'))}, "
                f"p99 {fmt_s(row.get('p99_s'))} ({'; '.join(reasons)}); "
                f"p99 queue wait {fmt_s(wait)}, processing {fmt_s(proc)}"
            )
            extra = {
                "cause": "none",
                "bottleneck": bottleneck,
                "jobs": str(row.get("jobs")),
                "pending": str(row.get("pending")),
                "p50_s": f"{float(row.get('p50_s') or 0):.3f}",
                "p99_s": f"{float(row.get('p99_s') or 0):.3f}",
                "p99_over_p50": f"{float(row.get('p99_over_p50') or 0):.1f}",
                "queue_wait_p99_s": f"{float(wait or 0):.3f}",
                "processing_p99_s": f"{float(proc or 0):.3f}",
                "dashboard": ctx.dashboard("cold_path"),
            }
            return _finish(extra, head, {}, rule)

        out.append(Candidate(rule, labels, bool(reasons), annotate))
    return out


def _abandonment(rule: AbandonmentRule, ctx: _Context) -> list[Candidate]:
    start, end = ctx.window(rule.window)
    analysis = ctx.source.analysis(start, end)
    out: list[Candidate] = []
    for row in _frame(analysis, "abandonment_summary").iter_rows(named=True):
        service, operation = str(row["service"]), str(row["operation"])
        if not rule.selects(service, operation):
            continue
        rate = float(row.get("rate") or 0.0)
        cliff, p99 = row.get("cliff_ms"), row.get("p99_ms")
        reasons = []
        if int(row.get("requests") or 0) >= rule.min_requests:
            if rule.max_rate is not None and rate > rule.max_rate:
                reasons.append(
                    f"{fmt_pct(rate, 1)} of requests abandoned (limit {fmt_pct(rule.max_rate, 1)})"
                )
            if rule.p99_beyond_cliff and cliff is not None and p99 is not None and float(p99) >= float(cliff):
                reasons.append(
                    f"p99 {fmt_ms(float(p99))} is past the abandonment cliff at {fmt_ms(float(cliff))}"
                )
        labels = _labels(rule, rule.severity, service=service, operation=operation, path="hot")

        def annotate(
            row: dict[str, Any] = row,
            reasons: list[str] = reasons,
            service: str = service,
            operation: str = operation,
        ) -> dict[str, str]:
            cliff_text = (
                f", cliff at {fmt_ms(float(row['cliff_ms']))}" if row.get("cliff_ms") is not None else ""
            )
            head = f"{service} {operation}: {'; '.join(reasons)}{cliff_text}"
            attribution = ctx.attribution(start, end, service, operation, None)
            extra = {
                "abandonment_rate": f"{float(row.get('rate') or 0):.4f}",
                "abandoned": f"{row.get('abandoned')}/{row.get('requests')}",
                "cliff_ms": "" if row.get("cliff_ms") is None else str(row.get("cliff_ms")),
                "p99_ms": f"{float(row.get('p99_ms') or 0):.1f}",
                "dashboard": ctx.dashboard("abandonment"),
            }
            return _finish(extra, head, attribution, rule)

        out.append(Candidate(rule, labels, bool(reasons), annotate))
    return out


def _retries(rule: RetryAmplificationRule, ctx: _Context) -> list[Candidate]:
    start, end = ctx.window(rule.window)
    analysis = ctx.source.analysis(start, end)
    hops = _frame(analysis, "retry_hops")
    out: list[Candidate] = []
    for row in _frame(analysis, "retry_amplification").iter_rows(named=True):
        workflow = str(row["workflow"])
        if not rule.selects(workflow):
            continue
        attempt_amp = float(row.get("attempt_amplification") or 1.0)
        token_amp = float(row.get("token_amplification") or 1.0)
        reasons = []
        if int(row.get("runs") or 0) >= rule.min_runs:
            if rule.max_attempt_amplification is not None and attempt_amp > rule.max_attempt_amplification:
                reasons.append(f"{attempt_amp:.3f}× attempts (limit {rule.max_attempt_amplification:g}×)")
            if rule.max_token_amplification is not None and token_amp > rule.max_token_amplification:
                reasons.append(f"{token_amp:.3f}× tokens (limit {rule.max_token_amplification:g}×)")
        labels = _labels(rule, rule.severity, workflow=workflow)

        def annotate(
            row: dict[str, Any] = row, reasons: list[str] = reasons, workflow: str = workflow
        ) -> dict[str, str]:
            mine = (
                hops.filter(pl.col("workflow") == workflow).sort("retry_rate", descending=True)
                if not hops.is_empty()
                else hops
            )
            hop_text = ", ".join(
                f"{h['hop']} {fmt_pct(float(h['retry_rate'] or 0), 1)}"
                for h in mine.head(5).iter_rows(named=True)
            )
            head = (
                f"workflow {workflow}: {'; '.join(reasons)} over {row.get('runs')} runs; "
                f"modeled {float(row.get('modeled_amplification') or 1):.3f}×"
                + (f"; retries by hop: {hop_text}" if hop_text else "")
            )
            extra = {
                "cause": "none",
                "attempt_amplification": f"{float(row.get('attempt_amplification') or 1):.4f}",
                "token_amplification": f"{float(row.get('token_amplification') or 1):.4f}",
                "modeled_amplification": f"{float(row.get('modeled_amplification') or 1):.4f}",
                "runs": str(row.get("runs")),
                "dashboard": ctx.dashboard("retries"),
            }
            return _finish(extra, head, {}, rule)

        out.append(Candidate(rule, labels, bool(reasons), annotate))
    return out


_KINDS: dict[type, Callable[[Any, _Context], list[Candidate]]] = {
    LatencySloRule: _latency_slo,
    P99RegressionRule: _p99_regression,
    ReleaseCouplingRule: _release_coupling,
    ColdPathStarvationRule: _cold_path,
    AbandonmentRule: _abandonment,
    RetryAmplificationRule: _retries,
}


# ---------------------------------------------------------------------------------------------
# Evaluation


def _utc(value: datetime) -> datetime:
    if value.tzinfo is None:
        raise TailwatchError(f"evaluation time {value.isoformat()} has no time zone; use UTC")
    return value.astimezone(UTC)


def evaluate(
    store: Store,
    rules: RuleSet,
    at: datetime | None = None,
    *,
    notifiers: Sequence[NotifierConfig] = (),
    dashboard_url: str | None = None,
    conventions: Any = None,
) -> EvaluationResult:
    """Evaluate every rule at ``at`` (default now), advance alert state, enqueue notifications.

    Deliver them with :func:`slo_rules.deliver`.
    """
    return evaluate_with(
        store,
        rules,
        at or datetime.now(UTC),
        AnalyticsSource(store, conventions),
        notifiers=notifiers,
        dashboard_url=dashboard_url,
    )


def evaluate_with(
    store: Store,
    rules: RuleSet,
    at: datetime,
    source: DataSource,
    *,
    notifiers: Sequence[NotifierConfig] = (),
    dashboard_url: str | None = None,
) -> EvaluationResult:
    """:func:`evaluate` with an explicit data source (tests feed synthetic counts through this)."""
    at = _utc(at)
    ensure_schema(store, RULES_MIGRATIONS)
    url = dashboard_url or os.environ.get(DASHBOARD_URL_ENV) or DEFAULT_DASHBOARD_URL
    ctx = _Context(source, at, url)
    result = EvaluationResult(at=at)
    previous = load_states(store, rules.names())

    # Rules that failed keep every alert they own exactly as it was.
    failed: set[str] = set()
    candidates: list[Candidate] = []
    for rule in rules.rules:
        try:
            candidates.extend(_KINDS[type(rule)](rule, ctx))
        except TailwatchError as exc:
            failed.add(rule.name)
            result.errors.append(f"rule {rule.name}: {exc}")
            log.warning("rule %s could not be evaluated: %s", rule.name, exc)
        except Exception as exc:
            # A defect in one rule's data path must not stop every other rule (nor resolve its alerts).
            failed.add(rule.name)
            result.errors.append(f"rule {rule.name}: {type(exc).__name__}: {exc}")
            log.exception("rule %s could not be evaluated", rule.name)

    new_states: list[AlertState] = []
    transitions: list[tuple[AlertState, Transition]] = []
    seen: set[str] = set()
    faster: dict[str, list[AlertState]] = {}
    # Burn-rate tiers go fastest first, so a slower tier sees whether a faster one fires.
    candidates.sort(key=lambda c: (c.group, c.rank))
    for cand in candidates:
        fp = fingerprint(cand.labels)
        if fp in seen:
            continue
        seen.add(fp)
        prev = previous.get(fp)
        suppressed = _suppressed(faster.get(cand.group, []), cand.long_window, at)
        annotations: dict[str, str] = {}
        if cand.active:
            try:
                annotations = cand.annotations()
            except Exception as exc:
                # The alert still fires (its condition holds); only the explanation is missing.
                log.exception("annotations of %s could not be computed", cand.rule.name)
                annotations = {"summary": f"{cand.rule.name}: {type(exc).__name__}: {exc}", "cause": "none"}
        state, transition = advance(
            prev,
            cand.active,
            at,
            for_=cand.rule.for_,
            repeat_interval=rules.route.repeat_interval,
            labels=cand.labels,
            annotations=annotations or (dict(prev.annotations) if prev else {}),
            rule=cand.rule.name,
            suppressed=suppressed,
        )
        latest = state or prev
        if cand.group and latest is not None:
            faster.setdefault(cand.group, []).append(latest)
        _collect(state, transition, prev, new_states, transitions)

    # Alerts whose condition no longer shows up at all (the operation went quiet) resolve too.
    for fp, prev in previous.items():
        if fp in seen or prev.rule in failed or prev.state not in ("pending", "firing"):
            continue
        rule_for = None
        state, transition = advance(
            prev,
            False,
            at,
            for_=rule_for,
            repeat_interval=rules.route.repeat_interval,
            labels=prev.labels,
            annotations=prev.annotations,
            rule=prev.rule,
        )
        _collect(state, transition, prev, new_states, transitions)

    notifications = _notifications(transitions, rules.route, at, url)
    items: list[tuple[NotifierConfig, Notification]] = []
    for config in notifiers:
        for notification in notifications:
            if isinstance(config, PagerDutyConfig):
                items.extend((config, single) for single in _split(notification))
            else:
                items.append((config, notification))
    # Outbox first, then state: a crash in between re-derives the same transition (same id) next time.
    # Rows are stamped with the wall clock, not ``at``: their age (for giving up) is real time.
    result.enqueued = enqueue(store, items)
    write_states(store, new_states)
    write_events(
        store,
        [
            (s, "firing" if t == "firing" else "resolved", at)
            for s, t in transitions
            if t in ("firing", "resolved")
        ],
    )
    result.notifications = notifications
    for state, transition in transitions:
        {"firing": result.fired, "resolved": result.resolved, "repeat": result.repeated}[transition].append(
            state
        )
    current = {s.fingerprint: s for s in previous.values()}
    current.update({s.fingerprint: s for s in new_states})
    result.alerts = sorted(
        (s for s in current.values() if s.state in ("pending", "firing")),
        key=lambda s: (s.alertname, s.fingerprint),
    )
    result.analyses_run = int(getattr(source, "analyses_run", 0))
    return result


def _suppressed(faster: Sequence[AlertState], long_window: timedelta | None, at: datetime) -> bool:
    """A slower burn-rate tier stays quiet while a faster tier of the same SLO fires, and for its own
    long window after that tier resolved: the budget it sees burning is the burn already notified."""
    if long_window is None:
        return False
    for state in faster:
        if state.state == "firing":
            return True
        if state.state == "resolved" and state.ends_at is not None and state.ends_at > at - long_window:
            return True
    return False


def _collect(
    state: AlertState | None,
    transition: Transition | None,
    prev: AlertState | None,
    new_states: list[AlertState],
    transitions: list[tuple[AlertState, Transition]],
) -> None:
    if state is None:
        return
    unchanged = (
        prev is not None
        and transition is None
        and prev.state == state.state
        and prev.active_since == state.active_since
        and prev.annotations == state.annotations
    )
    if not unchanged:
        new_states.append(state)
    if transition is not None:
        transitions.append((state, transition))


def _payload(state: AlertState, status: str, url: str) -> AlertPayload:
    assert state.starts_at is not None
    return AlertPayload(
        status="resolved" if status == "resolved" else "firing",
        labels=dict(state.labels),
        annotations=dict(state.annotations),
        starts_at=state.starts_at,
        ends_at=state.ends_at if status == "resolved" else None,
        fingerprint=state.fingerprint,
        generator_url=state.annotations.get("dashboard", url),
    )


def _notifications(
    transitions: Sequence[tuple[AlertState, Transition]], route: Route, at: datetime, url: str
) -> list[Notification]:
    """One notification per group (``route.group_by`` label values) and status."""
    groups: dict[tuple[str, str], list[tuple[AlertState, Transition]]] = {}
    for state, transition in transitions:
        if transition == "resolved" and not route.send_resolved:
            continue
        status = "resolved" if transition == "resolved" else "firing"
        group_labels = {k: state.labels.get(k, "") for k in route.group_by}
        key = "{}:{" + ",".join(f'{k}="{v}"' for k, v in group_labels.items()) + "}"
        groups.setdefault((key, status), []).append((state, transition))
    out: list[Notification] = []
    for (key, status), members in sorted(groups.items()):
        members.sort(key=lambda m: m[0].fingerprint)
        first = members[0][0]
        identity = [
            key,
            status,
            [
                [
                    s.fingerprint,
                    s.starts_at.isoformat() if s.starts_at else "",
                    t,
                    at.isoformat() if t == "repeat" else "",
                ]
                for s, t in members
            ],
        ]
        nid = hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:32]
        out.append(
            Notification(
                id=nid,
                status="resolved" if status == "resolved" else "firing",
                group_key=key,
                group_labels={k: first.labels.get(k, "") for k in route.group_by},
                alerts=tuple(_payload(s, status, url) for s, _ in members),
                external_url=url,
                created_at=at,
            )
        )
    return out


def _split(notification: Notification) -> list[Notification]:
    """PagerDuty has no groups: one event per alert, each with its own stable id."""
    if len(notification.alerts) == 1:
        return [notification]
    out = []
    for alert in notification.alerts:
        nid = hashlib.sha256(f"{notification.id}:{alert.fingerprint}".encode()).hexdigest()[:32]
        out.append(
            Notification(
                id=nid,
                status=alert.status,
                group_key=notification.group_key,
                group_labels=notification.group_labels,
                alerts=(alert,),
                external_url=notification.external_url,
                created_at=notification.created_at,
            )
        )
    return out
