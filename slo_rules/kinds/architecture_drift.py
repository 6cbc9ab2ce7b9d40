"""``architecture_drift``: a batch job quietly become an online service (seed 004), one alert per
finding of the analytics' drift report (:mod:`analytics.drift`).

The alert names the symptom in numbers and the decision nobody made: say it is an online service now
(set a p99 budget, bound the queue, isolate per request), or split the batch path from the online one.
"""

from __future__ import annotations

from typing import Any

from analytics import DriftFinding
from slo_rules.annotate import fmt_ms, fmt_pct
from slo_rules.kinds._common import Candidate, Context, alert_labels, finish
from slo_rules.rules import ArchitectureDriftRule
from storage import format_duration

__all__ = ["DECISION", "candidates", "drift_symptom"]

DECISION = (
    "say it is an online service now: set a p99 budget, bound the queue, isolate per request "
    "(or give the online path its own implementation and keep the batch one for batches)"
)


def candidates(rule: ArchitectureDriftRule, ctx: Context) -> list[Candidate]:
    findings = ctx.drift(rule.days)
    if findings is None:
        ctx.note(rule, "the data source has no drift report")
        return []
    out: list[Candidate] = []
    for finding in findings:
        if not rule.selects_finding(finding.kind, finding.service, finding.operation, finding.queue):
            continue
        labels = alert_labels(
            rule,
            rule.severity,
            kind=finding.kind,
            service=finding.service,
            operation=finding.operation,
            queue=finding.queue,
        )

        def annotate(finding: DriftFinding = finding) -> dict[str, str]:
            symptom = drift_symptom(finding)
            extra = {
                "cause": "none",
                "symptom": symptom,
                "decision": DECISION,
                "drift_kind": finding.kind,
                "drift_severity": finding.severity,
                "since": finding.since.date().isoformat(),
                **({"since_release": finding.since_release} if finding.since_release else {}),
                # The report reads no analysis window: the latest views' Drift page.
                "dashboard": ctx.dashboard("drift"),
                **{f"evidence_{k}": _text(v) for k, v in finding.evidence.items()},
            }
            return finish(extra, f"{symptom}; {DECISION}", {}, rule)

        out.append(Candidate(rule, labels, True, annotate, reason=drift_symptom(finding)))
    if not out:
        ctx.note(rule, f"no sign of drift in the last {format_duration(rule.window)}")
    return out


def _text(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def drift_symptom(finding: DriftFinding) -> str:
    """The finding as the sentence an alert leads with."""
    e, since = finding.evidence, finding.since.date().isoformat()
    if finding.since_release:
        # The release the change arrived with, beside its day.
        since += f", with {finding.service} {finding.since_release}"
    if finding.kind == "shared_operation":
        return (
            f"{finding.operation} serves both the batch job and live requests: its hot-path share of "
            f"calls went from {fmt_pct(e.get('hot_share_then'))} to {fmt_pct(e.get('hot_share_now'))} "
            f"since {since} ({e.get('hot_calls_per_day_now', 0):.0f} hot calls a day, hot p99 "
            f"{fmt_ms(e.get('hot_p99_ms_now'))}), reached from {finding.service}"
        )
    if finding.kind == "batch_shrinking":
        return (
            f"{finding.service} {finding.operation} runs like an online service: "
            f"{e.get('runs_per_day_then', 0):.3g} runs a day of {e.get('items_per_run_then', 0):.3g} items "
            f"then, {e.get('runs_per_day_now', 0):.3g} a day of {e.get('items_per_run_now', 0):.3g} now "
            f"(since {since})"
        )
    if finding.kind == "unit_cost_rising":
        unit = e.get("unit", "unit")
        return (
            f"{finding.service} {finding.operation} costs more per {unit}: "
            f"{e.get('tokens_per_unit_then', 0):.0f} tokens and {e.get('calls_per_unit_then', 0):.2f} model "
            f"calls per {unit} then, {e.get('tokens_per_unit_now', 0):.0f} and "
            f"{e.get('calls_per_unit_now', 0):.2f} now (since {since}; "
            f"{e.get('units_per_day_then', 0):.0f} → {e.get('units_per_day_now', 0):.0f} {unit}s a day)"
        )
    if finding.kind == "whole_batch_retry":
        return (
            f"{finding.service} {finding.operation} retries the whole batch: "
            f"{e.get('items_reprocessed_per_failed_item', 0):.0f} items reprocessed per item that failed, "
            f"{e.get('retried_jobs', 0)} retried jobs, {e.get('jobs_hot_requests_waited_on', 0)} of them "
            f"awaited by a hot request (since {since})"
        )
    if finding.kind == "queue_unbounded":
        return (
            f"queue {finding.queue} has no bound: {e.get('enqueued_per_day_now', 0):.0f} jobs enqueued a "
            f"day, {e.get('completed_per_day_now', 0):.0f} completed; the backlog is "
            f"{e.get('backlog_now', 0):.0f} and grows {e.get('backlog_slope_per_day', 0):.0f} a day "
            f"(since {since})"
        )
    return (
        f"{finding.service} {finding.operation} calls batch-job code on the request path with a p99 of "
        f"{fmt_ms(e.get('p99_ms_now'))} and no latency target: no budget, no latency_slo rule "
        f"(since {since})"
    )
