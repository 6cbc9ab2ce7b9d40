"""``cold_path_starvation``: a queue's enqueue-to-ready tail, its backlog, or the backlog's growth.

Without any explicit limit the rule follows the analytics' own ``starved`` verdict.
"""

from __future__ import annotations

from typing import Any

from slo_rules.annotate import fmt_s
from slo_rules.kinds._common import Candidate, Context, alert_labels, finish
from slo_rules.rules import ColdPathStarvationRule
from storage import format_duration

__all__ = ["candidates"]


def candidates(rule: ColdPathStarvationRule, ctx: Context) -> list[Candidate]:
    start, end = ctx.window(rule.window)
    analysis = ctx.source.analysis(start, end)
    previous_pending: dict[str, int] = {}
    if rule.max_pending_growth is not None:
        before = ctx.source.analysis(start - rule.window, start)
        for row in before.cold_path.iter_rows(named=True):
            previous_pending[str(row["queue"])] = int(row.get("pending") or 0)
    out: list[Candidate] = []
    for row in analysis.cold_path.iter_rows(named=True):
        queue = str(row["queue"])
        if not rule.selects(queue):
            continue
        reasons = _reasons(rule, row, previous_pending.get(queue, 0))
        labels = alert_labels(rule, rule.severity, queue=queue, path="cold")

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
            return finish(extra, head, {}, rule)

        if reasons:
            reason, skipped = "; ".join(reasons), False
        else:
            jobs = int(row.get("jobs") or 0)
            skipped = jobs < rule.min_jobs and not rule.max_pending and not rule.max_pending_growth
            reason = (
                f"{jobs} jobs < {rule.min_jobs}"
                if skipped
                else f"enqueue-to-ready p50 {fmt_s(row.get('p50_s'))}, p99 {fmt_s(row.get('p99_s'))} "
                f"(p99/p50 {float(row.get('p99_over_p50') or 0):.0f}×), {row.get('pending')} pending, "
                f"{jobs} jobs: within the limits"
            )
        out.append(Candidate(rule, labels, bool(reasons), annotate, reason=reason, skipped=skipped))
    if not out:
        ctx.note(rule, f"no job on a selected queue in the last {format_duration(rule.window)}")
    return out


def _reasons(rule: ColdPathStarvationRule, row: dict[str, Any], pending_before: int) -> list[str]:
    """Every limit the queue is past, as the phrase the summary quotes; empty when it is fine."""
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
    # The tail limits need enough jobs to mean anything; a backlog is a backlog at any volume.
    if int(row.get("jobs") or 0) >= rule.min_jobs:
        if rule.max_p99_over_p50 is not None and ratio > rule.max_p99_over_p50:
            reasons.append(f"p99/p50 {ratio:.0f}× (limit {rule.max_p99_over_p50:g}×)")
        if rule.max_p99_s is not None and p99 is not None and float(p99) > rule.max_p99_s:
            reasons.append(f"p99 {fmt_s(float(p99))} (limit {fmt_s(rule.max_p99_s)})")
        if not explicit and bool(row.get("starved")):
            reasons.append(f"p99/p50 {ratio:.0f}×")
    if rule.max_pending is not None and pending > rule.max_pending:
        reasons.append(f"{pending} jobs pending (limit {rule.max_pending})")
    growth = pending / max(pending_before, 1)
    if rule.max_pending_growth is not None and pending > 0 and growth > rule.max_pending_growth:
        reasons.append(
            f"backlog grew from {pending_before} to {pending} pending jobs "
            f"(limit {rule.max_pending_growth:g}×)"
        )
    return reasons
