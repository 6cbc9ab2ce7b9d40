"""``retry_amplification``: attempts or tokens per logical call of a workflow above a limit.

The alert names the hops that retry most and, when the analytics found one, the trace of the
workflow's most retried run (``exemplar_trace_ids``, as the hot-path kinds name their slow traces).
"""

from __future__ import annotations

from typing import Any

import polars as pl

from slo_rules.annotate import fmt_pct
from slo_rules.kinds._common import Candidate, Context, alert_labels, finish
from slo_rules.rules import RetryAmplificationRule

__all__ = ["candidates"]

# The most retried run's trace ('' when none was retried); absent from analyses that predate it.
EXEMPLAR_COLUMN = "exemplar_trace_id"


def candidates(rule: RetryAmplificationRule, ctx: Context) -> list[Candidate]:
    start, end = ctx.window(rule.window)
    analysis = ctx.source.analysis(start, end)
    hops = analysis.retry_hops
    out: list[Candidate] = []
    for row in analysis.retry_amplification.iter_rows(named=True):
        workflow = str(row["workflow"])
        if not rule.selects(workflow):
            continue
        reasons = _reasons(rule, row)
        labels = alert_labels(rule, rule.severity, workflow=workflow)

        def annotate(
            row: dict[str, Any] = row, reasons: list[str] = reasons, workflow: str = workflow
        ) -> dict[str, str]:
            hop_text = _top_hops(hops, workflow)
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
            exemplar = str(row.get(EXEMPLAR_COLUMN) or "")
            if exemplar:
                extra["exemplar_trace_ids"] = exemplar
                extra.update(ctx.trace_links(exemplar, start, end))
            return finish(extra, head, {}, rule)

        out.append(Candidate(rule, labels, bool(reasons), annotate))
    return out


def _reasons(rule: RetryAmplificationRule, row: dict[str, Any]) -> list[str]:
    if int(row.get("runs") or 0) < rule.min_runs:
        return []
    attempt_amp = float(row.get("attempt_amplification") or 1.0)
    token_amp = float(row.get("token_amplification") or 1.0)
    reasons = []
    if rule.max_attempt_amplification is not None and attempt_amp > rule.max_attempt_amplification:
        reasons.append(f"{attempt_amp:.3f}× attempts (limit {rule.max_attempt_amplification:g}×)")
    if rule.max_token_amplification is not None and token_amp > rule.max_token_amplification:
        reasons.append(f"{token_amp:.3f}× tokens (limit {rule.max_token_amplification:g}×)")
    return reasons


def _top_hops(hops: pl.DataFrame, workflow: str) -> str:
    """The five hops of the workflow that retry most, with their retry rates."""
    if hops.is_empty():
        return ""
    mine = hops.filter(pl.col("workflow") == workflow).sort("retry_rate", descending=True)
    return ", ".join(
        f"{h['hop']} {fmt_pct(float(h['retry_rate'] or 0), 1)}" for h in mine.head(5).iter_rows(named=True)
    )
