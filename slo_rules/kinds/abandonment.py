"""``abandonment``: the share of requests clients gave up on, or a p99 past the abandonment cliff."""

from __future__ import annotations

from typing import Any

from slo_rules.annotate import fmt_ms, fmt_pct
from slo_rules.kinds._common import Candidate, Context, alert_labels, finish
from slo_rules.rules import AbandonmentRule
from storage import format_duration

__all__ = ["candidates"]


def candidates(rule: AbandonmentRule, ctx: Context) -> list[Candidate]:
    start, end = ctx.window(rule.window)
    analysis = ctx.source.analysis(start, end)
    out: list[Candidate] = []
    for row in analysis.abandonment_summary.iter_rows(named=True):
        service, operation = str(row["service"]), str(row["operation"])
        if not rule.selects(service, operation):
            continue
        reasons = _reasons(rule, row)
        labels = alert_labels(rule, rule.severity, service=service, operation=operation, path="hot")

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
            return finish(extra, head, attribution, rule)

        out.append(Candidate(rule, labels, bool(reasons), annotate, **_explained(rule, row, reasons)))
    if not out:
        ctx.note(rule, f"no request of a selected operation in the last {format_duration(rule.window)}")
    return out


def _explained(rule: AbandonmentRule, row: dict[str, Any], reasons: list[str]) -> dict[str, Any]:
    """The candidate's ``reason`` (and ``skipped``): the rate and cliff in numbers."""
    requests = int(row.get("requests") or 0)
    if requests < rule.min_requests:
        return {"reason": f"{requests} requests < {rule.min_requests}", "skipped": True}
    if reasons:
        return {"reason": "; ".join(reasons)}
    rate = float(row.get("rate") or 0.0)
    limit = f" (limit {fmt_pct(rule.max_rate, 1)})" if rule.max_rate is not None else ""
    cliff = row.get("cliff_ms")
    where = f", p99 {fmt_ms(row.get('p99_ms'))} below the cliff at {fmt_ms(float(cliff))}" if cliff else ""
    return {"reason": f"{fmt_pct(rate, 1)} of {requests} requests abandoned{limit}{where}"}


def _reasons(rule: AbandonmentRule, row: dict[str, Any]) -> list[str]:
    if int(row.get("requests") or 0) < rule.min_requests:
        return []
    rate = float(row.get("rate") or 0.0)
    cliff, p99 = row.get("cliff_ms"), row.get("p99_ms")
    reasons = []
    if rule.max_rate is not None and rate > rule.max_rate:
        reasons.append(f"{fmt_pct(rate, 1)} of requests abandoned (limit {fmt_pct(rule.max_rate, 1)})")
    if rule.p99_beyond_cliff and cliff is not None and p99 is not None and float(p99) >= float(cliff):
        reasons.append(f"p99 {fmt_ms(float(p99))} is past the abandonment cliff at {fmt_ms(float(cliff))}")
    return reasons
